"""torch's elastic agent and c10d rendezvous: its metric names, cheaper rounds, a clean stop of
its keep-alive timers."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from hpcpipe.compat.guard import TorchAPIError, require

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
        if not hasattr(require(LocalElasticAgent, method, _AGENT), "__wrapped__"):
            raise TorchAPIError(f"@metrics.prof on LocalElasticAgent.{method}", _AGENT)


_NO_RESTART = "end a worker group without restarts once a worker's exit says a restart cannot help"


def _no_restart_probe() -> None:
    """The agent's poll exists, and its restart budget is the attribute ``no_restart_after`` zeroes."""
    import inspect

    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    require(LocalElasticAgent, "_monitor_workers", _NO_RESTART)
    try:
        source = inspect.getsource(SimpleElasticAgent)
    except (OSError, TypeError):  # torch installed without its .py sources
        what = "SimpleElasticAgent's source (to find _remaining_restarts)"
        raise TorchAPIError(what, _NO_RESTART) from None
    if "self._remaining_restarts" not in source:
        raise TorchAPIError("SimpleElasticAgent._remaining_restarts", _NO_RESTART)


@contextlib.contextmanager
def no_restart_after(codes: frozenset[int], reported: Callable[[int], int] | None = None) -> Iterator[None]:
    """While the block runs, torch's local agent stops its group instead of restarting it when a
    failed worker exited with one of ``codes``: torch restarts on any non-zero exit, and a user
    error (2), a preemption checkpoint (75), a pruned trial (76) or Ctrl-C (130) comes back the
    same on every attempt, or is an answer, not a failure. The group then ends with that failure
    (the agent reports it as without restarts).

    ``reported(pid)``: a worker's exit code as it reported it itself (0 when it did not). torch's
    multiprocessing context records one failed worker, whichever its join finds first: often a
    victim (exit 4, its peer gone) rather than the rank whose user error (2) caused it. The
    failures of every worker that reported one are added, so that the decision here and the
    agent's report see them all."""
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    _no_restart_probe()
    poll = LocalElasticAgent._monitor_workers

    def monitor(self: Any, worker_group: Any) -> Any:
        result = poll(self, worker_group)
        if result.state != WorkerState.FAILED:
            return result
        if reported is not None:
            _add_reported_failures(result.failures, worker_group.workers, reported)
        if any(failure.exitcode in codes for failure in result.failures.values()):
            self._remaining_restarts = 0
        return result

    LocalElasticAgent._monitor_workers = monitor  # type: ignore[method-assign]
    try:
        yield
    finally:
        LocalElasticAgent._monitor_workers = poll  # type: ignore[method-assign]


def _add_reported_failures(
    failures: dict[int, Any], workers: list[Any], reported: Callable[[int], int]
) -> None:
    """``failures`` (global rank -> ProcessFailure) with every worker that reported a non-zero
    exit and is not in it yet (``worker.id`` is its pid in torch's local agent)."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    for worker in workers:
        if worker.global_rank in failures or worker.id is None:
            continue
        code = reported(int(worker.id))
        if code != 0:
            failures[worker.global_rank] = ProcessFailure(
                local_rank=worker.local_rank, pid=int(worker.id), exitcode=code, error_file=""
            )


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
        require(_DYNAMIC_RENDEZVOUS, name, _RENDEZVOUS)


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
    holder = require(_DYNAMIC_RENDEZVOUS, _STATE_HOLDER, _RENDEZVOUS)
    if "cache_duration" not in inspect.signature(holder.__init__).parameters:
        raise TorchAPIError(f"{_STATE_HOLDER}(cache_duration=...)", _RENDEZVOUS)
    handler = require(_DYNAMIC_RENDEZVOUS, "DynamicRendezvousHandler", _RENDEZVOUS)
    if "_state_holder" not in getattr(handler, "__annotations__", {}):
        raise TorchAPIError("DynamicRendezvousHandler._state_holder", _RENDEZVOUS)


_KEEPALIVE = "stop the rendezvous keep-alive timer without a traceback (keepalive_timers_stop_cleanly)"
_RENDEZVOUS_UTILS = "torch.distributed.elastic.rendezvous.utils"


def _keepalive_timer_probe() -> Any:
    timer = require(_RENDEZVOUS_UTILS, "_PeriodicTimer", _KEEPALIVE)
    require(timer, "_stop_thread", _KEEPALIVE)
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


PRIVATE_APIS: dict[str, Callable[[], Any]] = {
    "LocalElasticAgent._monitor_workers/_stop_workers/... (@prof metrics)": _elastic_agent_probe,
    "rendezvous.dynamic_rendezvous._delay, get_method_name": _rendezvous_probe,
    "rendezvous.dynamic_rendezvous._BackendRendezvousStateHolder._cache_duration": _rendezvous_cache_probe,
    "rendezvous.utils._PeriodicTimer._stop_thread, _thread, _ctx.stop_event": _keepalive_timer_probe,
    "SimpleElasticAgent._remaining_restarts, LocalElasticAgent._monitor_workers": _no_restart_probe,
}
"""The private names this module reaches, each with a probe (``hpcpipe.compat.PRIVATE_APIS``)."""
