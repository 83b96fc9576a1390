"""Trials whose worker died: a heartbeat in the storage, and failing (and retrying) stale trials.

Optuna 5.0 keeps heartbeats only in its RDB storage and only for ``study.optimize``; hpcpipe's
workers use ask/tell and also run on the journal file store, so the heartbeat is a trial system
attribute written by the worker while its trial runs, and every worker sweeps stale trials
before it asks for a new one. A stale trial is failed and handed to Optuna's
``RetryHeartbeatStaleTrialCallback``, which enqueues the same parameters (and our ``run_dir``
user attribute, so the retry resumes the dead trial's checkpoint) up to ``hpo.max_retries`` times;
preemptions do not count (``retry``).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna

    from hpcpipe.config import JobConfig
    from hpcpipe.config.fault import FaultConfig

# [trial id, seconds since the epoch] (workers' clocks must agree: NTP). The id tells a trial's own
# beat from the one a retry inherits with its original's system attributes.
HEARTBEAT_ATTR = "hpcpipe:heartbeat"


def mark_alive(storage: optuna.storages.BaseStorage, trial_id: int, at: float | None = None) -> None:
    """Record that ``trial_id``'s worker is alive now (or ``at``)."""
    storage.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, [trial_id, time.time() if at is None else at])


def last_alive(trial: optuna.trial.FrozenTrial) -> float | None:
    """When the trial's own worker last marked it alive (None before its first mark). Optuna's
    ``datetime_start`` is a naive local time of the host that asked: read on a host in another
    time zone it is hours off, so it only stands in for the moment between ask and the first mark."""
    value = trial.system_attrs.get(HEARTBEAT_ATTR)
    if isinstance(value, list) and len(value) == 2 and value[0] == trial._trial_id:
        return float(value[1])
    return None


class Heartbeat:
    """While a trial runs: mark it alive every ``interval_s`` from a daemon thread.

    ``on_lapse`` is called once when no beat has reached the store for ``lapse_s(interval_s,
    grace_s, stop_s)``: other workers fail a trial they have not heard from for hpo.grace_s and
    start its retry in the same run directory, so the trial must have stopped (``stop_s``: its
    checkpoint) before then. A watchdog thread of its own keeps the time: a store that hangs (a
    blackholed PostgreSQL connection, a hung NFS mount) blocks the beat itself, which then never
    got to check the lapse."""

    def __init__(
        self,
        storage: optuna.storages.BaseStorage,
        trial_id: int,
        interval_s: float,
        grace_s: float = math.inf,
        on_lapse: Callable[[], None] | None = None,
        stop_s: float = 0.0,
    ) -> None:
        self.storage, self.trial_id, self.interval_s = storage, trial_id, interval_s
        self.lapse_s, self.on_lapse = lapse_s(interval_s, grace_s, stop_s), on_lapse
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpo-heartbeat", daemon=True)
        self._watchdog = threading.Thread(target=self._watch, name="hpo-heartbeat-watchdog", daemon=True)
        self._warned = False
        self._last_beat = self._first = time.monotonic()  # when the last beat that landed started
        self._lapsed = False

    def __enter__(self) -> Heartbeat:
        self._first = time.monotonic()
        self.beat()
        self._thread.start()
        if math.isfinite(self.lapse_s):
            self._watchdog.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        # A beat stuck in a hung store would hold the worker here for nothing.
        self._thread.join(timeout=0 if self._lapsed else self.interval_s + 5)

    def beat(self) -> None:
        # Stamped at the start, as the time written is: other workers' sweeps count from it.
        began = time.monotonic()
        try:
            mark_alive(self.storage, self.trial_id)
            self._last_beat = max(self._last_beat, began)
        except Exception as exc:  # the store is briefly unreachable: the next beat may succeed
            if not self._warned:
                print(f"hpcpipe: trial heartbeat failed ({type(exc).__name__}); retrying", file=sys.stderr)
                self._warned = True

    def _run(self) -> None:
        # Start to start: a slow store delays a beat's landing, not the next beat's start
        # (stamped at the end, beats drifted interval + latency apart and tripped the watchdog).
        due = self._first
        while True:
            now = time.monotonic()
            due += self.interval_s * max(1, math.ceil((now - due) / self.interval_s))
            if self._stop.wait(due - now):
                return
            self.beat()

    def _watch(self) -> None:
        while not self._stop.is_set():
            left = self._last_beat + self.lapse_s - time.monotonic()
            if left > 0:
                if self._stop.wait(left):
                    return
                continue
            self._lapsed = True
            print("hpcpipe: no heartbeat reached the study; stopping the trial", file=sys.stderr)
            if self.on_lapse is not None:
                self.on_lapse()
            return


# Beyond fault.preempt_grace_s, what a trial stopped by its worker may take to be gone: the step
# in flight when the SIGTERM comes (the grace timer starts at its end), the exit, and the workers'
# clocks disagreeing (the sweep compares another host's time with the beat's stamp).
STOP_MARGIN_S = 10.0
LATE_BEATS = 0.5  # the least lateness a landing beat is allowed, in heartbeats (check_stop_window)


def stop_window_s(fault: FaultConfig) -> float:
    """How long a trial its worker SIGTERMs may take to checkpoint and exit."""
    return fault.preempt_grace_s + STOP_MARGIN_S


def lapse_s(interval_s: float, grace_s: float, stop_s: float = 0.0) -> float:
    """How long without a landed beat before a worker stops its trial, counted from the last landed
    beat's start (the time it wrote, from which other workers count hpo.grace_s before they fail
    the trial and start its retry in its directory): ``stop_s`` (the trial's checkpoint and exit,
    ``stop_window_s``) before that. Never before (1 + LATE_BEATS) intervals: beats start
    ``interval_s`` apart, and one that lands late but within ``lapse - interval_s`` stops nothing
    (``check_stop_window`` keeps a job's grace long enough for both)."""
    return max(grace_s - stop_s, (1 + LATE_BEATS) * interval_s)


def check_stop_window(job: JobConfig) -> None:
    """A study's workers could not stop a trial whose beats stopped landing before the others
    retry it, and still take a healthy late beat: one line naming hpo.grace_s (UserError)."""
    from hpcpipe.errors import UserError

    hpo = job.hpo
    stop_s = stop_window_s(job.fault)
    least = (1 + LATE_BEATS) * hpo.heartbeat_s + stop_s
    if hpo.grace_s < least:
        raise UserError(
            f"hpo.grace_s ({hpo.grace_s:g}) must be at least {least:g} s ({1 + LATE_BEATS:g} x "
            f"hpo.heartbeat_s {hpo.heartbeat_s:g} + fault.preempt_grace_s {job.fault.preempt_grace_s:g}"
            f" + {STOP_MARGIN_S:g}): a trial whose beats stop landing must get fault.preempt_grace_s"
            f" + {STOP_MARGIN_S:g} s to checkpoint before other workers retry it, and a beat half a "
            "heartbeat late must not stop it"
        )


def fail_stale_trials(
    study: optuna.Study, storage: optuna.storages.BaseStorage, grace_s: float, max_retries: int
) -> list[int]:
    """Fail every running trial not marked alive for ``grace_s``; enqueue its retry. Returns the
    failed trials' numbers. Safe to run from many workers: only one of them wins each trial."""
    import optuna

    now = time.time()
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        started = trial.datetime_start.timestamp() if trial.datetime_start else now
        alive = last_alive(trial)
        if alive is None:  # asked a moment ago, not yet marked (workers mark right after asking)
            legacy = trial.system_attrs.get(HEARTBEAT_ATTR)  # a bare time: a worker of an older hpcpipe
            alive = max(float(legacy), started) if isinstance(legacy, int | float) else started
        if now - alive <= grace_s and not _worker_gone(trial):
            continue
        note = f"no heartbeat for {now - alive:.0f} s" if now - alive > grace_s else "its worker died"
        try:  # the note first: a finished trial takes no attributes
            storage.set_trial_user_attr(trial._trial_id, "hpcpipe:failure", note)
            if not storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker got there first
        failed.append(trial.number)
        retry(study, storage.get_trial(trial._trial_id), max_retries)
    return failed


# [trial id, "<host>:<pid>"] of the worker that runs the trial. A retry inherits its original's user
# attributes: the id tells the dead original's worker from the retry's own, as with the heartbeat.
WORKER_ATTR = "hpcpipe:worker"
WORKER_NS_ATTR = "hpcpipe:worker_pids"  # its boot id and pid namespace: where that pid means it


def claim(storage: optuna.storages.BaseStorage, trial_id: int) -> None:
    """Mark a trial just asked alive and name its worker (this process). Until then a retry held
    its dead original's worker, and a sweep in between failed the retry as soon as it was asked."""
    mark_alive(storage, trial_id)  # before anything else: see last_alive
    storage.set_trial_user_attr(trial_id, WORKER_NS_ATTR, pid_namespace())
    storage.set_trial_user_attr(trial_id, WORKER_ATTR, [trial_id, f"{os.uname().nodename}:{os.getpid()}"])


def pid_namespace() -> str | None:
    """This host's boot and this process's pid namespace: containers sharing a host name (host
    networking) have pids of their own; None where /proc does not say."""
    from hpcpipe.launch.exit_dirs import this_host_and_namespace

    owner = this_host_and_namespace()
    return None if owner is None else f"{owner[0]}:{owner[1]}"


def _worker_gone(trial: optuna.trial.FrozenTrial) -> bool:
    """The trial's worker ran on this host, in this pid namespace, and its process is gone
    (SIGKILL, the OOM killer): the trial is dead now, not after hpo.grace_s, by which time a worker
    started again at once had found only a RUNNING trial, run nothing and exited 0."""
    value = trial.user_attrs.get(WORKER_ATTR)
    if isinstance(value, list) and len(value) == 2 and value[0] == trial._trial_id:
        owner = str(value[1])
    elif isinstance(value, str) and retried_from(trial) is None:  # an older hpcpipe's worker
        owner = value  # (on a retry, such a string may be its dead original's: left to the grace)
    else:
        return False
    host, _, pid = owner.rpartition(":")
    if host != os.uname().nodename or not pid.isdigit():
        return False
    here = pid_namespace()
    if here is None or trial.user_attrs.get(WORKER_NS_ATTR) != here:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process of that pid: alive as far as we can tell
        return False
    return False


# How many of a trial's earlier tries were preempted: a system attribute its retries inherit.
PREEMPTIONS_ATTR = "hpcpipe:preemptions"


def retry(
    study: optuna.Study, trial: optuna.trial.FrozenTrial, max_retries: int, preempted: bool = False
) -> bool:
    """Enqueue the same parameters again unless ``trial`` used its retries; True when enqueued.
    A preemption (the trial checkpointed and exited 75: no fault of its own) uses none: a trial
    stopped twice by Slurm's time limit was failed for good with the default of one retry."""
    import copy

    from optuna.storages import RetryHeartbeatStaleTrialCallback

    preemptions = int(trial.system_attrs.get(PREEMPTIONS_ATTR, 0)) + preempted
    if preempted:  # the retry inherits the count (a finished trial takes no attributes: a copy)
        trial = copy.deepcopy(trial)
        trial.system_attrs = {**trial.system_attrs, PREEMPTIONS_ATTR: preemptions}
    # Optuna counts every try in the retry history: its limit grows by the preemptions in it.
    before = len(study.get_trials(deepcopy=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-API warning
        RetryHeartbeatStaleTrialCallback(
            max_retry=max_retries + preemptions, inherit_intermediate_values=True
        )(study, trial)
    return len(study.get_trials(deepcopy=False)) > before


def retried_from(trial: optuna.trial.FrozenTrial) -> int | None:
    """The number of the original trial this one retries (None for an original)."""
    value = trial.system_attrs.get("failed_trial")
    return int(value) if value is not None else None
