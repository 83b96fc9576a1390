"""Every private or version-dependent torch API hpcpipe uses, behind feature detection, in one place.

torch moves its internals between releases; hpcpipe meets at least torch 2.11 (the GPU machines)
and 2.15 (a fresh install). Nothing outside this package names a torch attribute with a leading
underscore or asks which torch version is installed. Each entry point resolves what it needs
through ``guard.require``, so a torch that lacks it fails with ``TorchAPIError`` naming the torch
version and the missing attribute, not with an ``AttributeError`` deep inside a worker.

One module per area of torch: ``amp`` (the GradScaler's scale), ``ddp``, ``fsdp``, ``checkpoint``
(DCP and state-dict staging), ``collectives``, ``device`` (bf16 units, the CUDA allocator's
history), ``elastic`` (the agent and the c10d rendezvous) and ``c10d`` (stores). Callers import
from here, not from those modules.

``PRIVATE_APIS`` lists every private name reached from this package with a probe that resolves
it (each module lists its own); ``tests/unit/test_compat.py`` runs each probe against the
installed torch, so an upgrade that moves one fails there, by name, before a training run meets
it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcpipe.compat import amp, c10d, checkpoint, collectives, ddp, device, elastic, fsdp
from hpcpipe.compat.amp import grad_scaler_scale
from hpcpipe.compat.c10d import default_store, loopback_tcp_store, tcp_store_takes_listen_fd
from hpcpipe.compat.checkpoint import (
    copy_state_dict,
    create_cpu_state_dict,
    dcp_file_prefix,
    dcp_metadata_globals,
    dcp_metadata_path,
    dcp_set_element,
    dcp_storage_info,
)
from hpcpipe.compat.collectives import (
    functional_collective_ops,
    gather_into_tensor_fn,
    reduce_scatter_tensor_fn,
)
from hpcpipe.compat.ddp import ddp_buffer_sync_kwargs, ddp_reset_reducer
from hpcpipe.compat.device import cpu_has_native_bf16, dump_cuda_memory_snapshot, record_cuda_memory_history
from hpcpipe.compat.elastic import (
    KEEPALIVE_JOIN_S,
    elastic_agent_step,
    keepalive_timers_stop_cleanly,
    no_restart_after,
    quick_rendezvous,
    rendezvous_state_cache,
)
from hpcpipe.compat.fsdp import fsdp_can_reset_iter_state, fsdp_drop_unsharded_grads, fsdp_reset_iter_state
from hpcpipe.compat.guard import TorchAPIError

__all__ = [
    "KEEPALIVE_JOIN_S",
    "PRIVATE_APIS",
    "TorchAPIError",
    "copy_state_dict",
    "cpu_has_native_bf16",
    "create_cpu_state_dict",
    "dcp_file_prefix",
    "dcp_metadata_globals",
    "dcp_metadata_path",
    "dcp_set_element",
    "dcp_storage_info",
    "ddp_buffer_sync_kwargs",
    "ddp_reset_reducer",
    "default_store",
    "dump_cuda_memory_snapshot",
    "elastic_agent_step",
    "fsdp_can_reset_iter_state",
    "fsdp_drop_unsharded_grads",
    "fsdp_reset_iter_state",
    "functional_collective_ops",
    "gather_into_tensor_fn",
    "grad_scaler_scale",
    "keepalive_timers_stop_cleanly",
    "loopback_tcp_store",
    "no_restart_after",
    "quick_rendezvous",
    "record_cuda_memory_history",
    "reduce_scatter_tensor_fn",
    "rendezvous_state_cache",
    "tcp_store_takes_listen_fd",
]

PRIVATE_APIS: dict[str, Callable[[], Any]] = {
    name: probe
    for module in (amp, ddp, fsdp, checkpoint, collectives, device, elastic, c10d)
    for name, probe in module.PRIVATE_APIS.items()
}
"""Each private name reached from this package, with a probe that raises TorchAPIError without it."""
