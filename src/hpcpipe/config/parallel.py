"""The ``parallel:`` section: processes, nodes, strategy (DDP, FSDP2, DeepSpeed ZeRO), process group."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from hpcpipe.config.section import Section


class ParallelConfig(Section):
    """How the job spreads over processes: the data-parallel strategy (DDP, FSDP2, DeepSpeed ZeRO),
    tensor and pipeline parallelism, and the process group's backend."""

    strategy: Literal["auto", "single", "ddp", "fsdp", "deepspeed"] = Field(
        "auto",
        description="auto: single for one process, ddp for more; fsdp: PyTorch FSDP2; deepspeed: "
        "DeepSpeed ZeRO (parallel.zero_stage), needs pip install 'hpcpipe[deepspeed]'.",
    )
    zero_stage: int | None = Field(
        None,
        ge=0,
        le=3,
        description="deepspeed: ZeRO stage. 0: replicated (DDP-like), 1: optimizer state sharded, "
        "2: + gradients, 3: + parameters (gathered per layer in forward and backward). "
        "null: the deepspeed_config's, else 3.",
    )
    offload_optimizer: Literal["none", "cpu"] | None = Field(
        None,
        description="deepspeed: cpu keeps the optimizer state (and its step) in host memory "
        "(ZeRO-Offload). null: the deepspeed_config's, else none.",
    )
    offload_params: Literal["none", "cpu"] | None = Field(
        None,
        description="deepspeed, ZeRO stage 3: cpu keeps the partitioned parameters in host memory. "
        "null: the deepspeed_config's, else none.",
    )
    deepspeed_config: str | dict[str, Any] | None = Field(
        None,
        description="deepspeed: an existing ds_config.json (a path, read when the job is loaded and "
        "kept inline in the run's config.yaml; or the same mapping inline). hpcpipe's train.* "
        "settings and the parallel.* keys the job sets win and are named in the log; a different "
        "batch size is an error. Ignored under other strategies, so a flag can switch.",
    )
    nproc: int = Field(1, ge=1, description="Local worker processes started by `hpcpipe train`.")
    tp: int = Field(
        1,
        ge=1,
        description="Tensor-parallel degree: each layer's matrices split over this many ranks of one "
        "node (the recipe declares how: Recipe.tensor_parallel_plan; gpt and Llama-family "
        "hf-causal-lm have one). It must divide the ranks per node; the remaining world / tp ranks "
        "are data-parallel (parallel.strategy: fsdp, or auto).",
    )
    pp: int = Field(
        1,
        ge=1,
        description="Pipeline-parallel stages: the recipe's blocks split into pp x virtual_stages "
        "stages (Recipe.pipeline_stage; gpt has them), run by torch.distributed.pipelining over "
        "groups of ranks that cross nodes. world = pp x dp x tp; the job's gradient accumulation "
        "steps become the pipeline's micro-batches.",
    )
    pp_schedule: Literal["gpipe", "1f1b", "interleaved-1f1b"] = Field(
        "1f1b",
        description="Pipeline schedule. gpipe: every micro-batch forward, then every backward "
        "(activations of all of them at once); 1f1b: one forward, one backward in the steady "
        "state (at most pp micro-batches in flight); interleaved-1f1b: parallel.virtual_stages "
        "stages per rank, a bubble v times smaller.",
    )
    virtual_stages: int = Field(
        1, ge=1, description="Stages per pipeline rank (interleaved-1f1b: 2 or more; else 1)."
    )
    pp_split: list[int] | None = Field(
        None,
        description="The block index each pipeline stage after the first starts at (pp x "
        "virtual_stages - 1 increasing indices); null: balanced by parameter count.",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="Process-group backend; auto: nccl on CUDA, gloo otherwise."
    )
    timeout_s: float = Field(600.0, gt=0, description="Process-group collective timeout.")
    threads_per_rank: int | None = Field(
        None,
        ge=1,
        description="torch intra-op threads per rank (null: OMP_NUM_THREADS where the launcher "
        "or you set it, else this process's usable cores / local ranks).",
    )
    bucket_cap_mb: float = Field(
        25.0,
        gt=0,
        description="DDP: gradient bucket size in MiB; larger buckets mean fewer, bigger "
        "all-reduces, smaller ones start communication earlier in backward.",
    )
    gradient_as_bucket_view: bool = Field(
        False,
        description="DDP: gradients are views into the all-reduce buckets (saves one copy "
        "and the memory of the gradients).",
    )
    static_graph: bool = Field(
        False,
        description="DDP: the set of used parameters never changes between steps, so DDP "
        "can skip its per-step graph search and overlap better.",
    )
    find_unused_parameters: bool = Field(
        False,
        description="DDP: find, after each forward, the parameters the loss did not use (an unused "
        "head, experts no token reached) and mark them ready, so the gradient all-reduce does not "
        "wait for them (costs a graph traversal per step). False: such a model stops with DDP's "
        "'Expected to have finished reduction' error at its second step.",
    )
    broadcast_buffers: bool | None = Field(
        None,
        description="DDP: broadcast rank 0's buffers (BatchNorm running statistics) at every "
        "forward; null: the recipe decides (resnet-cifar: yes, gpt: no). Every evaluation and "
        "checkpoint takes rank 0's either way.",
    )
    sync_gradients: bool = Field(
        True,
        description="Benchmarking only: false skips every gradient all-reduce (ranks then "
        "diverge), to measure a step without communication (bench scaling uses it).",
    )
    nnodes: str = Field(
        "1",
        pattern=r"^[1-9][0-9]*(:[1-9][0-9]*)?$",
        description="Nodes of a multi-node run, N or MIN:MAX. MIN:MAX makes the c10d rendezvous "
        "elastic: the run goes on with as few as MIN nodes (resharded from the newest verified "
        "checkpoint) and a node that comes back joins at the next rendezvous.",
    )
    rdzv_last_call_s: float = Field(
        15.0,
        gt=0,
        description="Elastic runs (nnodes MIN:MAX): once MIN nodes joined a rendezvous, wait this "
        "long for more before training starts. Every shrink or growth waits it out once: "
        "shorter recovers sooner, longer lets slow-starting nodes join the first round. Between "
        "hosts torch takes whole seconds (a fraction is rounded up).",
    )
    rdzv_keep_alive_s: float | None = Field(
        None,
        gt=0,
        le=600,
        description="Elastic runs: seconds between each node agent's rendezvous heartbeats; "
        "rdzv_keep_alive_misses missed ones declare a node lost, and the survivors' next round "
        "waits for that. null: 0.5 for agents on one host (a loopback endpoint: one clock, so a "
        "lost node is noticed after 1.5 s of silence), torch's 5 between hosts, where clock skew "
        "and a busy network must not make a late heartbeat count as a lost node. Between hosts "
        "torch takes whole seconds (a fraction is rounded up).",
    )
    rdzv_keep_alive_misses: int = Field(
        3,
        ge=2,
        le=100,
        description="Elastic runs: missed rendezvous heartbeats after which a node counts as lost "
        "(torch's default, 3). At least 2: one late heartbeat alone never loses a node.",
    )
    worker_start: Literal["forkserver", "spawn"] = Field(
        "forkserver",
        description="How hpcpipe's own agent (hpcpipe train --nproc N, hpcpipe launch agent) starts "
        "workers: forkserver forks each from one process that imported torch and the trainer once "
        "(starts and restarts in well under a second each); spawn starts a fresh interpreter per "
        "worker (~4 s of imports each). torchrun and srun start their own.",
    )
    retain_host_memory: bool = Field(
        True,
        description="glibc: reuse freed host blocks up to 32 MiB instead of unmapping them, so CPU "
        "steps do not page-fault fresh memory (5-10% of a CPU step; see train/host_memory.py).",
    )

    @field_validator("deepspeed_config")
    @classmethod
    def _deepspeed_config_is_json(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        # The file's contents replace its path: config.yaml then carries them to every node (a
        # Kubernetes pod sees no local file), and they count in the job's training hash.
        return read_deepspeed_config(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _deepspeed_keys_need_deepspeed(self) -> ParallelConfig:
        if self.strategy != "deepspeed":
            return self
        if self.offload_params == "cpu" and self.zero_stage not in (None, 3):
            raise ValueError(
                "parallel.offload_params needs parallel.zero_stage 3 (only ZeRO-3 partitions parameters)"
            )
        if not self.sync_gradients and not self.can_skip_gradient_sync:
            raise ValueError(
                "parallel.sync_gradients=false is not available with parallel.strategy=deepspeed"
            )
        if self.tp > 1 or self.pp > 1:
            raise ValueError(
                f"parallel.tp={self.tp}, parallel.pp={self.pp}: DeepSpeed ZeRO shards data-parallel "
                "only here; use parallel.strategy=fsdp with tensor or pipeline parallelism"
            )
        if self.node_range[0] != self.node_range[1]:
            raise ValueError(
                f"parallel.nnodes {self.nnodes!r}: DeepSpeed ZeRO checkpoints are tied to the data-parallel "
                "world size, so an elastic range cannot resume after a shrink; use a fixed node count"
            )
        return self

    @model_validator(mode="after")
    def _pipeline_fits(self) -> ParallelConfig:
        interleaved = self.pp_schedule == "interleaved-1f1b"
        if interleaved and self.virtual_stages < 2:
            raise ValueError("parallel.pp_schedule=interleaved-1f1b needs parallel.virtual_stages 2 or more")
        if not interleaved and self.virtual_stages > 1:
            raise ValueError(
                f"parallel.virtual_stages={self.virtual_stages} needs parallel.pp_schedule=interleaved-1f1b"
            )
        split = self.pp_split
        if split is not None:
            stages = self.pp * self.virtual_stages
            if len(split) != stages - 1 or any(b <= a for a, b in zip([0, *split], split, strict=False)):
                raise ValueError(
                    f"parallel.pp_split {split}: give {stages - 1} increasing block indices above 0 "
                    f"(where stages 2..{stages} start)"
                )
        return self

    @model_validator(mode="after")
    def _tensor_parallel_fits(self) -> ParallelConfig:
        if self.tp == 1 and self.pp == 1:
            return self
        if self.strategy == "ddp":
            raise ValueError(
                f"parallel.tp={self.tp}, parallel.pp={self.pp}: data parallelism beside tensor or "
                "pipeline parallelism is FSDP2's; set parallel.strategy to fsdp or auto"
            )
        if self.nproc > 1 and self.nproc % self.tp:
            raise ValueError(
                f"parallel.tp={self.tp} must divide parallel.nproc={self.nproc} (tensor parallelism "
                "stays inside a node)"
            )
        return self

    @model_validator(mode="after")
    def _nnodes_min_le_max(self) -> ParallelConfig:
        low, high = self.node_range
        if low > high:
            raise ValueError(f"parallel.nnodes {self.nnodes!r}: MIN is larger than MAX")
        return self

    def layout_at(self, world_size: int) -> tuple[int, int, int] | None:
        """(pp, dp, tp) at ``world_size`` ranks; None without tensor or pipeline parallelism."""
        if self.tp == 1 and self.pp == 1:
            return None
        return self.pp, world_size // (self.tp * self.pp), self.tp

    @property
    def can_skip_gradient_sync(self) -> bool:
        """Whether ``sync_gradients=false`` is possible: DeepSpeed's engine reduces gradients
        itself, so the trainer has no all-reduce to leave out (tools ask before they train)."""
        return self.strategy != "deepspeed"

    @property
    def node_range(self) -> tuple[int, int]:
        """``"2"`` -> (2, 2); ``"1:2"`` -> (1, 2)."""
        low, _, high = self.nnodes.partition(":")
        return int(low), int(high or low)


def check_layout(tp: int, world_size: int, ranks_per_node: int, pp: int = 1) -> None:
    """ConfigError unless ``tp`` ranks of one node form each tensor-parallel group (it divides the
    ranks per node) and ``pp x tp`` divides the world (the data-parallel degree is the rest). An
    elastic range is checked at each of its node counts."""
    from hpcpipe.errors import ConfigError

    if tp > 1 and ranks_per_node % tp:
        raise ConfigError(
            f"parallel.tp={tp} must divide the ranks per node ({ranks_per_node}; world size "
            f"{world_size}): tensor parallelism stays inside a node"
        )
    if world_size % (tp * pp):
        raise ConfigError(
            f"parallel.pp={pp} x parallel.tp={tp} must divide the world size ({world_size}): "
            "world = pp x dp x tp"
        )


def check_micro_batches(cfg: ParallelConfig, accum: int) -> None:
    """ConfigError unless a pipeline has enough micro-batches (``micro_batches_needed``; the
    accumulation steps are the micro-batches)."""
    from hpcpipe.errors import ConfigError

    need = micro_batches_needed(cfg.pp, cfg.pp_schedule, accum)
    if need is not None:
        raise ConfigError(
            f"parallel.pp_schedule={cfg.pp_schedule} needs {need} parallel.pp={cfg.pp} micro-batches "
            f"per step; train.global_batch_size / (micro_batch_size x data-parallel ranks) gives {accum}"
        )


def micro_batches_needed(pp: int, schedule: str, micro_batches: int) -> str | None:
    """What ``schedule`` over ``pp`` stages needs that ``micro_batches`` per step lack: "at least"
    pp (1F1B schedules: one per stage), "a multiple of" pp (interleaved), or None (enough)."""
    if pp == 1 or schedule == "gpipe":
        return None
    if schedule == "interleaved-1f1b" and micro_batches % pp:
        return "a multiple of"
    return "at least" if micro_batches < pp else None


def read_deepspeed_config(path: str) -> dict[str, Any]:
    """The JSON object in ``path``; ValueError naming the file (not the key: the caller's
    error path names it) when it is missing or not one."""
    try:
        text = Path(path).expanduser().read_text()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        body = json.loads(text)
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(body, dict):
        raise ValueError(f"{path} holds a JSON {type(body).__name__}, not an object")
    return body
