"""Automatic mixed precision: the GradScaler's scale without a wait for the device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hpcpipe.compat.guard import probe, require

_SCALE = "count the fp16 steps the GradScaler skipped without waiting for the device each step"


def grad_scaler_scale(scaler: torch.amp.GradScaler) -> torch.Tensor | None:
    """The scale as the device tensor ``update()`` writes in place; None before the scaler's first
    use. ``get_scale()`` returns a float, a wait for the device; ``_get_scale_async`` is what it
    reads, and there is no public equivalent."""
    scale: torch.Tensor | None = require(scaler, "_get_scale_async", _SCALE)()
    return scale


PRIVATE_APIS: dict[str, Callable[[], Any]] = {
    "amp.GradScaler._get_scale_async": probe(torch.amp.GradScaler, "_get_scale_async", purpose=_SCALE),
}
"""The private names this module reaches, each with a probe (``hpcpipe.compat.PRIVATE_APIS``)."""
