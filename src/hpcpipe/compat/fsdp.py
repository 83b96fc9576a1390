"""FSDP2 internals: resetting its per-iteration state after an abandoned forward, dropping
unsharded gradients."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from hpcpipe.compat.guard import TorchAPIError, require

_FSDP_RESET = "reset FSDP2 after an abandoned forward (OOM recovery)"


def _fsdp_state(module: nn.Module) -> Any:
    return require(module, "_get_fsdp_state", _FSDP_RESET)()


def _param_groups(state: Any) -> list[Any]:
    """The FSDPParamGroups of one FSDP state: a list since torch 2.14, one (or None) before."""
    if hasattr(state, "_fsdp_param_groups"):
        return list(state._fsdp_param_groups)
    group = require(state, "_fsdp_param_group", _FSDP_RESET)
    return [group] if group is not None else []


def fsdp_reset_iter_state(root: nn.Module) -> None:
    """Wait for in-flight collectives, reshard every unit, clear FSDP2's per-iteration state.

    Public ``FSDPModule.reset_iter_state`` on torch >= 2.14. Before that, the same reset done
    on the internals a forward leaves behind: every group back to IDLE and resharded (the
    OOMing rank's unfinished units are still unsharded while the other ranks' are not, so the
    retry's all-gathers would otherwise not match), and the root's iteration trackers cleared
    (a set ``iter_forward_root`` makes the next root pre-forward skip its stream waits).
    """
    public = getattr(root, "reset_iter_state", None)
    if public is not None:
        public()
        return
    training_state = require("torch.distributed.fsdp._fully_shard._fsdp_common", "TrainingState", _FSDP_RESET)
    root_state = _fsdp_state(root)
    state_ctx = require(root_state, "_state_ctx", _FSDP_RESET)
    for state in state_ctx.all_states:
        for group in _param_groups(state):
            group._training_state = training_state.IDLE  # IDLE: reshard() fully, not post-forward
            group._all_gather_result = None
            group.reshard()
            group._post_forward_indices.clear()
        state._training_state = training_state.IDLE
    comm_ctx = require(root_state, "_comm_ctx", _FSDP_RESET)
    comm_ctx.all_gather_state = None
    comm_ctx.reduce_scatter_state = None
    comm_ctx.post_forward_order.clear()
    state_ctx.iter_forward_root = None
    state_ctx.post_backward_final_callback_queued = False


def fsdp_can_reset_iter_state(root: nn.Module) -> bool:
    """Whether ``fsdp_reset_iter_state`` can reset this FSDP2 root on the installed torch."""
    if hasattr(root, "reset_iter_state"):
        return True
    try:
        _fsdp_state(root)
        importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_common")
    except (TorchAPIError, ImportError):
        return False
    return True


def _fsdp_params(model: nn.Module) -> Iterator[Any]:
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            for group in _param_groups(_fsdp_state(module)):
                yield from group.fsdp_params


def fsdp_drop_unsharded_grads(model: nn.Module) -> None:
    """Drop the unsharded gradients that abandoned ``no_sync`` micro-steps accumulated.

    ``model.zero_grad()`` sees only the sharded parameters. Where the gradient lives moved:
    torch < 2.15 keeps a separate ``unsharded_accumulated_grad`` buffer (reduce dtype) besides
    ``_unsharded_param.grad``; torch 2.15 accumulates on ``_unsharded_param.grad`` alone and
    made ``unsharded_accumulated_grad`` a read-only view of it.
    """
    for fsdp_param in _fsdp_params(model):
        spec = inspect.getattr_static(type(fsdp_param), "unsharded_accumulated_grad", None)
        if not isinstance(spec, property) and hasattr(fsdp_param, "unsharded_accumulated_grad"):
            fsdp_param.unsharded_accumulated_grad = None
        unsharded = getattr(fsdp_param, "_unsharded_param", None)  # absent before the 1st all-gather
        if unsharded is not None:
            unsharded.grad = None


def _private_fsdp_probe() -> None:
    """The FSDP2 internals ``fsdp_reset_iter_state`` (before 2.14) and the gradient drop use."""
    from torch.distributed.fsdp import FSDPModule

    require(FSDPModule, "_get_fsdp_state", _FSDP_RESET)
    if not hasattr(FSDPModule, "reset_iter_state"):
        require("torch.distributed.fsdp._fully_shard._fsdp_common", "TrainingState", _FSDP_RESET)


PRIVATE_APIS: dict[str, Callable[[], Any]] = {
    "FSDPModule._get_fsdp_state (+ TrainingState before 2.14)": _private_fsdp_probe,
}
"""The private names this module reaches, each with a probe (``hpcpipe.compat.PRIVATE_APIS``)."""
