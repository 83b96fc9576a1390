"""The ``train:`` section: steps, batch arithmetic, optimizer, schedule, precision, evaluation."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hpcpipe.config.section import Section
from hpcpipe.errors import ConfigError


class TrainConfig(Section):
    """The optimisation: steps or epochs, batch sizes and accumulation, learning-rate schedule,
    precision, clipping, evaluation, compilation and activation checkpointing."""

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
    activation_checkpointing: Literal["none", "selective", "full"] = Field(
        "none",
        description="Recompute activations in backward instead of keeping them, per block "
        "(Recipe.shard_units): full keeps only each block's input; selective keeps the outputs of "
        "matmuls and attention and recomputes the cheap element-wise ops between them. Same "
        "losses, less memory, more compute (full: about one more forward).",
    )
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


def grad_accum_steps(train: TrainConfig, world_size: int, tp: int = 1, pp: int = 1) -> int:
    """Micro-steps per optimizer step; a clear error when the batch arithmetic is impossible.

    The ``tp`` ranks of a tensor-parallel group and the ``pp`` stages of a pipeline share one
    micro-batch: the data-parallel size is ``world_size / (tp pp)``."""
    data_parallel = max(1, world_size // (tp * pp))
    per_step = train.micro_batch_size * data_parallel
    if train.global_batch_size % per_step != 0:
        ranks = f"world size ({world_size})"
        if tp * pp > 1:
            ranks = f"data-parallel ranks ({data_parallel} = world / (parallel.pp x parallel.tp))"
        raise ConfigError(
            f"train.global_batch_size ({train.global_batch_size}) must be a multiple of "
            f"train.micro_batch_size ({train.micro_batch_size}) x {ranks}"
        )
    return train.global_batch_size // per_step
