"""The worker's stop flag: SIGTERM/SIGINT to the worker reaches the running trial (it checkpoints
and exits 75) and asks for no more trials."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcpipe.errors import UserError
from hpcpipe.hpo.worker import StopFlag


def test_a_signal_reaches_the_running_trial_and_stops_the_worker() -> None:
    stop = StopFlag()
    trial = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stop.started(trial.pid)
        stop._on_signal(signal.SIGTERM, None)
        assert trial.wait(timeout=10) == -signal.SIGTERM
    finally:
        trial.kill()
    assert stop.event.is_set()


def test_a_signal_between_trials_only_stops_the_worker() -> None:
    stop = StopFlag()
    stop._on_signal(signal.SIGINT, None)  # no trial runs: nothing to forward
    assert stop.event.is_set() and stop.child is None


def test_a_signal_while_the_trial_starts_is_passed_on_when_it_has_started() -> None:
    """The signal came between the ask and the child's start: nothing forwarded it, and the trial
    trained on until the scheduler's SIGKILL, without a checkpoint."""
    stop = StopFlag()
    stop._on_signal(signal.SIGTERM, None)
    trial = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stop.started(trial.pid)
        assert trial.wait(timeout=10) == -signal.SIGTERM
    finally:
        trial.kill()


def test_a_trial_whose_heartbeat_cannot_reach_the_study_is_stopped() -> None:
    """Other workers fail a trial unheard of for hpo.grace_s and start its retry in the same run
    directory: a trial that went on training (its store unreachable) shared it with the retry."""
    from hpcpipe.hpo.liveness import Heartbeat

    class Unreachable:
        def set_trial_system_attr(self, *args: object) -> None:
            raise ConnectionError("store down")

    stopped: list[bool] = []
    beat = Heartbeat(Unreachable(), 0, interval_s=0.05, grace_s=0.4, on_lapse=lambda: stopped.append(True))  # type: ignore[arg-type]
    with beat:
        deadline = time.monotonic() + 5
        while not stopped and time.monotonic() < deadline:
            time.sleep(0.05)
    assert stopped == [True]  # once


def test_a_trial_whose_heartbeat_hangs_in_the_store_is_stopped() -> None:
    """A blackholed PostgreSQL connection or a hung NFS mount blocks the beat instead of failing
    it: the lapse was checked only after a beat raised, so the trial trained on past the grace."""
    from hpcpipe.hpo.liveness import Heartbeat

    released = threading.Event()

    class Hanging:
        calls = 0

        def set_trial_system_attr(self, *args: object) -> None:
            Hanging.calls += 1
            if Hanging.calls > 1:  # the first beat lands, then the store stops answering
                released.wait(10)

    stopped: list[bool] = []
    beat = Heartbeat(Hanging(), 0, interval_s=0.05, grace_s=0.6, on_lapse=lambda: stopped.append(True))  # type: ignore[arg-type]
    try:
        with beat:
            deadline = time.monotonic() + 5
            while not stopped and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        released.set()
    assert stopped == [True]


def test_a_slow_but_healthy_store_does_not_stop_the_trial() -> None:
    """Every beat lands, 0.2 s late (a busy journal file or database): stamped at the beat's end,
    beats drifted heartbeat_s + latency apart and the watchdog stopped a healthy trial
    (hpo.heartbeat_s 10 s, hpo.grace_s 25 s, scaled down here)."""
    from hpcpipe.hpo.liveness import Heartbeat

    class Slow:
        calls = 0

        def set_trial_system_attr(self, *args: object) -> None:
            Slow.calls += 1
            time.sleep(0.2)

    stopped: list[bool] = []
    with Heartbeat(Slow(), 0, interval_s=0.4, grace_s=1.0, on_lapse=lambda: stopped.append(True)):  # type: ignore[arg-type]
        time.sleep(1.9)
    assert Slow.calls >= 4 and stopped == []


def test_the_lapse_leaves_the_trial_its_checkpoint_time_before_the_retry() -> None:
    """The lapse came at (heartbeat_s + grace_s) / 2: the trial had (grace_s - heartbeat_s) / 2
    (25 s by default) to checkpoint before other workers retried it in its directory, while it may
    take fault.preempt_grace_s (30 s) and its step. Now it has that plus STOP_MARGIN_S, and every
    grace the workers accept still lets a beat land half a heartbeat late."""
    from hpcpipe.config import load_config
    from hpcpipe.hpo.liveness import STOP_MARGIN_S, check_stop_window, lapse_s, stop_window_s

    for preset, sets in (("tiny", []), ("tiny-hpo", []), ("tiny", ["hpo.heartbeat_s=2", "hpo.grace_s=43"])):
        job = load_config(preset, sets)
        check_stop_window(job)
        heartbeat, grace, window = job.hpo.heartbeat_s, job.hpo.grace_s, stop_window_s(job.fault)
        lapse = lapse_s(heartbeat, grace, window)
        assert grace - lapse >= job.fault.preempt_grace_s + STOP_MARGIN_S  # the checkpoint's time
        assert lapse - heartbeat >= heartbeat / 2  # a late beat's
    assert lapse_s(10, 60, stop_window_s(load_config("tiny").fault)) == 20  # 10 s late is fine
    for sets in (["hpo.grace_s=50"], ["fault.preempt_grace_s=45"], ["hpo.heartbeat_s=20", "hpo.grace_s=55"]):
        with pytest.raises(UserError, match=r"^hpo\.grace_s \(\d+\) must be at least"):
            check_stop_window(load_config("tiny", sets))


def test_a_hung_store_stops_the_trial_its_checkpoint_time_before_the_retry() -> None:
    """Beats land, then hang: the lapse comes grace_s - stop_s after the last landed beat's start
    (scaled down: heartbeat 0.1 s, grace 1.2 s, 0.8 s to checkpoint)."""
    from hpcpipe.hpo.liveness import Heartbeat

    released = threading.Event()
    stamps: list[float] = []

    class HangsAtTheThird:
        def set_trial_system_attr(self, *args: object) -> None:
            if len(stamps) >= 2:
                released.wait(10)
                return
            stamps.append(time.monotonic())

    fired: list[float] = []
    beat = Heartbeat(HangsAtTheThird(), 0, 0.1, 1.2, lambda: fired.append(time.monotonic()), stop_s=0.8)  # type: ignore[arg-type]
    try:
        with beat:
            deadline = time.monotonic() + 5
            while not fired and time.monotonic() < deadline:
                time.sleep(0.02)
    finally:
        released.set()
    assert len(fired) == 1 and 0.35 < fired[0] - stamps[-1] < 0.6  # 0.4 s: 0.8 s left of the 1.2


def test_a_lapse_while_the_trial_starts_stops_it_when_it_has_started(tmp_path: Path) -> None:
    """The heartbeat lapsed while the zygote was forking the trial: ``started`` SIGTERMs it. The
    zygote ignores SIGTERM and answered the pid before its child restored the default: the signal
    was discarded and the trial trained to its end beside its retry."""
    import os

    from tests.helpers import CLI_PRELOAD, CLI_ZYGOTE, REPO

    from hpcpipe.launch.zygote import Launch, run_hpcpipe

    stop = StopFlag()
    stop.lapse()
    sets = [f"run.out_dir={tmp_path}", "train.steps=100000", "observe.progress=false"]
    argv = ["train", "tiny", *[a for s in sets for a in ("--set", s)]]
    how = Launch(timeout=30, started=stop.started)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ended = run_hpcpipe(argv, tmp_path, env, how, CLI_PRELOAD, zygote_cwd=REPO, zygote_name=CLI_ZYGOTE)
    assert ended.returncode in (75, -signal.SIGTERM), ended.stderr[-500:]
    assert not stop.event.is_set()  # the worker goes on: only its trial stopped


def test_committed_step_reads_both_tiers_and_an_unlistable_one_as_none(tmp_path: Path) -> None:
    """It raised NotADirectoryError (a file where checkpoint.durable_dir goes) outside any guard:
    the worker died and left its claimed trial RUNNING."""
    from hpcpipe.config import load_config
    from hpcpipe.hpo.worker import committed_step

    run_dir = tmp_path / "trial-0000"
    (run_dir / "checkpoints" / "step-00000004").mkdir(parents=True)
    (tmp_path / "durable" / "step-00000006").mkdir(parents=True)
    job = load_config("tiny", [f"checkpoint.durable_dir={tmp_path / 'durable'}"])
    assert committed_step(job, run_dir) == 6
    (tmp_path / "afile").write_text("")
    assert committed_step(load_config("tiny", [f"checkpoint.durable_dir={tmp_path / 'afile'}"]), run_dir) == 0
