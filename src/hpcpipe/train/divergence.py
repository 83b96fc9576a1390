"""Stop a diverged run before it saves: checkpoints of NaN weights would, through keep_last, push
out every good one, and every restart would resume the last of them and stop again.

Checked where the loop reads the step's values on the host anyway (a logged step, a step that
checkpoints): a check of every step would wait for the device every step."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from hpcpipe.errors import UserError
from hpcpipe.train.oom import AllReduceMax, agree_any
from hpcpipe.train.precision import Precision

# fp16's GradScaler halves its scale at each step it skips (its default backoff). Below 1 the
# loss is scaled down, not up: a gradient that overflows even then is, in practice, not finite at
# all (sqrt or log of 0); a run whose gradient is never finite would train every remaining step
# without one update and finish as a success. It stops once a step was skipped at a scale below 1
# in a streak of skips as long as the one that takes the initial 2**16 there (18: the 17th skip
# is at scale 1): a run that updates at a scale below 1 is not stopped by a few skips, nor one
# whose scale grew, before it has backed off below 1.
MIN_SKIPS_IN_A_ROW = 18


def host_values(loss: torch.Tensor, grad_norm: torch.Tensor | None) -> tuple[float, float | None]:
    """``loss`` and ``grad_norm`` as floats, in one wait for the device."""
    if grad_norm is None:
        return loss.item(), None
    both = torch.stack([loss.float(), grad_norm.to(loss.device, torch.float32)]).tolist()
    return both[0], both[1]


def require_finite(step: int, loss: float, grad_norm: float | None, grad_clip: float) -> None:
    """UserError when the step's loss, or its gradient norm (None: not measured, or a loss scaler's
    to judge), is not finite. Both are the same on every rank (the mean loss, the global norm)."""
    if not math.isfinite(loss):
        advice = "lower train.lr, set train.grad_clip, or check the data"
        if grad_clip > 0:  # clipping is on already: advising it sent users to a setting they had
            advice = "lower train.lr or check the data"
        raise UserError(
            f"training diverged: the loss is {loss} at step {step} ({advice}); the checkpoints "
            "before it are kept"
        )
    if grad_norm is not None and not math.isfinite(grad_norm):
        # A finite loss with a non-finite gradient: an operation with no finite derivative at its
        # input (sqrt or log at 0, a division by 0) or an overflow in the backward. Clipping by a
        # NaN norm makes every gradient NaN, so no setting of train.grad_clip helps.
        raise UserError(
            f"training diverged: the gradient norm is {grad_norm} at step {step} with a finite loss "
            f"({loss:.6g}): check the model and loss for an operation with no finite gradient at "
            "its input (sqrt or log of 0, a division by 0), or lower train.lr; the checkpoints "
            "before it are kept"
        )


def require_healthy(
    step: int, loss: float, grad_norm: float | None, grad_clip: float, precision: Precision
) -> None:
    """``require_finite`` for the step. Under fp16 the loss scaler skips a step of non-finite
    gradients itself (its norm is no divergence): the loss is checked, and that the scaler
    still lets updates through."""
    if not precision.skips_overflows:
        require_finite(step, loss, grad_norm, grad_clip)
        return
    require_finite(step, loss, None, grad_clip)
    skipped, skips = precision.skipped_steps, precision.skips  # (counted up to this step)
    in_a_row = skips.in_a_row
    backoff = precision.scaler.get_backoff_factor() if precision.scaler is not None else 0.5
    # skips.scale is the next scale to try: the last skipped step ran at scale / backoff
    if in_a_row >= MIN_SKIPS_IN_A_ROW and skips.scale is not None and skips.scale < backoff:
        raise UserError(
            f"training diverged: the gradient is not finite at any step from {step - in_a_row + 1} "
            f"to {step} ({in_a_row} in a row, {skipped} skipped in all): fp16's loss scaler "
            f"skipped their updates, down to a scale of {skips.scale:g}, so the run trains nothing; "
            "check the model and loss for an operation with no finite gradient at its input (sqrt "
            "or log of 0, a division by 0), or lower train.lr; the checkpoints before it are kept"
        )


def require_finite_weights(
    step: int, model: nn.Module, all_reduce_max: AllReduceMax | None, before_raising: Callable[[], None]
) -> None:
    """Before the checkpoint of a preemption or Ctrl-C, which comes after any step, not only a
    checked one: a non-finite gradient on an unchecked step writes NaN weights (clipped by a NaN
    norm, every gradient is NaN), and every restart would resume them. The weights themselves are
    checked, on every rank's own pieces and agreed over the ranks, at the stop only: one wait for
    the device there, none per step. ``before_raising``: the caller's grace timer is cancelled (it
    runs during the check: the agreement waits on every rank, and a rank gone would hold it)."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}  # (offloaded pieces are on the host)
    for param in model.parameters():
        piece = _own_piece(param).detach()
        by_device.setdefault(piece.device, []).append(piece.isfinite().all())
    finite = all(bool(torch.stack(flags).all()) for flags in by_device.values())
    if agree_any(int(not finite), all_reduce_max):
        before_raising()
        raise UserError(
            f"training diverged: the weights are not finite at step {step}, where the run stopped "
            "to checkpoint (a non-finite gradient since the last logged or saved step): not saved; "
            "lower train.lr, or check the model and loss for an operation with no finite gradient "
            "at its input (sqrt or log of 0, a division by 0); the checkpoints before it are kept"
        )


def _own_piece(param: torch.Tensor) -> torch.Tensor:
    """What of ``param`` this rank holds: an FSDP2 or tensor-parallel DTensor's local shard,
    DeepSpeed ZeRO-3's partition (``ds_tensor``: the parameter itself is left empty)."""
    if isinstance(param, DTensor):
        return param.to_local()
    partition = getattr(param, "ds_tensor", None)
    return partition if isinstance(partition, torch.Tensor) else param
