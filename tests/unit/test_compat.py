"""hpcpipe.compat: every private torch API it lists resolves on the installed torch, each entry point
works on a live (1-rank gloo) DDP/FSDP2 model, and no other module reaches torch internals.

A torch upgrade that moves an internal fails here first, with the torch version and the
missing attribute in the message.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
import torch

from hpcpipe import compat

COMPAT = Path(compat.__file__).parent
SRC = COMPAT.parent

# Private names hpcpipe reaches on torch objects (not on its own): each must appear only in compat.
TORCH_PRIVATE_ATTRS = {
    "_reset_state",
    "_get_fsdp_state",
    "_fsdp_param_group",
    "_fsdp_param_groups",
    "_unsharded_param",
    "_state_ctx",
    "_comm_ctx",
    "_get_metadata_path",
    "_training_state",
    "_all_gather_result",
    "_post_forward_indices",
    "_is_mkldnn_bf16_supported",
    "_state_holder",
    "_cache_duration",
    "_get_scale_async",
}


@pytest.mark.parametrize("name", sorted(compat.PRIVATE_APIS))
def test_private_api_resolves_on_installed_torch(name: str) -> None:
    try:
        compat.PRIVATE_APIS[name]()
    except compat.TorchAPIError as exc:
        pytest.fail(f"{name}: {exc}")


def test_missing_api_names_torch_version_and_attribute() -> None:
    with pytest.raises(compat.TorchAPIError) as info:
        compat.guard.require(types.SimpleNamespace(), "_gone", "do a thing")
    message = str(info.value)
    assert f"torch {torch.__version__}" in message
    assert "SimpleNamespace._gone" in message and "do a thing" in message
    with pytest.raises(compat.TorchAPIError, match=r"module torch\.no_such_module"):
        compat.guard.require("torch.no_such_module", "x", "do a thing")


def test_ddp_reset_reducer_names_what_is_missing() -> None:
    class FakeDDP:
        reducer = types.SimpleNamespace()

    with pytest.raises(compat.TorchAPIError, match=r"SimpleNamespace\._reset_state"):
        compat.ddp_reset_reducer(FakeDDP())  # type: ignore[arg-type]


def test_ddp_buffer_sync_keyword_is_accepted_by_this_torch() -> None:
    import inspect

    (keyword,) = compat.ddp_buffer_sync_kwargs(False)
    assert keyword in inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters


def test_collective_functions_exist() -> None:
    import torch.distributed as dist

    assert compat.gather_into_tensor_fn() in {
        getattr(dist, "all_gather_single", None),
        dist.all_gather_into_tensor,
    }
    assert callable(compat.reduce_scatter_tensor_fn())


def test_grad_scaler_scale_is_the_device_tensor_update_lowers() -> None:
    scaler = torch.amp.GradScaler("cpu")
    assert compat.grad_scaler_scale(scaler) is None  # not used yet
    scaler.scale(torch.ones(()))
    scale = compat.grad_scaler_scale(scaler)
    assert isinstance(scale, torch.Tensor) and float(scale) == scaler.get_scale()


def test_cpu_staging_copies_values() -> None:
    state = {"w": torch.arange(6.0).reshape(2, 3), "nested": {"b": torch.ones(2)}, "step": 3}
    staged = compat.create_cpu_state_dict(state, pin_memory=False)
    state["w"].add_(1)
    out = compat.copy_state_dict(state, staged)
    assert out is staged or out == staged
    assert torch.equal(out["w"], state["w"]) and out["w"].data_ptr() != state["w"].data_ptr()
    assert torch.equal(out["nested"]["b"], torch.ones(2))


_LIVE = textwrap.dedent(
    """
    import os, sys, tempfile
    import torch, torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from hpcpipe import compat

    store = dist.FileStore(tempfile.mktemp(), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    torch.manual_seed(0)

    def tiny():
        return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    # FSDP2: a forward abandoned mid-way, a no_sync backward left behind; then reset and train.
    model = tiny()
    fully_shard(model[0]); fully_shard(model)
    x = torch.randn(3, 4)
    model.set_requires_gradient_sync(False)
    model(x).sum().backward()
    model(x)  # abandoned: no backward
    assert compat.fsdp_can_reset_iter_state(model)
    compat.fsdp_reset_iter_state(model)
    compat.fsdp_drop_unsharded_grads(model)
    for p in compat.fsdp._fsdp_params(model):
        assert getattr(p, "_unsharded_param", None) is None or p._unsharded_param.grad is None
    model.set_requires_gradient_sync(True)
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())

    # DDP: a forward whose backward never came, reducer reset, then a normal step.
    ddp = nn.parallel.DistributedDataParallel(tiny(), **compat.ddp_buffer_sync_kwargs(False))
    ddp(x)
    compat.ddp_reset_reducer(ddp)
    ddp(x).sum().backward()
    print("live-ok", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
    """
)


@pytest.mark.timeout(120)
def test_entry_points_work_on_live_fsdp2_and_ddp_models() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _LIVE], capture_output=True, text=True, timeout=100, check=False
    )
    assert "live-ok" in done.stdout, done.stderr[-3000:]


# The private names compat probes, spelled as strings elsewhere (an unpickler's allow-list named
# DCP's metadata globals so, unprobed).
_PROBED_PRIVATE_NAMES = {name for key in compat.PRIVATE_APIS for name in re.findall(r"\b_[A-Za-z]\w*", key)}


def _private_torch_uses(path: Path) -> list[str]:
    """``from torch.x._y import ...``, ``import torch._x``, ``torch.a._b`` and known private attrs."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
            names = [node.module or "", *(a.name for a in node.names)]
            if any(part.startswith("_") for name in names for part in name.split(".")):
                found.append(f"{path.name}:{node.lineno} from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [
                f"{path.name}:{node.lineno} import {a.name}"
                for a in node.names
                if a.name.startswith("torch.") and any(p.startswith("_") for p in a.name.split("."))
            ]
        elif isinstance(node, ast.Constant) and node.value in _PROBED_PRIVATE_NAMES:  # looked up by name
            found.append(f"{path.name}:{node.lineno} {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr in TORCH_PRIVATE_ATTRS:
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in {"torch", "dist", "dcp"}:
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_private_torch_api_outside_compat() -> None:
    offenders = [
        use
        for path in sorted(SRC.rglob("*.py"))
        if COMPAT not in path.parents
        for use in _private_torch_uses(path)
    ]
    assert offenders == [], "private torch APIs belong in hpcpipe/compat/: " + ", ".join(offenders)


def test_every_module_that_reaches_torch_internals_lists_them_in_private_apis() -> None:
    """Each area module keeps its own PRIVATE_APIS and the package's is their union: a module added
    without its list, or left out of the union, fails here."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules([str(COMPAT)]):
        module = importlib.import_module(f"hpcpipe.compat.{info.name}")
        if info.name == "guard":  # the resolver itself reaches nothing
            continue
        listed = getattr(module, "PRIVATE_APIS", None)
        assert listed, f"hpcpipe/compat/{info.name}.py lists no PRIVATE_APIS (every area module reaches some)"
        assert set(listed) <= set(compat.PRIVATE_APIS), f"{info.name}'s PRIVATE_APIS is not gathered"


def test_the_scan_finds_private_uses(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from torch.distributed._state_dict_utils import _copy_state_dict\n"
        "import torch._dynamo\n"
        "x = torch.distributed._functional_collectives\n"
        "model._get_fsdp_state()\n"
        "allowed = {'torch.serialization': {'_get_layout'}}\n"
    )
    assert len(_private_torch_uses(sample)) == 5


def _stop_keepalive_from_its_own_thread() -> BaseException | None:
    """Start a rendezvous keep-alive timer whose first tick stops the timer itself, as its
    finalizer does when the handler is garbage-collected on that thread; what the stop raised."""
    from datetime import timedelta

    from torch.distributed.elastic.rendezvous.utils import _PeriodicTimer

    raised: list[BaseException | None] = []

    def tick() -> None:
        if not raised:
            try:
                timer.cancel()  # runs the finalizer: set the stop event, join the thread
                raised.append(None)
            except RuntimeError as exc:
                raised.append(exc)

    timer = _PeriodicTimer(timedelta(milliseconds=5), tick)
    timer.start()
    deadline = time.monotonic() + 5
    while not raised and time.monotonic() < deadline:
        time.sleep(0.01)
    timer._ctx.stop_event.set()  # end the thread whatever happened
    assert raised, "the keep-alive timer never ticked"
    return raised[0]


def test_keepalive_timer_stopped_on_its_own_thread_raises_in_torch_but_not_under_the_guard() -> None:
    """The CI flake behind it: a SIGTERM on 2 local ranks ended with 'Exception ignored in:
    <finalize ...> RuntimeError: cannot join current thread' under the one-line ending."""
    unguarded = _stop_keepalive_from_its_own_thread()
    assert isinstance(unguarded, RuntimeError) and "join current thread" in str(unguarded)
    with compat.keepalive_timers_stop_cleanly():
        assert _stop_keepalive_from_its_own_thread() is None
    assert isinstance(_stop_keepalive_from_its_own_thread(), RuntimeError), "the guard is undone"


def test_keepalive_timers_started_in_the_guard_are_stopped_when_it_ends() -> None:
    """After a signal torch leaves the rendezvous handler open, and its daemon keep-alive thread,
    caught in a store call as the interpreter finalized, aborted a Ctrl-C'd launcher (-6, CI)."""
    from datetime import timedelta

    from torch.distributed.elastic.rendezvous.utils import _PeriodicTimer

    ticks: list[int] = []
    outside = _PeriodicTimer(timedelta(milliseconds=5), lambda: None)
    outside.start()
    with compat.keepalive_timers_stop_cleanly():
        inside = _PeriodicTimer(timedelta(milliseconds=5), lambda: ticks.append(1))
        inside.start()
        deadline = time.monotonic() + 5
        while not ticks and time.monotonic() < deadline:
            time.sleep(0.01)
    assert ticks, "the keep-alive timer never ticked"
    assert not inside._thread.is_alive(), "the guard's end stops what started in it"
    assert outside._thread.is_alive(), "a timer started before the guard is not its business"
    outside.cancel()
    assert _PeriodicTimer.start.__qualname__ == "_PeriodicTimer.start", "the guard is undone"


def test_quick_rendezvous_polls_a_round_every_poll_s_and_keeps_the_join_jitter_of_several_nodes() -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    torch_delay = rdzv._delay
    with compat.quick_rendezvous(one_node=False, poll_s=0.02):
        started = time.perf_counter()
        rdzv._delay(seconds=1)  # the 1 s wait between two reads of a round: poll_s instead
        assert time.perf_counter() - started < 0.5
        started = time.perf_counter()
        rdzv._delay(seconds=(0.1, 0.12))  # several nodes: the random join jitter stays
        assert time.perf_counter() - started >= 0.09
    assert rdzv._delay is torch_delay
    with compat.quick_rendezvous(one_node=True, poll_s=0.02):
        started = time.perf_counter()
        rdzv._delay(seconds=(0.5, 0.6))
        rdzv._delay(seconds=1)
        assert time.perf_counter() - started < 0.5
    assert rdzv._delay is torch_delay


def test_rendezvous_state_cache_sets_the_handler_s_and_skips_a_handler_without_one() -> None:
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    store = TCPStore("127.0.0.1", 0, None, True)
    handler = DynamicRendezvousHandler.from_backend(
        "cache", store, C10dRendezvousBackend(store, "cache"), 1, 1
    )
    assert compat.rendezvous_state_cache(handler, 0.1)
    assert handler._state_holder._cache_duration == 0.1
    assert not compat.rendezvous_state_cache(types.SimpleNamespace(), 0.1)
