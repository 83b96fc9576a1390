"""``python -m hpcpipe`` forked from a pre-imported zygote (``hpcpipe.launch.zygote``, which
``run_cli``, ``hpcpipe recipe check`` and the chaos runs use): what a caller sees must be what a
fresh interpreter gives, byte for byte."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers import CLI_ZYGOTE, IDLE_RANKS, run_cli

from hpcpipe.launch.zygote import _ZYGOTE, Launch, run_hpcpipe, run_script


def _fresh(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "hpcpipe", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],  # rich sizes it from COLUMNS: the environment is the request's, not the zygote's
        ["presets", "list"],
        ["train", "nope"],  # exit 2, one line on stderr
        ["train", "my.yaml"],  # a relative path: read from the request's directory
    ],
)
def test_a_forked_run_matches_a_fresh_interpreter(args: list[str], tmp_path: Path) -> None:
    (tmp_path / "my.yaml").write_text("preset: tiny\ntrain: {steps: -1}\n")
    env = {**os.environ, "COLUMNS": "61", "PYTHONUNBUFFERED": "1", "HOME": str(tmp_path)}
    forked = run_hpcpipe(args, tmp_path, env, Launch(timeout=120))
    assert not _ZYGOTE["zygote"].needs_fresh(env)  # it was forked, not a fresh interpreter
    fresh = _fresh(args, tmp_path, env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.args == fresh.args


def test_a_run_past_its_timeout_is_killed_and_the_next_run_works(tmp_path: Path) -> None:
    sets = [f"run.out_dir={tmp_path}", "train.steps=100000", "observe.progress=false"]
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli("train", "tiny", *[a for s in sets for a in ("--set", s)], cwd=tmp_path, timeout=3)
    assert run_cli("--version").returncode == 0


def test_an_import_time_variable_gets_a_fresh_interpreter() -> None:
    run_cli("--version")  # the zygote exists
    client = _ZYGOTE[CLI_ZYGOTE]
    same = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "40"}
    assert not client.needs_fresh(same)  # consoles are built per run
    for var in ("HF_HOME", "OMP_NUM_THREADS", "PYTHONHASHSEED", "PYTHONPATH"):
        assert client.needs_fresh({**same, var: "/elsewhere"}), var
    # Read when used, and set by hpcpipe itself in the test process (the elastic agent) or by
    # torch._dynamo's import (its cache directory): forked.
    assert not client.needs_fresh(
        {
            **same,
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "TORCHINDUCTOR_CACHE_DIR": "/elsewhere",
        }
    )


def _processes_in(cwd: Path) -> list[int]:
    """The processes working in ``cwd`` (a run's workers carry the zygote's command line)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(entry / "cwd")) == cwd:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_chaos_run_is_its_own_session_and_past_its_timeout_dies_with_its_workers(tmp_path: Path) -> None:
    import threading
    import time

    from hpcpipe.chaos.jobs import TrialTimeout
    from hpcpipe.chaos.jobs import run_hpcpipe as run_job

    sets = [f"run.out_dir={tmp_path}", "train.steps=100000", "observe.progress=false", "parallel.nproc=2"]
    sessions: set[int] = set()
    seen: set[int] = set()
    ended = threading.Event()

    def watch() -> None:  # the run's processes and their sessions, until all four are up
        while len(seen) < 4 and not ended.is_set():
            for pid in _processes_in(tmp_path):
                with contextlib.suppress(ProcessLookupError):
                    sessions.add(os.getsid(pid))
                    seen.add(pid)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    args = ["train", "tiny", *[a for s in sets for a in ("--set", s)]]
    # 8 s: the launcher, its fork server and both ranks were up within 2.3 s here, 3.3 s beside two
    # CPU-bound processes (2026-12-04, the zygote started cold).
    try:
        with pytest.raises(TrialTimeout, match="ran past 8 s"):
            run_job(args, tmp_path, 8, IDLE_RANKS, log="long")
    finally:
        ended.set()
    watcher.join()
    assert len(seen) >= 4, seen  # the launcher, its fork server and both ranks were running
    assert os.getsid(0) not in sessions  # a terminal's Ctrl-C would not reach the run
    assert (tmp_path / "long.out").is_file() and (tmp_path / "long.err").is_file()
    deadline = time.monotonic() + 5  # SIGKILLed processes take a moment to be torn down
    while _processes_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_in(tmp_path) == []  # the launcher, its fork server and both ranks: gone


def test_a_chaos_runs_bad_input_is_one_line_exit_2_and_its_log_is_kept(tmp_path: Path) -> None:
    from hpcpipe.chaos.jobs import run_hpcpipe as run_job

    yaml = tmp_path / "bad.yaml"
    yaml.write_text("preset: tiny\ntrain: {steps: -1}\n")
    proc = run_job(["train", "bad.yaml"], tmp_path, 120, env={"COLUMNS": "50"}, log="bad")
    assert proc.returncode == 2 and "train.steps" in proc.stderr
    assert (tmp_path / "bad.err").read_text() == proc.stderr


def test_fresh_interpreters_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcpipe.launch import zygote

    started: list[list[str]] = []
    fresh = zygote._run_fresh

    def spy(command: list[str], *args: object) -> subprocess.CompletedProcess[str]:
        started.append(command)
        return fresh(command, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(zygote, "_run_fresh", spy)
    monkeypatch.setenv(zygote.FRESH_VAR, "1")
    assert run_hpcpipe(["--version"], tmp_path, dict(os.environ), Launch(timeout=60)).returncode == 0
    script = tmp_path / "probe.py"
    script.write_text("print('fresh')\n")
    assert run_script(script, ["x"], tmp_path, dict(os.environ), Launch(timeout=60)).stdout == "fresh\n"
    assert started == [[sys.executable, "-m", "hpcpipe", "--version"], [sys.executable, str(script), "x"]]


PRESTARTED = """
import json, os, sys
from pathlib import Path

import hpcpipe.train.fault_injection  # imported here first, read with no fault set
from hpcpipe.launch import zygote

assert zygote.prestart(())
cwd, results = Path(sys.argv[1]), []
for argv, extra in json.loads(sys.argv[2]):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    run = zygote.run_hpcpipe(argv, cwd, env, zygote.Launch(timeout=120))
    results.append([run.returncode, run.stdout, run.stderr])
print(json.dumps(results))
"""


def test_a_zygote_forked_from_its_caller_runs_as_a_fresh_interpreter(tmp_path: Path) -> None:
    """``prestart`` (recipe check, chaos run, hpo): the runs match fresh interpreters, and a chaos
    fault set for a run fires although the caller had read the faults (none) before the fork."""
    (tmp_path / "my.yaml").write_text("preset: tiny\ntrain: {steps: -1}\n")
    sets = [f"run.out_dir={tmp_path}", "train.steps=3", "observe.progress=false"]
    failing = ["train", "tiny", *[a for s in sets for a in ("--set", s)]]
    runs = [
        (["--version"], {}),
        (["train", "my.yaml"], {"COLUMNS": "61"}),
        (failing, {"HPCPIPE_CHAOS_FAIL": "step=2"}),
    ]
    env = {k: v for k, v in os.environ.items() if k != "HPCPIPE_FRESH_INTERPRETERS"}
    script = [sys.executable, "-c", PRESTARTED, str(tmp_path), json.dumps(runs)]
    proc = subprocess.run(script, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    forked = json.loads(proc.stdout)
    for (argv, extra), (code, out, err) in zip(runs[:2], forked[:2], strict=True):
        fresh = _fresh(argv, tmp_path, {**env, "PYTHONUNBUFFERED": "1", **extra})
        assert (code, out, err) == (fresh.returncode, fresh.stdout, fresh.stderr), argv
    code, _, err = forked[2]
    assert code == 1 and "rank 0 fails at step 2 (HPCPIPE_CHAOS_FAIL)" in err


def test_a_forked_runs_cpu_seconds_reach_its_caller(tmp_path: Path) -> None:
    """The zygote reaps its runs, so the caller's RUSAGE_CHILDREN never sees them: ``Launch.ended``
    is told each forked run's CPU seconds instead (what ``gpu_suite.py`` records per step)."""
    seen: list[float] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    sizes = ["--matmul-n", "256", "--copy-size", "16M", "--min-time", "0.3", "--repeats", "1"]
    args = ["bench", "compute", "--json", str(tmp_path / "compute.json"), *sizes]
    done = run_hpcpipe(args, tmp_path, env, Launch(timeout=120, ended=seen.append))
    assert done.returncode == 0, done.stderr[-2000:]
    assert not _ZYGOTE["zygote"].needs_fresh(env)  # forked
    assert len(seen) == 1 and 0.3 < seen[0] < 120, seen  # at least its timed matmuls and copies


def test_a_forked_script_matches_a_fresh_interpreter(tmp_path: Path) -> None:
    """``run_script``: ``python SCRIPT ARGS`` forked (the benchmark smoke tier's runs): the script is
    ``__main__`` with its own directory first on ``sys.path`` (a sibling module imports), its argv,
    the caller's directory, and its exit code."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "sibling.py").write_text("WHO = 'sibling'\n")
    body = (
        "import os, sys\nimport sibling\n"
        "print(__name__, sys.argv[1:], sibling.WHO, os.getcwd(), os.path.basename(sys.argv[0]))\n"
        "print('to stderr', file=sys.stderr)\nsys.exit(3)\n"
    )
    (scripts / "probe.py").write_text(f'if __name__ == "__main__":\n    exec({body!r})\n')
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    forked = run_script(scripts / "probe.py", ["--smoke", "x"], tmp_path, env, Launch(timeout=60))
    assert not _ZYGOTE["zygote"].needs_fresh(env)
    command = [sys.executable, str(scripts / "probe.py"), "--smoke", "x"]
    fresh = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert (forked.returncode, forked.stdout, forked.stderr) == (3, fresh.stdout, fresh.stderr)
    assert fresh.returncode == 3 and fresh.stdout.startswith("__main__ ['--smoke', 'x'] sibling")


ORPHANED = """
import os, sys
from pathlib import Path
from hpcpipe.launch import zygote
cwd = Path(sys.argv[1])
env = {**os.environ, "PYTHONUNBUFFERED": "1"}
how = zygote.Launch(timeout=300, new_session=sys.argv[2] == "1")
zygote.run_script(cwd / "sleeper.py", [], cwd, env, how)
"""


@pytest.mark.parametrize("own_session", [False, True])
def test_a_run_ends_when_its_caller_is_killed_outright(tmp_path: Path, own_session: bool) -> None:
    """An HPO worker SIGKILLed: its trial, forked from the worker's zygote, trained on as an orphan
    until its next evaluation, while the trial's retry resumed in the same run directory."""
    import signal
    import time

    (tmp_path / "sleeper.py").write_text(
        "import os, time\nopen('pid.tmp', 'w').write(str(os.getpid()))\nos.rename('pid.tmp', 'pid')\n"
        "time.sleep(120)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HPCPIPE_FRESH_INTERPRETERS"}
    command = [sys.executable, "-c", ORPHANED, str(tmp_path), "1" if own_session else "0"]
    caller = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        pid_file = tmp_path / "pid"
        deadline = time.monotonic() + 120
        while not pid_file.exists() and caller.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_file.exists(), caller.stderr.read() if caller.stderr else ""
        run = int(pid_file.read_text())
        caller.kill()
        caller.wait(timeout=30)
        deadline = time.monotonic() + 20
        while Path(f"/proc/{run}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = Path(f"/proc/{run}").exists()
        if alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(run, signal.SIGKILL)
        assert not alive, "the run outlived its caller"
    finally:
        caller.kill()
        caller.wait(timeout=30)
