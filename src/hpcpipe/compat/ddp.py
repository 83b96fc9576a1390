"""DistributedDataParallel: resetting its reducer, its buffer-broadcast keyword."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from hpcpipe.compat.guard import TorchAPIError, probe, require


def ddp_reset_reducer(model: nn.Module) -> None:
    """Disarm DDP's reducer after a forward whose backward never came (OOM recovery).

    ``Reducer._reset_state`` is what DDP's own ``_update_process_group`` calls ("forward can
    run despite previous backward not succeeding"); there is no public equivalent.
    """
    reducer = require(model, "reducer", "reset DDP after an abandoned forward")
    require(reducer, "_reset_state", "reset DDP after an abandoned forward")()


def ddp_buffer_sync_kwargs(enabled: bool) -> dict[str, Any]:
    """DDP keyword that turns the per-forward buffer broadcast on or off, as this torch spells it.

    torch >= 2.14 calls it ``forward_sync_buffers`` (``broadcast_buffers`` is deprecated there).
    """
    params = inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
    if "forward_sync_buffers" in params:
        return {"forward_sync_buffers": enabled}
    if "broadcast_buffers" in params:
        return {"broadcast_buffers": enabled}
    raise TorchAPIError("DistributedDataParallel(forward_sync_buffers=...)", "control buffer broadcasts")


PRIVATE_APIS: dict[str, Callable[[], Any]] = {
    "Reducer._reset_state": probe(
        "torch._C._distributed_c10d",
        "Reducer",
        "_reset_state",
        purpose="reset DDP after an abandoned forward",
    ),
}
"""The private names this module reaches, each with a probe (``hpcpipe.compat.PRIVATE_APIS``)."""
