"""The per-node agent: torch.distributed's elastic agent, plus the three things it gets wrong for us.

One agent runs on each node (``srun --ntasks-per-node=1 hpcpipe launch agent ...``, or the
local ``hpcpipe train --nproc N``). It starts the node's workers, joins the c10d rendezvous on the
first node and restarts the group after a failure or a membership change (``parallel.nnodes
MIN:MAX``: a lost node shrinks the world, a returning node grows it at the next rendezvous).

What torchrun's agent does not do, and this one does:

1. **Preemption reaches the workers and its exit code comes back.** On SIGTERM torchrun's agent
   tears the group down and exits with its own code, so a checkpointed preemption (workers
   exit 75) looks like a crash, and a crash like anything else; on SIGUSR1 (Slurm's
   ``--signal=USR1@grace``) it simply dies. Here torch's agent is told to leave both signals
   alone (``signals_to_handle``); the handler forwards them to the workers, waits for them to
   checkpoint and exit (up to ``grace_s``), and the agent exits with *their* code
   (``preempted_exit_code``). A worker under a profiler
   (``AgentSpec.wrapper``) is the tool's child: the signal, and the SIGKILL after the grace, go to
   the tool's whole session, and the agent waits for the worker too, not only for the tool.
2. **The code of the first failed worker** (a worker's UserError exit 2 stays 2), instead of 1,
   and no restart after an exit a restart cannot change (``terminal_exit_codes``).
3. **A SIGSTOPped worker ends when the group is torn down** (``launch/stopped.py``), instead of
   holding the restart for the whole shutdown timeout until SIGKILL.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any, Literal

from hpcpipe.errors import USER_ERROR_EXIT_CODE
from hpcpipe.launch.exit import (
    EXIT_DIR_VAR,
    PEER_LOST_EXIT_CODE,
    a_refusal_was_said,
    forget_what_was_said,
    reported_exit_code,
)
from hpcpipe.launch.exit_dirs import exit_dir
from hpcpipe.launch.fork_server import is_fork_server, shielded
from hpcpipe.launch.launcher_watch import LAUNCHER_VAR, launcher_identity
from hpcpipe.launch.parent_death import command_ending_with_the_parent
from hpcpipe.launch.stopped import continuing_stopped_workers
from hpcpipe.netutil import is_loopback

# The rendezvous heartbeat of agents that share one host (AgentSpec.keep_alive_s; _rdzv_configs
# says why it is safe), and the missed heartbeats after which a node is lost (torch's default).
LOCAL_KEEP_ALIVE_S = 0.5
KEEP_ALIVE_MISSES = 3


@dataclass(frozen=True)
class AgentSpec:
    """What one node's agent needs; every node of a job gets the same except ``local_addr``."""

    nproc_per_node: int
    min_nodes: int = 1
    max_nodes: int = 1
    rdzv_endpoint: str = "127.0.0.1:0"  # host:port of the c10d store (port 0: any free one)
    rdzv_id: str = ""
    max_restarts: int = 0
    local_addr: str | None = None  # this node's address as the others reach it
    # How often the agent polls its workers: a failure waits half of it on average before the
    # restart begins (measured: detection 0.22 s median at 0.5, see benchmarks/README.md,
    # 'Time to recover, by phase').
    monitor_interval_s: float = 0.1
    grace_s: float = 60.0  # preemption: how long the workers get to checkpoint and exit
    last_call_s: float = 15.0  # rendezvous: wait this long for more nodes once MIN have joined
    # Seconds between an agent's rendezvous heartbeats; ``keep_alive_misses`` missed ones declare
    # its node lost (the survivors' next round waits for that). None: LOCAL_KEEP_ALIVE_S for
    # agents on one host (a loopback endpoint: a lost "node" is noticed in 1.5 s), torch's 5
    # between hosts (15 s).
    keep_alive_s: float | None = None
    keep_alive_misses: int = KEEP_ALIVE_MISSES
    # Signals forwarded to the workers, whose exit codes then decide the agent's: SIGUSR1 (Slurm's
    # --signal) and SIGTERM (scancel, Kubernetes). torch's agent is told to leave them alone
    # (its own SIGTERM handler tears the workers down and loses their codes).
    preempt_signals: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGTERM)
    preempt_exit_code: int = 75  # what the workers exit with after their preemption checkpoint
    # forkserver: workers fork from one server process that imported torch and the trainer once
    # (the module's ``forked_main``); spawn: each worker is a fresh ``python -m module`` process.
    start_method: Literal["forkserver", "spawn"] = "forkserver"
    preload: tuple[str, ...] = ()  # modules the fork server imports for every worker
    # A profiler each worker starts under (``launch/nsight.py``): every worker is then its own
    # ``wrapper... python -u -m module`` process, whatever ``start_method`` says.
    wrapper: tuple[str, ...] = ()
    # The run directory whose events.jsonl gets one ``agent_restart`` line (wall-clock milestones)
    # per restart of this node's group (``launch/agent_timeline.py``); None: not recorded.
    events_dir: str | None = None
    # After a preemption, SIGTERM stays ignored once the agent returns: under ``srun
    # --kill-on-bad-exit=1`` the node agent (``hpcpipe launch agent``), on its way out of the same
    # preemption, must not die of Slurm's SIGTERM (143: no requeue). A launcher that goes on
    # (a sweep's next point, a pipeline's next step) gets its own handler back instead.
    ignore_sigterm_after_preemption: bool = False


class AgentPreempted(BaseException):
    """Raised out of the agent's loop once every worker exited after a preemption signal."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(f"preempted: workers exited with {exit_code}")
        self.exit_code = exit_code


def run_agent(spec: AgentSpec, module: str, args: list[str]) -> int:
    """Run ``python -m module args`` as this node's workers; returns the node's exit code."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig as ElasticConfig
    from torch.distributed.launcher.api import elastic_launch

    from hpcpipe.compat import keepalive_timers_stop_cleanly, no_restart_after, quick_rendezvous
    from hpcpipe.launch.agent_timeline import recording_restarts
    from hpcpipe.launch.rendezvous import LOOPBACK_BACKEND, POLL_S, node_address, rendezvous_backend

    # Restarts on one host are flaky when the agent shares its rendezvous TCP store with the
    # workers; a separate store per round is reliable.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    entry, entry_args = _entry_point(spec, module, args)
    forget_what_was_said()  # an earlier run's refusal in this process must not silence this one's
    _quiet_signal_notices()
    backend = rendezvous_backend(spec.rdzv_endpoint)  # loopback-only for a local endpoint
    poll_s = POLL_S if backend == LOOPBACK_BACKEND else None  # torch's 1 s between hosts
    config = ElasticConfig(
        min_nodes=spec.min_nodes,
        max_nodes=spec.max_nodes,
        nproc_per_node=spec.nproc_per_node,
        run_id=spec.rdzv_id or f"hpcpipe-{os.getpid()}",
        rdzv_backend=backend,
        rdzv_endpoint=spec.rdzv_endpoint,
        rdzv_configs=_rdzv_configs(spec),
        max_restarts=spec.max_restarts,
        monitor_interval=spec.monitor_interval_s,
        start_method=spec.start_method,
        local_addr=node_address(spec.rdzv_endpoint, spec.local_addr),
        **_shutdown_timeout(ElasticConfig, spec.grace_s),
        **_logs_in_exit_dir(ElasticConfig),
        **_signals_left_to_torch(ElasticConfig, spec.preempt_signals),
    )
    terminal = terminal_exit_codes(spec.preempt_exit_code)
    forward = _forward_and_wait(spec.grace_s, spec.preempt_exit_code, whole_sessions=bool(spec.wrapper))
    # torch's agent installs its handler for the signals it handles (its PContext.start) and never
    # removes it: after this run, Ctrl-C raised torch's SignalException (a traceback, exit 1) in
    # the launcher's next step instead of KeyboardInterrupt. Every one is put back at the end.
    previous = _handlers({*spec.preempt_signals, *(signal.Signals[name] for name in TORCH_AGENT_SIGNALS)})
    for sig in spec.preempt_signals:
        signal.signal(sig, forward)
    try:
        # A SIGSTOPped rank must still end on SIGTERM; each restart is timed into events.jsonl;
        # each rendezvous round skips torch's costly step names (and, one node alone, its jitter;
        # on one host, a waiting node reads the store every POLL_S, not every second); the
        # rendezvous keep-alive stops without a traceback whichever thread collects it.
        with (
            continuing_stopped_workers(_worker_pids),
            recording_restarts(spec.events_dir),
            quick_rendezvous(one_node=spec.max_nodes == 1, poll_s=poll_s),
            keepalive_timers_stop_cleanly(),
            no_restart_after(terminal, reported=None if _runs_subprocesses(spec) else _reported_failure),
        ):
            elastic_launch(config, entry)(*entry_args)
    except AgentPreempted as exc:
        # The handler ignores SIGTERM from here on (``_forward_and_wait``); a node agent keeps it so.
        if spec.ignore_sigterm_after_preemption:
            previous.pop(signal.SIGTERM, None)
        return exc.exit_code
    except ChildFailedError as exc:
        return _report_failure(exc, spec.max_restarts, terminal)
    except SignalException as exc:
        # Ctrl-C (or SIGHUP, SIGQUIT) reached this agent while workers ran: torch's agent passed
        # the signal on and waited for them (Ctrl-C: they checkpoint and exit 130). SIGTERM comes
        # here only from a torch without ``signals_to_handle``, which took it back: its workers'
        # codes are lost, and a preemption is the likelier reading, as before.
        return spec.preempt_exit_code if exc.sigval == signal.SIGTERM else 128 + int(exc.sigval)
    except RendezvousError as exc:
        cause = exc.__cause__ or exc
        print(f"agent: rendezvous at {spec.rdzv_endpoint} failed: {cause}", file=sys.stderr, flush=True)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _handlers(signals: set[signal.Signals]) -> dict[signal.Signals, Any]:
    """The Python handler of each signal (one installed outside Python, None, cannot be put back)."""
    handlers = {sig: signal.getsignal(sig) for sig in signals}
    return {sig: handler for sig, handler in handlers.items() if handler is not None}


def _entry_point(spec: AgentSpec, module: str, args: list[str]) -> tuple[Any, tuple[str, ...]]:
    """What torch's agent starts for each worker, and its arguments.

    forkserver: ``module.forked_main(*args)`` in a process forked from one server that imported
    ``module``, ``spec.preload`` and the heavy libraries this launcher already imported (to
    prepare the job) once: a worker starts in a fraction of a second instead of the ~4 s of
    imports a fresh interpreter pays (measured here: torch, its compiler stack, the trainer), and a
    restarted group as fast. The workers report their exit codes through files in
    ``HPCPIPE_EXIT_DIR`` (they are the server's children, not this process's).
    """
    if _runs_subprocesses(spec):
        # torch's agent runs a string entry point as a subprocess, one per worker, in a session of
        # its own, so nothing of this process's reaches it: the program (the worker, or the
        # profiler it runs under) asks to be SIGKILLed when this process ends (parent_death.py),
        # and a worker under a profiler watches this process itself (launcher_watch.py).
        worker = (sys.executable, "-u", "-m", module, *args)
        if spec.wrapper:
            os.environ[LAUNCHER_VAR] = launcher_identity()
            worker = (*spec.wrapper, *worker)
        command = command_ending_with_the_parent(worker, parent=os.getpid())  # torch's agent runs here
        return command[0], command[1:]
    import importlib
    import multiprocessing
    from multiprocessing import forkserver

    # torch logs a forked worker's non-zero exit with a traceback of its own polling code; the
    # agent names the failed rank and its code in one line instead.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_drop_exit_traceback)
    already = [name for name in ("torchvision", "transformers", "peft") if name in sys.modules]
    multiprocessing.set_forkserver_preload([module, *spec.preload, *already])
    os.environ[EXIT_DIR_VAR] = exit_dir()  # before the server starts: its children see it
    with shielded():
        # A server `fork_server.prestart` forked is running already; otherwise multiprocessing's own.
        forkserver.ensure_running()  # and the resource tracker: both ignore SHIELDED_SIGNALS
    return importlib.import_module(module).forked_main, tuple(args)


def _runs_subprocesses(spec: AgentSpec) -> bool:
    """Whether torch's agent starts each worker as a subprocess (a wrapper, or spawn), not as a
    process forked from the fork server (which reports its exit code in ``HPCPIPE_EXIT_DIR``)."""
    return bool(spec.wrapper) or spec.start_method == "spawn"


def _reported_failure(pid: int) -> int:
    """A forked worker's own exit code, 0 when it reported none (still running, or SIGKILLed)."""
    return reported_exit_code(pid, unreported=0)


def _drop_exit_traceback(record: logging.LogRecord) -> bool:
    return not (record.exc_info and str(record.msg).startswith("failed (exitcode"))


# torch's agent announces a SIGTERM or Ctrl-C it passes on to the workers in warnings of its own,
# and torch.multiprocessing's ProcessContext warns for each worker still alive that it SIGTERMs
# after another one failed (which ones are still alive is timing);
# each rank then says what it did and the run ends with one line, so these only push that line
# off a newcomer's screen. Its warnings about a worker it had to SIGKILL stay.
_SIGNAL_NOTICES = {
    "torch.distributed.elastic.agent.server.api": "Received %s death signal",
    "torch.distributed.elastic.multiprocessing.api": "Closing process %s via signal",
    "torch.multiprocessing.spawn": "Terminating process %s via signal SIGTERM",
}


def _quiet_signal_notices() -> None:
    for name, start in _SIGNAL_NOTICES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNotice) and f.start == start for f in logger.filters):
            logger.addFilter(_DropNotice(start))  # once: the agent may run again in one process


class _DropNotice(logging.Filter):
    """Drops the records whose format string starts with ``start``."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def _shutdown_timeout(config_type: type, grace_s: float) -> dict[str, Any]:
    """``shutdown_timeout``: how long torch's agent waits for workers it signalled before killing
    them. It must cover the preemption grace (the workers' checkpoint); older torch has no such
    field and waits its fixed 30 s."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(config_type)}
    return {"shutdown_timeout": max(30, int(grace_s) + 5)} if "shutdown_timeout" in fields else {}


def _logs_in_exit_dir(config_type: type) -> dict[str, Any]:
    """torch's per-run log directory inside this launcher's exit directory, which goes with it
    (and is swept after a SIGKILL): by default each run left a /tmp/torchelastic_* behind."""
    import dataclasses

    if "logs_specs" not in {f.name for f in dataclasses.fields(config_type)}:
        return {}
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    return {"logs_specs": DefaultLogsSpecs(log_dir=os.path.join(exit_dir(), "torchelastic"))}


# The signals torch's agent handles by default: it passes them on, tears the workers down and
# raises SignalException, losing their exit codes.
TORCH_AGENT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def _signals_left_to_torch(config_type: type, ours: tuple[signal.Signals, ...]) -> dict[str, Any]:
    """``signals_to_handle`` (torch >= 2.9): torch's agent handles all but ``ours``, which stay
    with this agent's handler (it passes them on, reaps the workers and answers their code)."""
    import dataclasses

    if "signals_to_handle" not in {f.name for f in dataclasses.fields(config_type)}:
        return {}
    names = {sig.name for sig in ours}
    return {"signals_to_handle": ",".join(name for name in TORCH_AGENT_SIGNALS if name not in names)}


def terminal_exit_codes(preempt_exit_code: int) -> frozenset[int]:
    """Worker exits a restart cannot change or must not undo: a user error (2), the preemption
    checkpoint (``fault.preempt_exit_code``; the scheduler resubmits), a pruned trial, Ctrl-C."""
    from hpcpipe.train.preempt import INTERRUPT_EXIT_CODE
    from hpcpipe.train.trial import PRUNED_EXIT_CODE

    return frozenset({USER_ERROR_EXIT_CODE, preempt_exit_code, PRUNED_EXIT_CODE, INTERRUPT_EXIT_CODE})


def _report_failure(exc: BaseException, max_restarts: int, terminal: frozenset[int] = frozenset()) -> int:
    """Name the failed rank in one line (torch's summary is long); return its exit code.

    A rank that failed on its own (an exception, a signal) is named before the ranks whose
    collectives then failed because it went away (``PEER_LOST_EXIT_CODE``): the agent sees them
    all at once, and the lowest rank is often a victim."""
    failures = sorted(getattr(exc, "failures", {}).items())  # global rank -> ProcessFailure
    if not failures:
        return 1
    rank, failure = min(failures, key=lambda item: (item[1].exitcode in (0, PEER_LOST_EXIT_CODE), item[0]))
    # Killed by signal N (the OOM killer's SIGKILL): 128 + N, as ARCHITECTURE's exit codes say; 1
    # would read as a Python exception.
    code = failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode if failure.exitcode < 0 else 1
    if code == USER_ERROR_EXIT_CODE and a_refusal_was_said():  # in one line; the launcher says the rest
        return code
    if code in terminal - {USER_ERROR_EXIT_CODE}:  # preempted, Ctrl-C, pruned: no failure; the ranks said it
        return code
    if any(f.exitcode in terminal for _, f in failures):
        ended = "not restarted: a restart cannot change that"
    elif max_restarts == 0:
        ended = "no restarts allowed (--max-restarts 0)"
    else:
        ended = f"the group gave up after {max_restarts} restart(s)"
    print(  # the code the node exits with (128 + N for a signal), not torch's -N
        f"agent: worker rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) failed with "
        f"exit code {code}; {ended}",
        file=sys.stderr,
        flush=True,
    )
    return code


def stop_early_on_preemption(
    exit_code: int, signals: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGTERM)
) -> dict[signal.Signals, Any]:
    """Until ``run_agent`` starts workers, a preemption signal ends the agent with ``exit_code``:
    nothing to checkpoint yet, and dying of the signal (exit 138 or 143; a SIGTERM that a pod's
    PID 1 ignores, then SIGKILL) would read as a crash. Returns the handlers it replaced."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        raise AgentPreempted(exit_code)

    return {sig: signal.signal(sig, handler) for sig in signals}


def _rdzv_configs(spec: AgentSpec) -> dict[str, object]:
    """torch's c10d rendezvous options for this node.

    ``is_host``: torch decides who hosts the c10d store by matching the endpoint against the
    machine's hostname, which fails where node names are not the kernel hostname (Slurm NodeName,
    network namespaces, containers): the node whose address *is* the endpoint's host hosts it.

    The heartbeat. A lost node is one whose agent sent no heartbeat for ``keep_alive_s`` x
    ``keep_alive_misses``; the survivors' next round waits for that silence, then for its last
    call. Between hosts torch's 5 s x 3 stays: heartbeats are stamped with the sender's clock and
    aged with the reader's, so clock skew between hosts eats into the margin, and a late beat over
    a congested network must not read as a lost node. Agents on one host (a loopback endpoint)
    share a clock and the store is on loopback, so only scheduling can make a beat late: the
    beat comes from a thread of the agent (not of a worker: a worker's GC pause or a slow
    checkpoint write delays no beat), and it must be late by twice its interval before its node
    counts as lost. At 0.5 s x 3 that is 1.5 s of silence, a beat a whole second late (half a
    second right after a round: torch's timer first beats a full interval after the round's last
    beat, so up to two intervals pass there, 10 of its own 15 s). Measured
    (``benchmarks/rdzv_heartbeat_gaps.py``; benchmarks/results/chaos-lost-node/): over 5 minutes
    in which two agents' workers trained, checkpointed every 2 steps and were killed and
    restarted 15 times, on this 2-core host at load 12-15 with 4 more processes spinning, the
    longest gap between an agent's beats was 0.78 s (0.28 s late); in 90 s with a worker killed
    every 6 s, 1.01 s (as the first round ended). A node wrongly counted lost costs a restart at
    most, never data: its workers train on in their group, and its next rendezvous puts it back
    (an agent SIGSTOPped for 3 s was dropped from the rendezvous after 1.4 s; the job finished,
    no restart).

    torch's c10d parser takes whole seconds (``int(value)``: 0.5 would be 0, an error, and 1.9
    would be 1), so between hosts a fraction is rounded up; the loopback handler takes fractions
    (``rendezvous._create_handler``).
    """
    host = spec.rdzv_endpoint.rsplit(":", 1)[0]
    local = is_loopback(host)

    def seconds(value: float) -> float:
        return value if local else math.ceil(value)

    configs: dict[str, object] = {"last_call_timeout": seconds(spec.last_call_s)}
    if spec.local_addr is not None:
        configs["is_host"] = host == spec.local_addr
    configs["keep_alive_max_attempt"] = spec.keep_alive_misses
    keep_alive = spec.keep_alive_s or (LOCAL_KEEP_ALIVE_S if local else None)
    if keep_alive is not None:  # None: torch's 5 s
        configs["keep_alive_interval"] = seconds(keep_alive)
    return configs


def _forward_and_wait(grace_s: float, preempt_exit_code: int, whole_sessions: bool = False):  # type: ignore[no-untyped-def]
    """A signal handler: pass the signal on to the workers, reap them, end the agent's loop.

    It runs in the agent's main thread, between two polls of its monitoring loop, so the
    workers cannot be restarted meanwhile. The workers are this process's children (the agent
    starts them with subprocess), so ``waitpid`` gives their real exit codes.

    ``whole_sessions``: each worker runs under a profiler (``AgentSpec.wrapper``), so this
    process's child is ``nsys``/``ncu`` and the Python worker is the tool's child. torch's agent
    starts every subprocess worker with ``start_new_session=True`` (its ``SubprocessHandler``,
    which itself ends one with ``os.killpg(pid, ...)``): the child's pid names its process group
    and its session, and the tool's children are in them. So the signal goes to the whole
    session, and a worker is done only when nothing of its session runs any more (a tool that
    exits first must not leave its worker checkpointing, or orphaned, behind the agent).

    While it waits, SIGTERM is noted and ignored: under ``srun --kill-on-bad-exit=1`` the first
    node whose agent exits 75 makes Slurm SIGTERM the others, which are finishing the same
    preemption; dying of that SIGTERM would turn the step's code into 143 and lose the requeue.
    """

    def handler(signum: int, _frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        workers = _worker_pids()
        for pid in workers:
            _signal(pid, signum, whole_session=whole_sessions)
        codes = _reap(workers, grace_s, whole_sessions=whole_sessions, signum=signum)
        raise AgentPreempted(preempted_exit_code(codes, signum, preempt_exit_code))

    return handler


def preempted_exit_code(codes: list[int], signum: int, preempt_exit_code: int) -> int:
    """The node's exit code once its workers ended after a preemption signal it passed on.

    Preempted (``preempt_exit_code``, "resubmit me") when no worker had started, when one
    committed its checkpoint, or when the workers died of the signal itself (it came before
    the trainer's handler was installed, or after it was removed: nothing of theirs failed).
    Any other failure is the workers' own: a rank that crashed, or that was SIGKILLed past the
    grace, is not turned into a preemption. 0 when every worker finished."""
    if not codes or preempt_exit_code in codes:
        return preempt_exit_code
    failed = [code for code in codes if code not in (0, 128 + signum)]
    if failed:
        return failed[0]
    return preempt_exit_code if 128 + signum in codes else 0


def _worker_pids() -> list[int]:
    """The workers: this process's children, or the fork server's (multiprocessing's resource
    tracker is neither)."""
    workers: list[int] = []
    for pid in _child_pids(os.getpid()):
        command = command_line(pid)
        if is_fork_server(pid, command):
            workers += _child_pids(pid)
        elif "multiprocessing.resource_tracker" not in command:
            workers.append(pid)
    return sorted(workers)


def _child_pids(parent: int) -> list[int]:
    """A process's live children (Linux ``/proc``; every thread's list)."""
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{parent}/task"):
            try:
                with open(f"/proc/{parent}/task/{task}/children") as fh:
                    pids.update(int(p) for p in fh.read().split())
            except OSError:
                continue
    return sorted(pids)


def command_line(pid: int) -> str:
    """A process's command line, arguments joined by spaces ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _signal(pid: int, signum: int, whole_session: bool = False) -> None:
    """Signal ``pid``; with ``whole_session``, every process of the session it leads (once it is
    gone, what is left of that session): its process group as torch does, then any member the
    tool moved to a group of its own. A process that leads no session gets the signal alone."""
    if not whole_session or _session_id(pid) not in (pid, None):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        return
    with contextlib.suppress(OSError):  # gone, or a member that is not ours to signal
        os.killpg(pid, signum)
    for member, group in _sessions().get(pid, []):
        if group != pid:
            with contextlib.suppress(OSError):
                os.kill(member, signum)


def _session_id(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _sessions() -> dict[int, list[tuple[int, int]]]:
    """Every live process on the machine (zombies left out), as session id -> [(pid, group)]
    (``/proc/PID/stat``: the fields after the command's closing parenthesis are state, parent,
    process group, session)."""
    found: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and fields[0] not in (b"Z", b"X"):
            found.setdefault(int(fields[3]), []).append((int(name), int(fields[2])))
    return found


def _reap(pids: list[int], grace_s: float, whole_sessions: bool = False, signum: int = 0) -> list[int]:
    """Exit codes of ``pids`` (128 + signal for a killed one); SIGKILL whoever outlives the grace.
    With ``whole_sessions`` a pid's session must be empty too (the worker under a profiler that
    exited first), and the SIGKILL goes to the whole session.

    A fork server's child (not this process's to wait for) that ended without reporting a code
    died of a signal: ``signum``, the one passed on, before the grace's SIGKILL (a worker that
    has no handler for it yet, starting up, dies of it at once), 137 after."""
    codes: dict[int, int] = {}
    deadline = time.monotonic() + grace_s
    lingering: list[int] = []
    while len(codes) < len(pids) or lingering:
        unreported = 128 + (signum if deadline != float("inf") and signum else signal.SIGKILL)
        for pid in pids:
            if pid not in codes and (status := _try_wait(pid, unreported)) is not None:
                codes[pid] = status
        if whole_sessions and deadline != float("inf"):
            sessions = _sessions()
            lingering = [pid for pid in codes if pid in sessions]
        else:
            lingering = []  # after the SIGKILL: only this process's children are waited for
        if time.monotonic() > deadline:
            left = sorted((set(pids) - codes.keys()) | set(lingering))
            if left:  # else the node's 137 would come with nothing said
                print(
                    f"agent: worker(s) {', '.join(map(str, left))} still running {grace_s:g} s after the "
                    "signal; killed (SIGKILL), without a checkpoint of theirs",
                    file=sys.stderr,
                    flush=True,
                )
            for pid in left:
                _signal(pid, signal.SIGKILL, whole_session=whole_sessions)
            deadline = float("inf")  # the next rounds collect the killed ones
            lingering = []
        time.sleep(0.05)
    return [codes[pid] for pid in pids]


def _try_wait(pid: int, unreported: int = 128 + signal.SIGKILL) -> int | None:
    """The exit code of ``pid`` once it ended (None while it runs); ``unreported``: a fork
    server's child's when it wrote none."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # the fork server's child: gone once it no longer exists
        if os.path.exists(f"/proc/{pid}"):
            return None
        return reported_exit_code(pid, unreported)
    if done == 0:
        return None
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
