"""Fault injection for chaos tests, driven by environment variables read once at import.

The chaos tests start real workers (the elastic agent, ``torchrun``) and need faults inside them
without a config change, so the faults come from the environment every worker inherits. Each
variable holds ``key=value`` pairs separated by commas:

``HPCPIPE_CHAOS_OOM="step=5,rank=1,micro=0"``
    raise ``SimulatedOOM`` (a ``torch.OutOfMemoryError``) at that micro-step: OOM recovery.
``HPCPIPE_CHAOS_HANG="step=4,rank=1"``
    sleep forever in ``_chaos_hang_forever`` (the name shows in the watchdog's stack dump).
``HPCPIPE_CHAOS_STOP="step=4,rank=1"``
    SIGSTOP this process: every thread, its watchdog included, freezes (a rank swapped out,
    stopped by a debugger, a frozen VM). Its peers' watchdogs must name it.
``HPCPIPE_CHAOS_KILL="step=7,rank=1"``
    SIGKILL this process: an abrupt node loss. Requires ``HPCPIPE_CHAOS_DIR``.
``HPCPIPE_CHAOS_SIGTERM="step=6,rank=0"`` (add ``signal=USR1`` for Slurm's ``--signal``)
    send this process SIGTERM (or SIGUSR1): preemption of one rank.
``HPCPIPE_CHAOS_SLOW="rank=1,where=data,seconds=0.05"``
    sleep that long at every micro-step from ``step`` (default 1) on: a straggler. ``where=data``
    delays the data path (after the batch is fetched, inside the data-wait time), ``forward``
    the compute. Unlike the other faults it fires at every step, and ``step`` is optional.
``HPCPIPE_CHAOS_FAIL="step=3,rank=1"``
    raise ``ChaosFailure`` (the worker exits 1): a rank that fails *every* attempt, so it fires
    again after each restart (the marker directory does not hold it back).
``HPCPIPE_CHAOS_SAVE="step=8,rank=1,point=shards,signal=KILL"``
    SIGKILL (or ``signal=TERM``: preempt) this process inside the checkpoint save of ``step``,
    at ``point``: ``shards`` (this rank's files are written, nothing is gathered yet) or
    ``manifest`` (rank 0 wrote the manifest and has not renamed the checkpoint into place).
``HPCPIPE_CHAOS_HOLD="world=2"`` (requires ``HPCPIPE_CHAOS_DIR``)
    hold every rank before its first step while the group is smaller than ``world``, until a
    group of that size has started once. An elastic job's first round forms once its minimum
    number of nodes joined and the last call passed; on a loaded host a node that starts late
    could find a tiny job already finished. Held, the smaller group takes no step and the
    agent admits the late node; later, smaller groups (after a lost node) are not held.
``HPCPIPE_CHAOS_DIR=/path``
    marker directory: a fault fires at most once per directory, so it does not fire again after
    the elastic agent restarts the workers (which inherit the same environment).

Keys: ``step`` (required; the trainer's step number), ``rank`` (global rank; default: every
rank), ``micro`` (micro-step index; default 0), ``where`` (the call site, one of ``SITES``;
default ``forward``). Every fault fires at most once per process as well: an OOM must not fire
again when recovery retries the same step. A malformed variable raises ``ChaosConfigError``
(a ``UserError``: one line naming the variable, exit code 2) at import.

With no variable set, ``maybe_inject`` is one truth test of a module-level tuple.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcpipe.errors import UserError
from hpcpipe.train.faults import NO_FAULTS, FaultInjector

ENV_PREFIX = "HPCPIPE_CHAOS_"
KINDS = ("OOM", "HANG", "STOP", "KILL", "SIGTERM", "FAIL", "SAVE")
SAVE_POINTS = ("shards", "manifest")
SLOW_VAR = "HPCPIPE_CHAOS_SLOW"
HOLD_VAR = "HPCPIPE_CHAOS_HOLD"
SLOW_SITES = ("data", "forward")
DIR_VAR = "HPCPIPE_CHAOS_DIR"
SITES = ("forward", "backward")
"""Call sites: ``forward`` at the end of a micro-step's forward (inside the OOM guard, after the
model's collectives, see ``hpcpipe.train.oom``), ``backward`` just before a micro-step's backward.
Under pipeline parallelism the schedule runs both: once per step (``micro`` 0), ``forward`` before
the schedule and ``backward`` after its last backward."""

_SIGNALS = {"TERM": signal.SIGTERM, "USR1": signal.SIGUSR1, "KILL": signal.SIGKILL}


class ChaosFailure(RuntimeError):
    """A rank that fails on purpose (``HPCPIPE_CHAOS_FAIL``)."""


_EXAMPLE = "'step=5,rank=1,micro=0'"


class ChaosConfigError(UserError):
    """A ``HPCPIPE_CHAOS_*`` variable could not be parsed."""


@dataclass(frozen=True)
class Fault:
    kind: str  # one of KINDS
    step: int
    rank: int | None  # None: every rank
    micro: int = 0
    where: str = "forward"  # SAVE faults: one of SAVE_POINTS
    signum: int = signal.SIGTERM  # SIGTERM and SAVE faults only

    def matches(self, step: int, rank: int, micro: int, where: str) -> bool:
        return (
            step == self.step
            and micro == self.micro
            and where == self.where
            and (self.rank is None or rank == self.rank)
        )


@dataclass(frozen=True)
class Delay:
    """A straggler: ``seconds`` of sleep at every micro-step of ``rank`` from ``step`` on."""

    seconds: float
    rank: int | None
    step: int = 1
    where: str = "data"


_FAULTS: tuple[Fault, ...] = ()
_DELAYS: tuple[Delay, ...] = ()
_MARKER_DIR: Path | None = None
_HOLD_WORLD: int | None = None
_FIRED: set[tuple[Fault, int]] = set()  # (fault, rank) that fired in this process


def parse_faults(env: Mapping[str, str]) -> tuple[tuple[Fault, ...], Path | None]:
    """The faults and the marker directory described by ``env`` (raises ChaosConfigError)."""
    marker_dir = Path(env[DIR_VAR]) if env.get(DIR_VAR) else None
    faults = []
    for kind in KINDS:
        var = ENV_PREFIX + kind
        value = env.get(var, "").strip()
        if value:
            faults.append(_parse_one(var, kind, value))
    for kind in ("KILL", "SAVE"):
        if any(f.kind == kind for f in faults) and marker_dir is None:
            raise ChaosConfigError(f"{ENV_PREFIX}{kind} needs {DIR_VAR} (a marker so it fires only once)")
    return tuple(faults), marker_dir


def _parse_one(var: str, kind: str, value: str) -> Fault:
    fields: dict[str, str] = {}
    for part in value.split(","):
        key, sep, val = part.partition("=")
        if not sep or not key.strip() or not val.strip():
            raise ChaosConfigError(f"{var}: expected key=value pairs like {_EXAMPLE}, got {value!r}")
        fields[key.strip()] = val.strip()
    if kind == "SAVE":
        return _parse_save(var, fields, value)
    _check_keys(
        var, fields, {"step", "rank", "micro", "where"} | ({"signal"} if kind == "SIGTERM" else set()), value
    )
    where = fields.get("where", "forward")
    if where not in SITES:
        raise ChaosConfigError(f"{var}: where={where!r} is not one of {list(SITES)}")
    sig_name = fields.get("signal", "TERM").upper().removeprefix("SIG")
    if sig_name not in _SIGNALS or sig_name == "KILL":
        raise ChaosConfigError(f"{var}: signal={fields['signal']!r} is not one of {sorted(_SIGNALS)}")
    rank = fields.get("rank")
    return Fault(
        kind=kind,
        step=_int(var, "step", fields["step"]),
        rank=None if rank is None else _int(var, "rank", rank),
        micro=_int(var, "micro", fields.get("micro", "0")),
        where=where,
        signum=_SIGNALS[sig_name],
    )


def _check_keys(var: str, fields: dict[str, str], allowed: set[str], value: str) -> None:
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ChaosConfigError(f"{var}: unknown key {unknown[0]!r} in {value!r}; allowed: {sorted(allowed)}")
    if "step" not in fields:
        raise ChaosConfigError(f"{var}: 'step' is required, got {value!r}")


def _parse_save(var: str, fields: dict[str, str], value: str) -> Fault:
    _check_keys(var, fields, {"step", "rank", "point", "signal"}, value)
    point = fields.get("point", "shards")
    if point not in SAVE_POINTS:
        raise ChaosConfigError(f"{var}: point={point!r} is not one of {list(SAVE_POINTS)}")
    sig_name = fields.get("signal", "KILL").upper().removeprefix("SIG")
    if sig_name not in ("KILL", "TERM"):
        raise ChaosConfigError(f"{var}: signal={fields['signal']!r} is not one of ['KILL', 'TERM']")
    rank = fields.get("rank")
    return Fault(
        kind="SAVE",
        step=_int(var, "step", fields["step"]),
        rank=None if rank is None else _int(var, "rank", rank),
        where=point,
        signum=_SIGNALS[sig_name],
    )


def _int(var: str, key: str, text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise ChaosConfigError(f"{var}: {key}={text!r} is not an integer") from None
    if number < 0:
        raise ChaosConfigError(f"{var}: {key}={number} must be >= 0")
    return number


def parse_delay(value: str) -> Delay:
    """``HPCPIPE_CHAOS_SLOW``'s value (raises ChaosConfigError)."""
    fields: dict[str, str] = {}
    for part in value.split(","):
        key, sep, val = part.partition("=")
        if not sep or not key.strip() or not val.strip():
            raise ChaosConfigError(f"{SLOW_VAR}: expected key=value pairs like 'rank=1,seconds=0.05'")
        fields[key.strip()] = val.strip()
    unknown = sorted(set(fields) - {"seconds", "rank", "step", "where"})
    if unknown:
        raise ChaosConfigError(f"{SLOW_VAR}: unknown key {unknown[0]!r}; allowed: rank, seconds, step, where")
    where = fields.get("where", "data")
    if where not in SLOW_SITES:
        raise ChaosConfigError(f"{SLOW_VAR}: where={where!r} is not one of {list(SLOW_SITES)}")
    try:
        seconds = float(fields.get("seconds", ""))
    except ValueError:
        raise ChaosConfigError(f"{SLOW_VAR}: seconds= is required, a number of seconds") from None
    if not 0 < seconds < 3600:
        raise ChaosConfigError(f"{SLOW_VAR}: seconds={seconds} must be in (0, 3600)")
    rank = fields.get("rank")
    return Delay(
        seconds=seconds,
        rank=None if rank is None else _int(SLOW_VAR, "rank", rank),
        step=_int(SLOW_VAR, "step", fields.get("step", "1")),
        where=where,
    )


def parse_hold(value: str, marker_dir: Path | None) -> int:
    """``HPCPIPE_CHAOS_HOLD``'s world size (raises ChaosConfigError)."""
    key, sep, text = value.partition("=")
    if key.strip() != "world" or not sep:
        raise ChaosConfigError(f"{HOLD_VAR}: expected 'world=N', got {value!r}")
    world = _int(HOLD_VAR, "world", text.strip())
    if world < 2:
        raise ChaosConfigError(f"{HOLD_VAR}: world={world} must be >= 2")
    if marker_dir is None:
        raise ChaosConfigError(f"{HOLD_VAR} needs {DIR_VAR} (a marker so later, smaller groups go on)")
    return world


def check(env: Mapping[str, str]) -> None:
    """ChaosConfigError (one line) for a malformed ``HPCPIPE_CHAOS_*`` value in ``env``, nothing
    configured: a launcher's check before its workers start (in a fork server the import would
    fail, and the run end in an unexplained abort)."""
    _, marker_dir = parse_faults(env)
    if slow := env.get(SLOW_VAR, "").strip():
        parse_delay(slow)
    if hold := env.get(HOLD_VAR, "").strip():
        parse_hold(hold, marker_dir)


def configure(env: Mapping[str, str] | None = None) -> None:
    """(Re)read the faults from ``env`` (default: ``os.environ``); forgets which ones fired."""
    global _FAULTS, _MARKER_DIR, _DELAYS, _HOLD_WORLD  # noqa: PLW0603 (read once per process, swapped by tests)
    env = os.environ if env is None else env
    _FAULTS, _MARKER_DIR = parse_faults(env)
    slow = env.get(SLOW_VAR, "").strip()
    _DELAYS = (parse_delay(slow),) if slow else ()
    hold = env.get(HOLD_VAR, "").strip()
    _HOLD_WORLD = parse_hold(hold, _MARKER_DIR) if hold else None
    _FIRED.clear()


def hold_until_world(world_size: int, poll_s: float = 0.2) -> None:
    """With ``HPCPIPE_CHAOS_HOLD`` set: return once a group of that size has started; a smaller
    group before then waits here for its agent to restart it with the late node."""
    if _HOLD_WORLD is None or _MARKER_DIR is None:
        return
    released = _MARKER_DIR / f"hold-world{_HOLD_WORLD}.released"
    if world_size >= _HOLD_WORLD:
        _MARKER_DIR.mkdir(parents=True, exist_ok=True)
        released.touch()
        return
    if released.exists():
        return
    message = f"chaos: a group of {world_size} waits for {_HOLD_WORLD} ranks ({HOLD_VAR})"
    print(message, file=sys.stderr, flush=True)
    while not released.exists():
        time.sleep(poll_s)


def maybe_delay(step: int, rank: int, where: str) -> None:
    """Sleep when a ``HPCPIPE_CHAOS_SLOW`` straggler is configured for this rank and site."""
    if not _DELAYS:
        return
    for delay in _DELAYS:
        if delay.where == where and step >= delay.step and delay.rank in (None, rank):
            time.sleep(delay.seconds)


def active() -> bool:
    """Whether any fault is configured."""
    return bool(_FAULTS or _DELAYS)


def maybe_inject(step: int, rank: int, micro: int = 0, where: str = "forward") -> None:
    """Fire the configured fault that matches this point of the training loop, if any."""
    if not _FAULTS:
        return
    for fault in _FAULTS:
        if fault.matches(step, rank, micro, where) and _claim(fault, rank):
            _fire(fault, step, rank, micro)


def maybe_inject_save(step: int, rank: int, point: str) -> None:
    """Fire a ``HPCPIPE_CHAOS_SAVE`` fault at this point of the checkpoint save of ``step``."""
    for fault in _FAULTS:
        if fault.kind == "SAVE" and fault.matches(step, rank, 0, point) and _claim(fault, rank):
            _fire(fault, step, rank, 0)


def _claim(fault: Fault, rank: int) -> bool:
    """True the first time this fault fires in this process (and in the marker directory).

    The marker's mtime is when the fault fired: ``hpcpipe chaos`` measures recovery from it.
    """
    if (fault, rank) in _FIRED:
        return False
    _FIRED.add((fault, rank))
    if _MARKER_DIR is None or fault.kind == "FAIL":  # FAIL fires in every attempt
        return True
    _MARKER_DIR.mkdir(parents=True, exist_ok=True)
    marker = _MARKER_DIR / f"{fault.kind.lower()}-rank{rank}-step{fault.step}.fired"
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # atomic: one winner
    except FileExistsError:
        return False
    return True


def _fire(fault: Fault, step: int, rank: int, micro: int) -> None:
    print(
        f"chaos: {fault.kind} on rank {rank} at step {step}, micro-step {micro} ({ENV_PREFIX}{fault.kind})",
        file=sys.stderr,
        flush=True,
    )
    if fault.kind == "OOM":
        from hpcpipe.train.oom import SimulatedOOM

        raise SimulatedOOM(f"chaos: simulated CUDA out of memory at step {step}, micro-step {micro}")
    if fault.kind == "FAIL":
        raise ChaosFailure(f"chaos: rank {rank} fails at step {step} ({ENV_PREFIX}FAIL)")
    if fault.kind == "HANG":
        _chaos_hang_forever()
    elif fault.kind == "KILL":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "STOP":
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        os.kill(os.getpid(), fault.signum)


class EnvFaults:
    """The injector a chaos job installs through the environment: this rank's share of the
    ``HPCPIPE_CHAOS_*`` faults and stragglers (a ``hpcpipe.train.faults.FaultInjector``)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def at(self, point: str, step: int, micro: int) -> None:
        if point in SITES:  # forward, backward: an OOM (or a kill, a SIGTERM) injected there
            maybe_inject(step, self.rank, micro, point)
        maybe_delay(step, self.rank, point)

    def at_save(self, point: str, step: int) -> None:
        maybe_inject_save(step, self.rank, point)


def installed(rank: int) -> FaultInjector:
    """The injector for rank ``rank``: the environment's faults, or none when no variable is set."""
    return EnvFaults(rank) if active() else NO_FAULTS


def _chaos_hang_forever() -> None:
    """A stuck rank: never returns (the watchdog's stack dump names this function)."""
    while True:
        time.sleep(3600)


configure()
