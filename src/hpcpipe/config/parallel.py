"""The ``parallel:`` section: processes, nodes, strategy (DDP, FSDP2), process group."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hpcpipe.config.section import Section


class ParallelConfig(Section):
    strategy: Literal["auto", "single", "ddp", "fsdp"] = Field(
        "auto", description="auto: single for one process, ddp for more."
    )
    nproc: int = Field(1, ge=1, description="Local worker processes started by `hpcpipe train`.")
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="Process-group backend; auto: nccl on CUDA, gloo otherwise."
    )
    timeout_s: float = Field(600.0, gt=0, description="Process-group collective timeout.")
    threads_per_rank: int | None = Field(
        None, ge=1, description="torch intra-op threads per rank (null: cores / local ranks)."
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
    broadcast_buffers: bool | None = Field(
        None,
        description="DDP: broadcast rank 0's buffers (BatchNorm running statistics) at every "
        "forward; null: the recipe decides (resnet-cifar: yes, gpt: no).",
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
        "shorter recovers sooner, longer lets slow-starting nodes join the first round.",
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

    @model_validator(mode="after")
    def _nnodes_min_le_max(self) -> ParallelConfig:
        low, high = self.node_range
        if low > high:
            raise ValueError(f"parallel.nnodes {self.nnodes!r}: MIN is larger than MAX")
        return self

    @property
    def node_range(self) -> tuple[int, int]:
        """``"2"`` -> (2, 2); ``"1:2"`` -> (1, 2)."""
        low, _, high = self.nnodes.partition(":")
        return int(low), int(high or low)
