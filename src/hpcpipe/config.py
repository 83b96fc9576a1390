"""JobConfig: the typed, documented, frozen description of one hpcpipe job.

A job is loaded from a shipped preset name (``quickstart``) or a YAML path, then dotted
``--set section.key=value`` overrides are applied, each parsed to its field's type. Unknown keys
are errors. Components receive their own section (``TrainConfig``, ``DataConfig``, ...), never the
whole tree.
"""

from __future__ import annotations

import hashlib
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hpcpipe.config_hpo import HpoConfig
from hpcpipe.config_launch import LaunchConfig
from hpcpipe.config_observe import ObserveConfig
from hpcpipe.config_pipeline import PipelineConfig
from hpcpipe.config_section import Section, one_line
from hpcpipe.errors import ConfigError, hide_credentials


class RunConfig(Section):
    name: str = Field("run", min_length=1, description="Run name; the run directory is <out_dir>/<name>.")
    out_dir: str = Field("runs", description="Parent directory of run directories.")
    seed: int = Field(0, ge=0, description="Seed for model init, data order and dropout.")
    recipe: Literal["gpt", "resnet-cifar", "lora-function-calling"] = Field(
        "gpt",
        description="Workload recipe (registry name): gpt (LM pretraining on token shards), "
        "resnet-cifar (torchvision ResNet-18 image classification: CIFAR, MNIST-style IDX, ImageFolder) "
        "or lora-function-calling (LoRA fine-tuning of a Hugging Face causal LM on function-calling "
        "conversations: Glaive v2, OpenAI-style or Hermes-style).",
    )

    _one_line = field_validator("name", "out_dir")(one_line)

    @model_validator(mode="after")
    def _name_is_a_plain_directory_name(self) -> RunConfig:
        # The name becomes a directory under out_dir: it must not climb out of it.
        if "/" in self.name or "\\" in self.name or self.name in {".", ".."}:
            raise ValueError(f"run.name must be a plain directory name, got {self.name!r}")
        return self


class ModelConfig(Section):
    variant: Literal["gpt2", "llama", "resnet18", "resnet18-imagenet", "hf-causal-lm"] = Field(
        "gpt2",
        description="gpt2: LayerNorm + learned positions + GELU MLP; "
        "llama: RMSNorm + RoPE + SwiGLU, no biases (both for recipe gpt). "
        "resnet18: torchvision ResNet-18 with a small-image stem (3x3 conv, stride 1, no max-pool); "
        "resnet18-imagenet: the original 7x7 stride-2 stem + max-pool, 16x fewer FLOPs on small "
        "images (both for recipe resnet-cifar). "
        "hf-causal-lm: a Hugging Face AutoModelForCausalLM from model.name_or_path (recipe "
        "lora-function-calling; n_layers, n_heads and d_model are then the checkpoint's own).",
    )
    name_or_path: str | None = Field(
        None,
        description="hf-causal-lm: a local model directory, a hub id already in the local "
        "Hugging Face cache (nothing is downloaded), a directory holding model.gguf_file, or "
        "'@tiny-llama' (a 2-layer Llama pre-trained once on raw generated Glaive text, about 1.5 "
        "minutes), '@tiny-llama-random' (the same, random weights: mechanics tests), "
        "or '@random:<shape>' (random weights of a real shape, e.g. @random:qwen2-7b: throughput).",
    )
    gguf_file: str | None = Field(
        None,
        description="hf-causal-lm: a GGUF file name inside model.name_or_path (or a path to "
        "one); transformers de-quantises it (needs the gguf and accelerate packages: the lora extra).",
    )
    base_dtype: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="hf-causal-lm: dtype of the frozen base weights (bf16 halves their memory; "
        "LoRA adapters follow lora.adapter_dtype).",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="hf-causal-lm: recompute each decoder layer's activations in backward "
        "(non-reentrant), trading ~1/3 more compute for memory.",
    )
    n_layers: int = Field(4, ge=1, description="Transformer blocks.")
    n_heads: int = Field(4, ge=1, description="Attention heads per block.")
    d_model: int = Field(128, ge=8, description="Residual stream width.")
    seq_len: int = Field(128, ge=2, description="Context length in tokens.")
    vocab_size: int | None = Field(
        None, ge=2, description="Vocabulary; null takes the prepared tokenizer's size."
    )
    ffn_mult: float = Field(
        4.0, gt=0, description="MLP hidden width / d_model (llama: 2/3 of this, rounded to 64)."
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on residual branches.")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base (llama variant).")
    norm_eps: float = Field(1e-5, gt=0, description="LayerNorm / RMSNorm epsilon.")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})"
            )
        if self.variant == "llama" and (self.d_model // self.n_heads) % 2 != 0:
            raise ValueError("model.d_model / model.n_heads must be even for RoPE (llama variant)")
        return self


FUNCTION_CALLING_FORMATS = ("glaive", "openai", "hermes")
IMAGE_FORMATS = (
    "cifar10",
    "cifar100",
    "cifar10-binary",
    "cifar100-binary",
    "idx",
    "fashion-mnist",
    "imagefolder",
)


class DataConfig(Section):
    format: Literal[
        "tokens",
        "cifar10",
        "cifar100",
        "cifar10-binary",
        "cifar100-binary",
        "idx",
        "fashion-mnist",
        "imagefolder",
        "glaive",
        "openai",
        "hermes",
    ] = Field(
        "tokens",
        description="tokens: text sources -> token shards (recipe gpt). Images (recipe resnet-cifar), "
        "read from data.root: cifar10/cifar100 (the python-pickle batches, read with a restricted "
        "unpickler), cifar10-binary/cifar100-binary, idx (MNIST-style train-/t10k- IDX files, gzipped "
        "or not), fashion-mnist (idx; data.root defaults to Debian's dataset-fashion-mnist), "
        "imagefolder (root/train/<class>/*.png and root/test/<class>/*). Function-calling "
        "conversations (recipe lora-function-calling) from data.sources (JSONL): glaive (Glaive v2 "
        "system + chat rows), openai (messages + tools + tool_calls), hermes (<tool_call> conversations).",
    )
    synthetic_rows: int = Field(
        2000,
        ge=1,
        description="Function calling: rows the '@synthetic' source generates (realistic "
        "Glaive v2 rows, deterministic from run.seed).",
    )
    packing: bool = Field(
        True,
        description="Function calling: pack several conversations into one model.seq_len "
        "sequence; attention never crosses a conversation boundary (block-diagonal mask, positions "
        "restart per conversation). false: one conversation per sequence, padded.",
    )
    root: str | None = Field(None, description="Directory of an image dataset (formats other than tokens).")
    augment: bool = Field(
        True, description="Images: random crop with 4-pixel padding and horizontal flip in training."
    )
    max_train_samples: int | None = Field(
        None, ge=1, description="Images: train on the first N training samples only (null: all)."
    )
    max_eval_samples: int | None = Field(
        None, ge=1, description="Images: evaluate on the first N test samples (null: the whole test set)."
    )
    num_workers: int = Field(
        0, ge=0, description="Images: DataLoader worker processes per rank (0: load in the training process)."
    )
    pin_memory: bool = Field(False, description="Images: page-locked batches for faster host-to-GPU copies.")
    persistent_workers: bool = Field(
        False, description="Images: keep DataLoader workers alive between epochs (needs num_workers > 0)."
    )
    prefetch_factor: int | None = Field(
        None,
        ge=1,
        description="Images: batches each worker loads ahead (null: torch's default, 2; "
        "needs num_workers > 0).",
    )
    sources: list[str] = Field(
        default_factory=lambda: ["@stdlib"],
        description="Text files, directories, globs or JSONL files; '@stdlib' is the Python "
        "standard library source of the running interpreter.",
    )
    extensions: list[str] = Field(
        default_factory=lambda: [".py", ".txt", ".md", ".rst", ".jsonl"],
        description="File suffixes taken when a source is a directory.",
    )
    text_field: str = Field("text", description="Field holding the text in JSONL sources.")
    max_bytes: int | None = Field(
        None, ge=1, description="Stop reading the corpus after this many bytes (null: all)."
    )
    tokenizer: Literal["bpe", "bytes"] = Field(
        "bpe", description="bpe: byte-level BPE trained locally; bytes: raw UTF-8 bytes."
    )
    vocab_size: int = Field(4096, ge=260, le=1 << 20, description="BPE vocabulary size.")
    val_fraction: float = Field(
        0.02, gt=0.0, lt=0.5, description="Fraction of documents held out for validation."
    )
    shard_tokens: int = Field(16 * 1024 * 1024, ge=1024, description="Tokens per .bin shard file.")
    prepared_dir: str = Field(
        "data/prepared",
        description="Where prepared datasets live; each in a sub-directory named by the hash "
        "of its inputs, so preparing again with the same inputs reuses it. Image datasets keep "
        "their hash manifest (written on first read) here too.",
    )
    cache_dir: str | None = Field(
        None,
        description="Node-local directory (NVMe) to read the dataset from: the prepared token "
        "shards (gpt) or the image files (resnet-cifar) are copied there once per node, into a "
        "sub-directory named by their manifest's SHA-256, verified, and read from there "
        "(`hpcpipe data stage`). null: read where they are.",
    )

    @model_validator(mode="after")
    def _workers_for_worker_options(self) -> DataConfig:
        if self.num_workers == 0 and (self.persistent_workers or self.prefetch_factor is not None):
            key = "persistent_workers" if self.persistent_workers else "prefetch_factor"
            raise ValueError(f"data.{key} needs data.num_workers > 0")
        return self


class TrainConfig(Section):
    steps: int = Field(100, ge=1, description="Optimizer steps (ignored when train.epochs is set).")
    epochs: float | None = Field(
        None,
        gt=0,
        description="Train for this many passes over the training set instead of "
        "train.steps (steps = ceil(epochs x samples / global batch)); needs a recipe that knows its "
        "dataset size (resnet-cifar).",
    )
    micro_batch_size: int = Field(8, ge=1, description="Sequences per rank per forward pass.")
    global_batch_size: int = Field(
        16,
        ge=1,
        description="Sequences per optimizer step over all ranks; gradient accumulation = "
        "global / (micro * world size) and must be a whole number.",
    )
    optimizer: Literal["adamw", "sgd"] = Field(
        "adamw", description="adamw (betas beta1/beta2) or sgd (Nesterov momentum train.momentum)."
    )
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum.")
    lr: float = Field(3e-3, gt=0, description="Peak learning rate.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final LR as a fraction of peak.")
    warmup_steps: int = Field(10, ge=0, description="Linear warm-up steps.")
    schedule: Literal["cosine", "linear", "constant"] = Field("cosine", description="Decay after warm-up.")
    weight_decay: float = Field(0.1, ge=0, description="Weight decay on >= 2-D weights (AdamW: decoupled).")
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    beta2: float = Field(0.95, ge=0, lt=1, description="AdamW beta2.")
    grad_clip: float = Field(1.0, ge=0, description="Max global grad norm (0 disables clipping).")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="bf16: autocast; fp16: autocast + gradient scaler (CUDA)."
    )
    compile: bool = Field(False, description="Wrap the model in torch.compile.")
    channels_last: bool = Field(
        False,
        description="Images: NHWC memory format for model and inputs (faster convolutions "
        "under bf16/fp16 on tensor cores and on many CPUs).",
    )
    label_smoothing: float = Field(
        0.0, ge=0, lt=1, description="Classification: cross-entropy label smoothing."
    )
    eval_every: int = Field(50, ge=0, description="Evaluate every N steps (0: only at the end).")
    eval_batches: int = Field(8, ge=1, description="Micro-batches per rank in one evaluation.")


class LoraConfig(Section):
    """LoRA adapters (peft) for recipe lora-function-calling; the base model stays frozen."""

    r: int = Field(16, ge=1, description="Adapter rank.")
    alpha: float = Field(32.0, gt=0, description="Scale numerator: updates are scaled by alpha / r.")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the adapter input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
        description="Names of the Linear modules that get adapters (suffixes of module names, as peft "
        "matches them); every name must match at least one module of the model.",
    )
    adapter_dtype: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Dtype of the trainable adapter weights (and their optimizer state): fp32 "
        "keeps small updates from rounding away under a bf16 base; FSDP2 then gathers them in bf16 "
        "for compute and reduces their gradients in fp32.",
    )


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


class CheckpointConfig(Section):
    """Checkpoints: DCP shards + a manifest of file hashes, committed atomically, in two tiers.

    ``async`` is a Python keyword, so the field is ``async_save`` in code and ``async`` in YAML
    and ``--set checkpoint.async=true`` (both spellings are accepted when reading).
    """

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    every_steps: int = Field(
        0, ge=0, description="Save a checkpoint every N optimizer steps (0: no periodic saves)."
    )
    keep_last: int = Field(
        3,
        ge=1,
        description="Committed checkpoints kept per tier, newest first (the newest "
        "verified one and the one training resumed from are never deleted).",
    )
    keep_every: int = Field(
        0,
        ge=0,
        description="Also keep forever every checkpoint whose step is a multiple of "
        "this (0: none), e.g. for later evaluation.",
    )
    async_save: bool = Field(
        False,
        alias="async",
        description="Write in the background: training blocks only while the state is copied "
        "to CPU memory (costs one extra copy of the model + optimizer state in RAM).",
    )
    dir: str | None = Field(
        None,
        description="Fast tier, written at every save (node-local disk is fine on one "
        "node; every rank must see it); null: <run_dir>/checkpoints.",
    )
    durable_dir: str | None = Field(
        None,
        description="Durable tier (shared file system): committed fast checkpoints are "
        "copied there in the background and verified; null: no durable tier.",
    )
    durable_every_steps: int = Field(
        0,
        ge=0,
        description="Copy to the durable tier when the step is a multiple of this "
        "(0 with durable_every_s 0: copy every checkpoint).",
    )
    durable_every_s: float = Field(
        0.0,
        ge=0,
        description="Also copy to the durable tier when this many seconds passed "
        "since the last durable copy (0: no time-based copies).",
    )
    resume: Literal["auto", "never", "required"] = Field(
        "auto",
        description="auto: resume from the newest verified checkpoint if any; never: "
        "always start fresh; required: fail (exit 2) when there is nothing to resume from.",
    )
    scratch_if_none_verify: bool = Field(
        False,
        description="When checkpoints exist but none verifies, start from scratch "
        "instead of failing with exit code 2.",
    )
    io_threads: int = Field(2, ge=1, le=64, description="Writer threads per rank (one file each per save).")
    hash: Literal["sha256", "blake3"] = Field(
        "sha256",
        description="File hash in the manifest: sha256, or blake3 (about 4.5x faster; needs the "
        "blake3 extra: pip install 'hpcpipe[blake3]'). Either kind of checkpoint always verifies.",
    )


class FaultConfig(Section):
    hang_timeout_s: float = Field(
        0.0,
        ge=0,
        description="Watchdog: a step that takes longer than this dumps every "
        "rank's stack and exits non-zero (0: no watchdog).",
    )
    oom_recovery: bool = Field(
        True,
        description="On an out-of-memory error, halve the micro-batch (more gradient "
        "accumulation, same global batch) and retry the step.",
    )
    preempt_grace_s: float = Field(
        30.0,
        ge=0,
        description="After SIGTERM/SIGUSR1 (preemption), time allowed to finish "
        "the step and write a final checkpoint before exiting.",
    )
    preempt_exit_code: int = Field(
        75,
        ge=1,
        le=255,
        description="Exit code after a preemption checkpoint: 75 "
        "(EX_TEMPFAIL, 'checkpointed, resubmit me'); not 143, which means killed *without* one.",
    )


# run.recipe -> (the model.variant values, the data.format values) it works with.
RECIPE_FITS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gpt": (("gpt2", "llama"), ("tokens",)),
    "resnet-cifar": (("resnet18", "resnet18-imagenet"), IMAGE_FORMATS),
    "lora-function-calling": (("hf-causal-lm",), FUNCTION_CALLING_FORMATS),
}


class JobConfig(Section):
    """The whole job. Saved as ``config.yaml`` in the run directory."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    observe: ObserveConfig = Field(default_factory=ObserveConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    fault: FaultConfig = Field(default_factory=FaultConfig)
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    hpo: HpoConfig = Field(default_factory=HpoConfig)

    @model_validator(mode="after")
    def _watchdog_fires_before_collectives_time_out(self) -> JobConfig:
        # A hang should end with the watchdog's stack dump, not a bare collective timeout.
        hang, pg = self.fault.hang_timeout_s, self.parallel.timeout_s
        if hang > 0 and hang >= pg:
            raise ValueError(
                f"fault.hang_timeout_s ({hang:g}) must be smaller than parallel.timeout_s ({pg:g})"
            )
        return self

    @model_validator(mode="after")
    def _recipe_matches_model_and_data(self) -> JobConfig:
        variants, formats = RECIPE_FITS[self.run.recipe]
        recipe = self.run.recipe
        if self.model.variant not in variants:
            raise ValueError(
                f"model.variant {self.model.variant!r} does not fit run.recipe {recipe!r} "
                f"(use {' or '.join(variants)})"
            )
        if self.data.format not in formats:
            raise ValueError(
                f"data.format {self.data.format!r} does not fit run.recipe {recipe!r} "
                f"(use {', '.join(formats)})"
            )
        if recipe == "lora-function-calling" and not self.model.name_or_path:
            raise ValueError("model.name_or_path is required for run.recipe 'lora-function-calling'")
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def config_hash(self) -> str:
        """SHA-256 of the canonical JSON form: equal configs hash equal."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Loading: preset or path -> dict -> overrides -> validated JobConfig


def grad_accum_steps(train: TrainConfig, world_size: int) -> int:
    """Micro-steps per optimizer step; a clear error when the batch arithmetic is impossible."""
    per_step = train.micro_batch_size * world_size
    if train.global_batch_size % per_step != 0:
        raise ConfigError(
            f"train.global_batch_size ({train.global_batch_size}) must be a multiple of "
            f"train.micro_batch_size ({train.micro_batch_size}) x world size ({world_size})"
        )
    return train.global_batch_size // per_step


def load_config(source: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> JobConfig:
    """Load a preset name or YAML path, apply ``section.key=value`` overrides, validate."""
    raw = _read_source(source)
    for item in overrides:
        _apply_override(raw, item)
    return validate_config(raw, origin=str(source))


def with_overrides(job: JobConfig, overrides: list[str] | tuple[str, ...]) -> JobConfig:
    """``job`` with ``--set section.key=value`` overrides applied (ConfigError on a bad one)."""
    raw = job.to_dict()
    for item in overrides:
        _apply_override(raw, item)
    return validate_config(raw, origin="--set")


def apply_values(job: JobConfig, values: dict[str, Any]) -> JobConfig:
    """``job`` with typed values set by dotted key (an unknown key or a bad value: ConfigError)."""
    raw = job.to_dict()
    for key, value in values.items():
        _field_annotation(key)  # names the key when JobConfig has no such key
        node = raw
        for part in key.split(".")[:-1]:
            if node.get(part) is None:  # an optional section that was off (null) comes on
                node[part] = {}
            node = node[part]
        node[key.rsplit(".", 1)[-1]] = value
    return validate_config(raw, origin=", ".join(f"{k}={v}" for k, v in values.items()))


def validate_config(raw: dict[str, Any], origin: str = "config") -> JobConfig:
    try:
        return JobConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {first_error(exc)}") from None


def _read_source(source: str | Path) -> dict[str, Any]:
    from hpcpipe.presets import preset_path

    path = Path(source)
    looks_like_path = path.suffix in {".yaml", ".yml"} or "/" in str(source)
    if not looks_like_path:
        path = preset_path(str(source))  # raises ConfigError naming the known presets
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid YAML (not UTF-8 text)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{path}{where}: not valid YAML") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    annotation = _field_annotation(key)
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if child is None:  # an optional section that was off (observe.profile: null) comes on
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {part!r} is not a section")
        node = child
    node[parts[-1]] = _parse_value(value, annotation)


def _optional_section(annotation: Any) -> Any:
    """``Section | None`` -> ``Section`` (an optional section's keys can be set one by one)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) == 1:
            return models[0]
    return annotation


def _field_annotation(key: str) -> Any:
    """The annotation of a dotted key; a ConfigError for a key JobConfig does not have."""
    model: type[BaseModel] = JobConfig
    parts = key.split(".")
    for depth, part in enumerate(parts):
        field = _field_named(model, part)
        if field is None:
            prefix = ".".join(parts[:depth]) or "top level"
            known = ", ".join(field.alias or name for name, field in model.model_fields.items())
            raise ConfigError(f"unknown config key {key!r} (keys in {prefix}: {known})")
        annotation = field.annotation
        if depth == len(parts) - 1:
            return annotation
        annotation = _optional_section(annotation)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            raise ConfigError(f"unknown config key {key!r}: {'.'.join(parts[: depth + 1])} is a value")
        model = annotation
    raise AssertionError("unreachable")


def _field_named(model: type[BaseModel], key: str) -> Any:
    """The field a YAML key names: its alias (``checkpoint.async``) or its Python name."""
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None


def _parse_value(text: str, annotation: Any) -> Any:
    """Strings stay strings for str fields; everything else is read as a YAML scalar/list."""
    if _is_plain_str(annotation):
        return text
    try:
        return yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        return text


def _is_plain_str(annotation: Any) -> bool:
    if annotation is str:
        return True
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return all(isinstance(arg, str) for arg in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return len(args) == 1 and _is_plain_str(args[0])
    return False


def first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(part) for part in err["loc"]) or "config"
    message = err["msg"].removeprefix("Value error, ")  # our validators' ValueError text
    if err["type"] == "extra_forbidden":
        return f"unknown config key {loc!r}"
    if "input" in err and err["type"] not in {"missing"} and not isinstance(err["input"], dict):
        return f"{loc}: {message} (got {hide_credentials(repr(err['input']))})"
    return f"{loc}: {message}"
