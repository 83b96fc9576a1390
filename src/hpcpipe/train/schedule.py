"""Learning-rate schedule: linear warm-up, then cosine / linear decay to a floor, or constant."""

from __future__ import annotations

import math
from typing import Any

from hpcpipe.config import TrainConfig
from hpcpipe.errors import ConfigError


def resolve_steps(cfg: TrainConfig, samples_per_epoch: int | None) -> TrainConfig:
    """``cfg`` with ``steps`` set from ``epochs`` when the job counts in epochs (else unchanged).

    steps = ceil(epochs x samples per epoch / global batch): the last step may run into the next
    epoch, so every sample of the last epoch is seen.
    """
    if cfg.epochs is None:
        return cfg
    if samples_per_epoch is None:
        raise ConfigError("train.epochs: this recipe does not know its dataset size; set train.steps")
    steps = max(1, math.ceil(cfg.epochs * samples_per_epoch / cfg.global_batch_size))
    return cfg.model_copy(update={"steps": steps})


def lr_at(step: int, cfg: TrainConfig) -> float:
    """LR for optimizer step ``step`` (1-based: the first update uses lr_at(1))."""
    peak, floor = cfg.lr, cfg.lr * cfg.min_lr_ratio
    if cfg.warmup_steps > 0 and step <= cfg.warmup_steps:
        return peak * step / cfg.warmup_steps
    if cfg.schedule == "constant":
        return peak
    decay_steps = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
    if cfg.schedule == "linear":
        return peak - (peak - floor) * progress
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: Any, updates: int, cfg: TrainConfig) -> float:
    """Set every param group's LR for update number ``updates`` (1-based); returns it."""
    lr = lr_at(max(updates, 1), cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr
