"""The part of a checkpoint that is the trainer's own (beyond weights and optimizer): what exact
resume needs of this rank, written with every save and put back after a restore."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from hpcpipe.checkpoint.state import capture_rng_state, restore_rng_state
from hpcpipe.config import TrainConfig
from hpcpipe.recipes.base import TrainLoader
from hpcpipe.train.mesh import Layout
from hpcpipe.train.oom import OOMGuard
from hpcpipe.train.precision import Precision
from hpcpipe.train.schedule import lr_at


def capture_trainer_state(
    step: int, cfg: TrainConfig, items_per_sample: int, loader: TrainLoader, oom: OOMGuard, layout: Layout,
    world_size: int, precision: Precision,
) -> dict[str, Any]:  # fmt: skip
    """This rank's trainer state at ``step``."""
    skipped = precision.skipped_steps
    state: dict[str, Any] = {
        "step": step,
        "tokens_seen": step * cfg.global_batch_size * items_per_sample,
        "lr": lr_at(max(step - skipped, 1), cfg),
        "skipped_steps": skipped,  # fp16 steps without an update: the LR follows the updates
        "loader": loader.state_dict(),
        "rng": capture_rng_state(),
        "oom_split": oom.state_dict(),
        "world_size": world_size,
        "tp": layout.tp,
        "layout": layout.shape(),
        "schedule_steps": cfg.steps,  # the LR schedule's length: a resume says when it changed
    }
    if precision.scaler is not None:
        state["grad_scaler"] = precision.scaler.state_dict()
    return state


def restore_trainer_state(
    extra: Mapping[str, Any], loader: TrainLoader, oom: OOMGuard, precision: Precision, same_places: bool
) -> None:
    """Put back what ``capture_trainer_state`` saved. ``same_places``: this rank holds the
    saving rank's place (``mesh.same_rank_places``): RNG streams and a shrunk micro-batch split
    are per rank, only meaningful as saved; the split stays this run's where the config's changed
    since (a lowered micro-batch)."""
    loader.load_state_dict(extra["loader"])
    if precision.scaler is not None and "grad_scaler" in extra:
        precision.scaler.load_state_dict(extra["grad_scaler"])
        precision.skips.restart(int(extra.get("skipped_steps", 0)))  # none: saved before they counted
    if same_places:
        restore_rng_state(extra["rng"])
        if oom.load_state_dict(extra["oom_split"]):
            loader.set_micro_batch_size(oom.micro_batch_size)


def announce_schedule_change(
    extra: Mapping[str, Any], cfg: TrainConfig, emit: Callable[[str, dict[str, Any]], None], is_main: bool
) -> None:
    """Say when the LR at the resumed update differs from the checkpoint's, or the schedule spans
    another number of steps (train.steps or train.epochs raised to continue a run, which stretches
    it): a run that had decayed to its floor jumped back up without a word. The LR before is the
    one the checkpoint recorded (saved under its own train.lr, warm-up and floor); nothing for a
    checkpoint that recorded neither it nor the schedule's length."""
    saved = extra.get("schedule_steps")
    old_steps = None if saved is None else int(saved)
    step = int(extra["step"])
    updates = max(step - int(extra.get("skipped_steps", 0)), 1)  # the LR follows the updates taken
    if "lr" in extra:
        before = float(extra["lr"])
    elif old_steps is not None:
        before = lr_at(updates, cfg.model_copy(update={"steps": old_steps}))
    else:
        return
    now = lr_at(updates, cfg)
    if old_steps in (None, cfg.steps) and math.isclose(before, now, rel_tol=1e-9):
        return
    change = {"step": step, "old_steps": old_steps, "new_steps": cfg.steps, "old_lr": before, "new_lr": now}
    emit("lr_schedule_changed", change)
    if is_main:
        what = "the LR settings changed"  # train.lr, warmup_steps, min_lr_ratio or schedule
        if old_steps not in (None, cfg.steps):
            what = f"the LR schedule now spans {cfg.steps} steps instead of {old_steps}"
        print(f"hpcpipe: {what}: the LR at step {step} was {before:.6g} and is now {now:.6g}", flush=True)
