"""The Recipe protocol: everything workload-specific the trainer must not know about."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

Batch = tuple[torch.Tensor, ...]


class TrainLoader(Protocol):
    """A stateful, rank-sharded source of micro-batches, deterministic from (seed, step, rank)."""

    def next_microbatch(self) -> Batch: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def set_micro_batch_size(self, micro_batch_size: int) -> None: ...

    def close(self) -> None:
        """Release worker processes or files (called once when training ends)."""


class Recipe(Protocol):
    """A workload: model, data, loss, evaluation and its FLOPs, for one rank."""

    name: str
    throughput_unit: str  # "tokens" or "samples": names the metrics key <unit>_per_s
    # DDP broadcasts rank 0's buffers at every forward when True (BatchNorm running statistics);
    # parallel.broadcast_buffers overrides it.
    broadcasts_buffers: bool
    # Checkpoints hold only parameters that require grad (and their optimizer state): a LoRA run
    # rebuilds its frozen base from the model source instead of writing it at every save.
    checkpoint_trainable_only: bool

    @property
    def fsdp_param_dtype(self) -> torch.dtype | None:
        """The dtype FSDP2 gathers parameters in (one per unit); None keeps each parameter's own."""

    @property
    def items_per_sample(self) -> int:
        """Throughput items in one sample: tokens per sequence, or 1 when counting samples."""

    def prepare(self, progress: bool) -> None:
        """Make data ready on disk (idempotent; runs once per node before workers train)."""

    def dataset_hash(self) -> str | None:
        """Hash of the prepared dataset's manifest, for lineage."""

    def build_model(self) -> nn.Module: ...

    def shard_units(self, model: nn.Module) -> Sequence[nn.Module]:
        """Sub-modules FSDP2 shards one by one (transformer blocks, ResNet stages)."""

    def train_loader(self, rank: int, world_size: int) -> TrainLoader: ...

    def samples_per_epoch(self) -> int | None:
        """Training samples in one epoch (for train.epochs and time/epoch); None when unbounded."""

    def eval_batches(self, rank: int, world_size: int) -> Iterable[Batch]:
        """The same validation micro-batches at every evaluation."""

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Mean loss over the micro-batch (a scalar that backward() is called on)."""

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        """Summed evaluation figures of one batch, including ``count``; summed over ranks after."""

    def eval_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        """The all-reduced sums of every batch -> named metrics; ``val_loss`` is required."""

    def interval_counts(self) -> dict[str, torch.Tensor]:
        """Items counted since the last call on this rank (e.g. supervised tokens); reset on read.

        The trainer sums them over ranks and logs ``<key>_per_s_per_device`` next to throughput.
        """

    def flops_per_sample(self) -> float | None:
        """Training FLOPs (forward + backward) per sample, for MFU; None when unknown."""

    def on_train_start(self, run_dir: Path) -> None:
        """Files for the run directory before training (main rank only), e.g. a data report."""

    def on_train_end(self, model: nn.Module, is_main: bool, run_dir: Path) -> None:
        """Artifacts after training (every rank calls it; only the main rank writes)."""
