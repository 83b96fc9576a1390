"""Every private or version-dependent torch API hpcpipe uses, behind feature detection, in one place.

torch moves its internals between releases; hpcpipe meets at least torch 2.11 (the GPU machines)
and 2.15 (a fresh install). Nothing outside this module names a torch attribute with a leading
underscore or asks which torch version is installed. Each entry point resolves what it needs
through ``_require``, so a torch that lacks it fails with ``TorchAPIError`` naming the torch
version and the missing attribute, not with an ``AttributeError`` deep inside a worker.

``PRIVATE_APIS`` lists every private name reached from here with a probe that resolves it;
``tests/unit/test_compat.py`` runs each probe against the installed torch, so an upgrade that
moves one fails there, by name, before a training run meets it.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, cast

import torch
from torch import nn

__all__ = [
    "PRIVATE_APIS",
    "TorchAPIError",
    "copy_state_dict",
    "cpu_has_native_bf16",
    "create_cpu_state_dict",
    "dcp_file_prefix",
    "dcp_metadata_path",
    "dcp_set_element",
    "dcp_storage_info",
    "ddp_buffer_sync_kwargs",
    "ddp_reset_reducer",
    "default_store",
    "dump_cuda_memory_snapshot",
    "elastic_agent_step",
    "fsdp_drop_unsharded_grads",
    "fsdp_reset_iter_state",
    "functional_collective_ops",
    "gather_into_tensor_fn",
    "keepalive_timers_stop_cleanly",
    "loopback_tcp_store",
    "quick_rendezvous",
    "record_cuda_memory_history",
    "reduce_scatter_tensor_fn",
    "rendezvous_state_cache",
    "tcp_store_takes_listen_fd",
]


class TorchAPIError(RuntimeError):
    """The installed torch lacks an API hpcpipe relies on (raised with both named)."""

    def __init__(self, missing: str, purpose: str) -> None:
        super().__init__(
            f"torch {torch.__version__} has no {missing} (hpcpipe uses it to {purpose}); "
            "install a torch version hpcpipe was tested with (see docs/install.md)"
        )
        self.missing = missing


def _require(owner: Any, name: str, purpose: str) -> Any:
    """``owner.name`` (``owner`` a module path, module, class or object) or TorchAPIError."""
    where = owner if isinstance(owner, str) else getattr(owner, "__name__", type(owner).__qualname__)
    try:
        target = importlib.import_module(owner) if isinstance(owner, str) else owner
    except ImportError:
        raise TorchAPIError(f"module {owner}", purpose) from None
    try:
        return getattr(target, name)
    except AttributeError:
        raise TorchAPIError(f"{where}.{name}", purpose) from None


# -- DDP ------------------------------------------------------------------------------------------


def ddp_reset_reducer(model: nn.Module) -> None:
    """Disarm DDP's reducer after a forward whose backward never came (OOM recovery).

    ``Reducer._reset_state`` is what DDP's own ``_update_process_group`` calls ("forward can
    run despite previous backward not succeeding"); there is no public equivalent.
    """
    reducer = _require(model, "reducer", "reset DDP after an abandoned forward")
    _require(reducer, "_reset_state", "reset DDP after an abandoned forward")()


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


# -- FSDP2 ----------------------------------------------------------------------------------------

_FSDP_RESET = "reset FSDP2 after an abandoned forward (OOM recovery)"


def _fsdp_state(module: nn.Module) -> Any:
    return _require(module, "_get_fsdp_state", _FSDP_RESET)()


def _param_groups(state: Any) -> list[Any]:
    """The FSDPParamGroups of one FSDP state: a list since torch 2.14, one (or None) before."""
    if hasattr(state, "_fsdp_param_groups"):
        return list(state._fsdp_param_groups)
    group = _require(state, "_fsdp_param_group", _FSDP_RESET)
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
    training_state = _require(
        "torch.distributed.fsdp._fully_shard._fsdp_common", "TrainingState", _FSDP_RESET
    )
    root_state = _fsdp_state(root)
    state_ctx = _require(root_state, "_state_ctx", _FSDP_RESET)
    for state in state_ctx.all_states:
        for group in _param_groups(state):
            group._training_state = training_state.IDLE  # IDLE: reshard() fully, not post-forward
            group._all_gather_result = None
            group.reshard()
            group._post_forward_indices.clear()
        state._training_state = training_state.IDLE
    comm_ctx = _require(root_state, "_comm_ctx", _FSDP_RESET)
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


# -- distributed checkpoint (DCP) and state dicts -------------------------------------------------


def dcp_set_element(root: Any, path: Any, value: Any) -> None:
    """Put ``value`` at ``path`` of a nested state dict, as DCP's default load planner does."""
    _require("torch.distributed.checkpoint._traverse", "set_element", "load non-tensor checkpoint items")(
        root, path, value
    )


def dcp_metadata_path(reader: Any, rank: int | None) -> Any:
    """Where a ``FileSystemReader`` reads ``.metadata`` from (per rank on newer torch)."""
    return _require(reader, "_get_metadata_path", "read checkpoint metadata safely")(rank)


_RAW = "write tensors as raw bytes into checkpoint files"


def dcp_file_prefix(plan: Any) -> str:
    """The file-name prefix (``__<rank>_``) ``FileSystemWriter.prepare_global_plan`` gave this
    rank's save plan (a private ``_StoragePrefix`` in its ``storage_data``)."""
    return str(_require(plan.storage_data, "prefix", _RAW))


def dcp_storage_info(relative_path: str, offset: int, length: int) -> Any:
    """DCP's record of where one item lies in a file (``FileSystemReader`` metadata)."""
    info = _require("torch.distributed.checkpoint.filesystem", "_StorageInfo", _RAW)
    return info(relative_path, offset, length)


_STAGE = "stage asynchronous checkpoints"


def create_cpu_state_dict(state: dict[str, Any], pin_memory: bool) -> dict[str, Any]:
    """A CPU copy of ``state``'s layout (pinned when asked): the async checkpoint staging buffer."""
    fn = _require("torch.distributed._state_dict_utils", "_create_cpu_state_dict", _STAGE)
    return cast(dict[str, Any], fn(state, pin_memory=pin_memory))


def copy_state_dict(state: dict[str, Any], staged: dict[str, Any]) -> dict[str, Any]:
    """Copy ``state`` into the buffer made by ``create_cpu_state_dict``; returns the buffer."""
    fn = _require("torch.distributed._state_dict_utils", "_copy_state_dict", _STAGE)
    return cast(dict[str, Any], fn(state, staged))


# -- collectives ----------------------------------------------------------------------------------


def gather_into_tensor_fn() -> Callable[..., Any]:
    """all_gather into one tensor: ``all_gather_single`` where torch has it (2.14+)."""
    import torch.distributed as dist

    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def reduce_scatter_tensor_fn() -> Callable[..., Any]:
    """reduce_scatter from one tensor: ``reduce_scatter_single`` where torch has it (2.14+)."""
    import torch.distributed as dist

    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def functional_collective_ops() -> list[Any]:
    """The aten-level ops of the functional collectives (``torch.ops._c10d_functional``) that
    tensor parallelism issues inside a block: all-gather, reduce-scatter, all-reduce; the ones this
    torch has (selective activation checkpointing keeps their outputs)."""
    namespace = torch.ops._c10d_functional
    names = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")
    return [getattr(namespace, name).default for name in names if hasattr(namespace, name)]


# -- device capabilities -------------------------------------------------------------------------

_BF16 = "tell whether this CPU multiplies bf16 matrices in hardware (model.base_dtype auto)"


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN runs bf16 matmuls on this CPU's own bf16 units (AVX512-BF16 or AMX).

    Without them torch falls back to a reference kernel: 1.2 GFLOP/s against ~100 for fp32 on
    this project's 2-core AVX2 machine. torch has no public query; its CPU autocast tests use
    this one. A torch without it answers False: fp32 is never the slow choice.
    """
    try:
        supported = _require(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", _BF16)
    except (TorchAPIError, RuntimeError):  # an op namespace raises RuntimeError, not AttributeError
        return False
    return bool(torch.backends.mkldnn.is_available() and supported())


# -- the inventory the tests pin ------------------------------------------------------------------


def _private_fsdp_probe() -> None:
    """The FSDP2 internals ``fsdp_reset_iter_state`` (before 2.14) and the gradient drop use."""
    from torch.distributed.fsdp import FSDPModule

    _require(FSDPModule, "_get_fsdp_state", _FSDP_RESET)
    if not hasattr(FSDPModule, "reset_iter_state"):
        _require("torch.distributed.fsdp._fully_shard._fsdp_common", "TrainingState", _FSDP_RESET)


def _probe(owner: Any, *names: str, purpose: str) -> Callable[[], Any]:
    """A probe resolving ``owner.names[0].names[1]...`` (each step through ``_require``)."""

    def probe() -> Any:
        target = owner
        for name in names:
            target = _require(target, name, purpose)
        return target

    return probe


# -- CUDA memory snapshots (observe.profile.memory) ------------------------------------------------

_MEMORY = "record and dump CUDA allocator history (observe.profile.memory)"


def record_cuda_memory_history(enabled: bool, max_entries: int = 100_000) -> None:
    """Start (or stop) recording every CUDA allocation with its stack, for a snapshot later."""
    record = _require("torch.cuda.memory", "_record_memory_history", _MEMORY)
    record("all" if enabled else None, max_entries=max_entries)


def dump_cuda_memory_snapshot(path: str) -> None:
    """Write the recorded history as a pickle that pytorch.org/memory_viz opens (our own output:
    hpcpipe never loads it)."""
    _require("torch.cuda.memory", "_dump_snapshot", _MEMORY)(path)


# -- the elastic agent's metrics (launch/agent_timeline.py) ---------------------------------------

_AGENT = "time the elastic agent's restarts (agent_restart events)"
# torch's agent times these methods with ``@metrics.prof``: each call ends with a
# ``<Class>.<method>.duration.ms`` metric in the ``torchelastic`` group. The metric names are
# public output, but they spell private method names, so they are read here only.
ELASTIC_AGENT_STEPS = {
    "_monitor_workers": "poll",
    "_stop_workers": "stop",
    "_rendezvous": "rendezvous",
    "_start_workers": "start",
    "_restart_workers": "restart",
}


def elastic_agent_step(metric_name: str) -> str | None:
    """The step of torch's elastic agent whose end a ``torchelastic`` metric reports ("poll",
    "stop", "rendezvous", "start", "restart"), or None for any other metric."""
    if not metric_name.endswith(".duration.ms"):
        return None
    method = metric_name.removesuffix(".duration.ms").rsplit(".", 1)[-1]
    return ELASTIC_AGENT_STEPS.get(method)


def _elastic_agent_probe() -> None:
    """Each method ``elastic_agent_step`` names exists on torch's agent and is ``@prof``-timed."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    for method in ELASTIC_AGENT_STEPS:
        if not hasattr(_require(LocalElasticAgent, method, _AGENT), "__wrapped__"):
            raise TorchAPIError(f"@metrics.prof on LocalElasticAgent.{method}", _AGENT)


_RENDEZVOUS = "make torch's c10d rendezvous rounds cheaper (quick_rendezvous)"
_DYNAMIC_RENDEZVOUS = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"


def _method_name(depth: int = 2) -> str:
    """``dynamic_rendezvous.get_method_name``: the name of the function ``depth`` frames above."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # the stack is not that deep
        return "no_method_name"


def _rendezvous_probe() -> None:
    """The two helpers ``quick_rendezvous`` replaces exist where it looks for them."""
    for name in ("_delay", "get_method_name"):
        _require(_DYNAMIC_RENDEZVOUS, name, _RENDEZVOUS)


@contextlib.contextmanager
def quick_rendezvous(one_node: bool, poll_s: float | None = None) -> Iterator[None]:
    """While the block runs, torch's c10d rendezvous (``dynamic_rendezvous``) skips what costs a
    restart time and buys nothing; where torch has no such helper, that part stays as it is.

    - Each step it records is named with ``get_method_name``, which builds ``inspect.stack()``
      twice: that reads every frame's source and scans ``sys.modules`` once per frame, about
      70 ms per round (and per 5 s heartbeat) in an agent that imported torch and the trainer.
      The frame chain gives the same name.
    - ``one_node``: its handler sleeps a random 0-0.3 s before it joins while its round is still 0
      (the first start, and again the first restart: the round advances only when the next one
      is joined), so that many nodes do not reach the store at once, and backs off a random
      time after a lost compare-and-set. A one-node job has no other node to spread out from or
      to race: the random (range) form of its sleep helper, ``_delay``, returns at once.
    - ``poll_s``: a node waiting in a round (for a lost node's heartbeats to expire, for its
      last call to end) reads the store again after a fixed 1 s sleep, the only fixed form of
      ``_delay``; it sleeps ``poll_s`` instead (with ``rendezvous_state_cache`` at the same
      value, or the handler serves its cached state in between). Meant for a loopback store,
      where a read costs well under a millisecond; other fixed waits stay.
    """
    module = importlib.import_module(_DYNAMIC_RENDEZVOUS)
    replaced: dict[str, Callable[..., Any]] = {"get_method_name": _method_name}
    original_delay = getattr(module, "_delay", None)
    if (one_node or poll_s is not None) and original_delay is not None:

        def delay(seconds: float | tuple[float, float]) -> None:
            if isinstance(seconds, tuple):
                if not one_node:
                    original_delay(seconds)
            else:
                original_delay(seconds if poll_s is None else min(seconds, poll_s))

        replaced["_delay"] = delay
    originals = {name: getattr(module, name) for name in replaced if hasattr(module, name)}
    for name in originals:
        setattr(module, name, replaced[name])
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(module, name, original)


_STATE_HOLDER = "_BackendRendezvousStateHolder"


def rendezvous_state_cache(handler: Any, seconds: float) -> bool:
    """Make torch's c10d rendezvous handler read the store again once its copy of the rendezvous
    state is ``seconds`` old (torch: 1 s; each read within that serves the copy). Returns whether
    this torch's handler has that cache to set (False: it keeps its own, nothing else changes)."""
    holder = getattr(handler, "_state_holder", None)
    if holder is None or not hasattr(holder, "_cache_duration"):
        return False
    holder._cache_duration = seconds
    return True


def _rendezvous_cache_probe() -> None:
    """The handler keeps its state holder where ``rendezvous_state_cache`` looks, and that holder
    takes a cache duration (torch's ``from_backend`` builds it with the default, 1 s)."""
    holder = _require(_DYNAMIC_RENDEZVOUS, _STATE_HOLDER, _RENDEZVOUS)
    if "cache_duration" not in inspect.signature(holder.__init__).parameters:
        raise TorchAPIError(f"{_STATE_HOLDER}(cache_duration=...)", _RENDEZVOUS)
    handler = _require(_DYNAMIC_RENDEZVOUS, "DynamicRendezvousHandler", _RENDEZVOUS)
    if "_state_holder" not in getattr(handler, "__annotations__", {}):
        raise TorchAPIError("DynamicRendezvousHandler._state_holder", _RENDEZVOUS)


_KEEPALIVE = "stop the rendezvous keep-alive timer without a traceback (keepalive_timers_stop_cleanly)"
_RENDEZVOUS_UTILS = "torch.distributed.elastic.rendezvous.utils"


def _keepalive_timer_probe() -> Any:
    timer = _require(_RENDEZVOUS_UTILS, "_PeriodicTimer", _KEEPALIVE)
    _require(timer, "_stop_thread", _KEEPALIVE)
    for owner, field in (
        (timer, "_thread"),
        (timer, "_ctx"),
        (getattr(timer, "_Context", None), "stop_event"),
    ):
        if field not in getattr(owner, "__annotations__", {}):  # set in __init__: declared on the class
            raise TorchAPIError(f"_PeriodicTimer.{field}", _KEEPALIVE)
    return timer


# How long the end of keepalive_timers_stop_cleanly waits for a keep-alive thread in a store call
# (a healthy store answers in milliseconds; a vanished remote one may hold it to its read timeout).
KEEPALIVE_JOIN_S = 5.0


@contextlib.contextmanager
def keepalive_timers_stop_cleanly() -> Iterator[None]:
    """Timers started while the block runs stop without joining themselves, and are all stopped
    when it ends.

    The c10d rendezvous handler keeps its lease alive with a ``_PeriodicTimer`` whose
    ``weakref.finalize`` sets the stop event and joins the timer's thread. When the handler is
    garbage-collected on that very thread (a GC pass the timer's own allocations start, seen after
    a SIGTERM on 2 local ranks), ``join`` raises "cannot join current thread" and the finalizer
    prints a traceback under the run's one-line ending. Setting the event is all that thread needs:
    it ends at its next wait. The finalizer captures the function when the timer starts, so timers
    started inside the block keep the safe stop after it ends.

    After a signal torch's launcher leaves the handler open (another node may still scale the
    job), so its daemon timer thread ran on into interpreter exit. A thread that comes back from a
    store call (C++, GIL released) while the interpreter finalizes is ended by ``pthread_exit``,
    whose unwinding through pybind11's noexcept GIL guard aborts the process: "terminate called
    without an active exception", exit -6 after the launcher's own one line (seen once in CI on a
    Ctrl-C of 2 local ranks; 14 of 15 exits in a loop that calls the store every 0.1 ms). So the
    block's end stops them, as the process's exit would have, and waits for each to leave its
    call: ``KEEPALIVE_JOIN_S`` at most.
    """
    timer = getattr(importlib.import_module(_RENDEZVOUS_UTILS), "_PeriodicTimer", None)
    original = getattr(timer, "_stop_thread", None)
    original_start = getattr(timer, "start", None)
    if timer is None or original is None or original_start is None:  # another torch
        yield
        return
    started: list[tuple[threading.Thread, threading.Event]] = []

    def stop_thread(thread: Any, stop_event: Any) -> None:
        if thread is threading.current_thread():
            stop_event.set()
        else:
            original(thread, stop_event)

    def start(self: Any) -> None:
        original_start(self)
        thread, stop_event = (
            getattr(self, "_thread", None),
            getattr(getattr(self, "_ctx", None), "stop_event", None),
        )
        if isinstance(thread, threading.Thread) and isinstance(stop_event, threading.Event):
            started.append((thread, stop_event))

    timer._stop_thread = staticmethod(stop_thread)
    timer.start = start
    try:
        yield
    finally:
        timer._stop_thread = staticmethod(original)
        timer.start = original_start
        for thread, stop_event in started:
            stop_event.set()
            if thread is not threading.current_thread():
                thread.join(KEEPALIVE_JOIN_S)


_PEERS = "share each rank's progress for hang reports"

PRIVATE_APIS: dict[str, Callable[[], Any]] = {
    "Reducer._reset_state": _probe(
        "torch._C._distributed_c10d",
        "Reducer",
        "_reset_state",
        purpose="reset DDP after an abandoned forward",
    ),
    "FSDPModule._get_fsdp_state (+ TrainingState before 2.14)": _private_fsdp_probe,
    "checkpoint._traverse.set_element": _probe(
        "torch.distributed.checkpoint._traverse", "set_element", purpose="load non-tensor checkpoint items"
    ),
    "FileSystemReader._get_metadata_path": _probe(
        "torch.distributed.checkpoint",
        "FileSystemReader",
        "_get_metadata_path",
        purpose="read checkpoint metadata safely",
    ),
    "checkpoint.filesystem._StorageInfo": _probe(
        "torch.distributed.checkpoint.filesystem", "_StorageInfo", purpose=_RAW
    ),
    "checkpoint.filesystem._StoragePrefix.prefix": _probe(
        "torch.distributed.checkpoint.filesystem", "_StoragePrefix", "__dataclass_fields__", purpose=_RAW
    ),
    "_state_dict_utils._create_cpu_state_dict": _probe(
        "torch.distributed._state_dict_utils", "_create_cpu_state_dict", purpose=_STAGE
    ),
    "_state_dict_utils._copy_state_dict": _probe(
        "torch.distributed._state_dict_utils", "_copy_state_dict", purpose=_STAGE
    ),
    "cuda.memory._record_memory_history": _probe(
        "torch.cuda.memory", "_record_memory_history", purpose=_MEMORY
    ),
    "cuda.memory._dump_snapshot": _probe("torch.cuda.memory", "_dump_snapshot", purpose=_MEMORY),
    "distributed_c10d._get_default_store": _probe(
        "torch.distributed.distributed_c10d", "_get_default_store", purpose=_PEERS
    ),
    "LocalElasticAgent._monitor_workers/_stop_workers/... (@prof metrics)": _elastic_agent_probe,
    "rendezvous.dynamic_rendezvous._delay, get_method_name": _rendezvous_probe,
    "rendezvous.dynamic_rendezvous._BackendRendezvousStateHolder._cache_duration": _rendezvous_cache_probe,
    "rendezvous.utils._PeriodicTimer._stop_thread, _thread, _ctx.stop_event": _keepalive_timer_probe,
    "ops._c10d_functional (all_gather_into_tensor, reduce_scatter_tensor, all_reduce)": _probe(
        torch.ops, "_c10d_functional", "all_reduce", purpose="keep collectives in selective checkpointing"
    ),
    "ops.mkldnn._is_mkldnn_bf16_supported": _probe(
        torch.ops.mkldnn, "_is_mkldnn_bf16_supported", purpose=_BF16
    ),
}
"""Each private name reached from this module, with a probe that raises TorchAPIError without it."""


# -- c10d ------------------------------------------------------------------------------------------


def default_store() -> Any:
    """The key-value store of the default process group (rank 0 serves it under env:// init)."""
    import torch.distributed.distributed_c10d as c10d

    return _require(c10d, "_get_default_store", _PEERS)()


def tcp_store_takes_listen_fd() -> bool:
    """Whether this torch's ``TCPStore`` serves on a socket its caller bound (``master_listen_fd``)."""
    import torch.distributed as dist

    return "master_listen_fd" in (dist.TCPStore.__init__.__doc__ or "")


def loopback_tcp_store(
    host: str, port: int, world_size: int | None, timeout: timedelta, multi_tenant: bool = False
) -> Any:
    """A ``TCPStore`` server that listens on ``host`` alone (a loopback address); ``port`` 0 takes
    any free port (the store's ``.port`` says which). OSError if ``host:port`` is taken.

    torch's server binds every interface whatever ``host_name`` says (measured on 2.15: ``[::]``,
    with and without libuv), and no argument names the address. Handed a socket already bound
    and listening (``master_listen_fd``) it serves there instead, and owns the descriptor from
    then on. A torch without that argument gets its usual server, on every interface."""
    import torch.distributed as dist

    use_libuv = os.environ.get("USE_LIBUV", "1") == "1"  # as torch reads it for env:// stores
    if not tcp_store_takes_listen_fd():
        logging.getLogger(__name__).warning(
            "torch %s's TCPStore takes no listening socket: its store listens on every interface",
            torch.__version__,
        )
        return dist.TCPStore(host, port, world_size, True, timeout, multi_tenant=multi_tenant)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own listener
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
        store = dist.TCPStore(
            host,
            sock.getsockname()[1],
            world_size,
            True,
            timeout,
            multi_tenant=multi_tenant,
            master_listen_fd=sock.fileno(),
            use_libuv=use_libuv,
        )
    except BaseException:
        with contextlib.suppress(OSError):
            sock.close()
        raise
    sock.detach()  # the store closes it: a second close could hit a descriptor reused meanwhile
    return store
