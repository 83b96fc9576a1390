"""The chaos harness itself: scenario files, seeded placement and replay, the runner's verdicts
(it must be able to fail), fault variables, and killing a job with everything it started."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.helpers import run_cli

from hpcpipe.chaos import jobs
from hpcpipe.chaos.kinds import KINDS
from hpcpipe.chaos.runner import resolve
from hpcpipe.chaos.scenario import Scenario, TrialContext, load_scenarios, trial_rng
from hpcpipe.errors import ConfigError
from hpcpipe.train.fault_injection import ChaosConfigError, parse_faults

SHIPPED = Path(__file__).parents[2] / "src" / "hpcpipe" / "chaos" / "scenarios" / "shipped.yaml"


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenarios.yaml"
    path.write_text(text)
    return path


def test_the_shipped_scenarios_load_and_name_known_kinds() -> None:
    scenarios = load_scenarios(SHIPPED)
    assert len(scenarios) >= 14
    assert all(s.kind in KINDS for s in scenarios)
    assert len({s.name for s in scenarios}) == len(scenarios)


def test_every_kind_resolves_to_a_function() -> None:
    for kind in KINDS:
        assert callable(resolve(kind)), kind


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- {name: a, kind: nope}", "unknown kind 'nope'"),
        ("- {name: a, kind: always_pass, colour: red}", "colour"),
        ("- {name: a, kind: always_pass}\n- {name: a, kind: must_fail}", "'a' is used twice"),
        ("- {name: 'bad name', kind: always_pass}", "name"),
        ("- {name: a, kind: always_pass, nproc: 0}", "nproc"),
        ("scenarios: []", "scenarios"),
        ("just text", "expected a list of scenarios"),
        ("- [unclosed", "not valid YAML"),
        # Checked when the file loads: a misspelt key took its default; -1 failed the first trial.
        (
            "- {name: a, kind: kill_rank, params: {max_restart: 5}}",
            "params.max_restart: kind kill_rank takes",
        ),
        (
            "- {name: a, kind: always_fail, params: {max_restarts: -1}}",
            "params.max_restarts: -1 is not an int",
        ),
        ("- {name: a, kind: kill_rank, params: {max_restarts: two}}", "'two' is not an int >= 0"),
        ("- {name: a, kind: always_pass, params: {x: 1}}", "takes no such param (it takes: none)"),
        ("- {name: a, kind: kill_rank, params: {max_restarts: 1.5}}", "1.5 is not an int >= 0"),
        # Out of what the injector or the job takes: every trial failed as "not recovered".
        (
            "- {name: a, kind: slow_rank, params: {seconds: 5000}}",
            "params.seconds: 5000 is not a finite number >= 0.001 and < 3600",
        ),
        ("- {name: a, kind: slow_rank, params: {seconds: .inf}}", "params.seconds: inf is not a finite"),
        ("- {name: a, kind: oom, params: {rel_tolerance: .nan}}", "params.rel_tolerance: nan is not"),
        ("- {name: a, kind: stall, params: {hang_timeout_s: .inf}}", "hang_timeout_s: inf is not"),
        (
            "- {name: a, kind: stall, params: {hang_timeout_s: 400}}",
            "params.hang_timeout_s: 400 must be smaller than timeout_s (300)",
        ),
        (
            "- {name: a, kind: stall, timeout_s: 900, set: [parallel.timeout_s=50], "
            "params: {hang_timeout_s: 100}}",
            "scenario a: params.hang_timeout_s: 100 must be smaller than its job's parallel.timeout_s (50)",
        ),
        (
            "- {name: a, kind: stall, set: [parallel.timeout_s=3]}",  # the default, 4 s
            "params.hang_timeout_s: 4 must be smaller than its job's parallel.timeout_s (3)",
        ),
    ],
)
def test_a_bad_scenario_file_is_one_error_naming_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(ConfigError, match=r"scenarios\.yaml") as caught:
        load_scenarios(path)
    assert message in str(caught.value)


def test_a_param_the_file_did_not_check_names_the_scenario_and_key(tmp_path: Path) -> None:
    scenario = Scenario.model_construct(
        name="k", kind="kill_rank", params={"max_restarts": "two"}
    )  # unchecked
    ctx = TrialContext(scenario, 0, 0, trial_rng(0, "k", 0), tmp_path, tmp_path)
    with pytest.raises(ConfigError, match=r"scenario k: params.max_restarts must be a int"):
        ctx.param("max_restarts", 1)


def test_placement_depends_on_seed_scenario_and_trial_only() -> None:
    draws = [trial_rng(7, "kill", t).random() for t in range(20)]
    assert draws == [trial_rng(7, "kill", t).random() for t in range(20)]  # replayable
    assert len(set(draws)) == 20
    assert trial_rng(7, "kill", 3).random() != trial_rng(8, "kill", 3).random()
    assert trial_rng(7, "kill", 3).random() != trial_rng(7, "stall", 3).random()


HARNESS = """
scenarios:
  - {name: fine, kind: always_pass, trials: 2}
  - {name: broken, kind: must_fail}
"""


def test_the_runner_reports_a_failing_trial_keeps_its_dir_and_replays_it(tmp_path: Path) -> None:
    path = _file(tmp_path, HARNESS)
    out = tmp_path / "out"
    proc = run_cli(
        "chaos", "run", str(path), "--trials", "3", "--seed", "5", "--out", str(out), "--no-progress"
    )
    assert proc.returncode == 1, proc.stderr
    rows = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert [(r["scenario"], r["trial"], r["recovered"]) for r in rows] == [
        ("fine", 0, True),
        ("fine", 1, True),  # the scenario's own `trials: 2` wins over --trials 3
        ("broken", 0, False),
        ("broken", 1, False),
        ("broken", 2, False),
    ]
    assert not (out / "fine").exists() or not any((out / "fine").iterdir())  # recovered: removed
    assert (out / "broken" / "trial-0001").is_dir()  # failed: kept for the post-mortem
    report = (out / "chaos.md").read_text()
    assert "FAIL" in report and "0/3" in report and "failed on purpose" in report
    assert rows[3]["replay"] in report
    assert "Traceback" not in proc.stderr

    replay = [*rows[3]["replay"].split()[1:], "--out", str(tmp_path / "replay"), "--no-progress"]
    again = run_cli(*replay)
    assert again.returncode == 1
    (row,) = [json.loads(line) for line in (tmp_path / "replay" / "trials.jsonl").read_text().splitlines()]
    assert (row["trial"], row["placement"]) == (1, rows[3]["placement"])  # the same draw


def test_a_passing_run_exits_0_and_refuses_to_overwrite_its_results(tmp_path: Path) -> None:
    path = _file(tmp_path, "- {name: fine, kind: always_pass}")
    out = tmp_path / "out"
    first = run_cli("chaos", "run", str(path), "-n", "2", "--out", str(out), "--no-progress")
    assert first.returncode == 0, first.stderr
    assert json.loads((out / "chaos.json").read_text())["total"]["failed"] == 0
    again = run_cli("chaos", "run", str(path), "--out", str(out), "--no-progress")
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"error: {out} already holds chaos results; give a new --out, or --resume to continue it"
    ]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["chaos", "run", "missing.yaml"], "scenario file not found: missing.yaml"),
        (["chaos", "run", "shipped", "--only", "nope"], "--only 'nope': no such scenario"),
        (["chaos", "report", "nowhere"], "nowhere"),
    ],
)
def test_bad_chaos_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], proc.stderr


def test_fail_and_save_faults_parse_and_bad_ones_name_the_variable(tmp_path: Path) -> None:
    env = {
        "HPCPIPE_CHAOS_FAIL": "step=3,rank=1",
        "HPCPIPE_CHAOS_SAVE": "step=8,rank=0,point=manifest,signal=TERM",
        "HPCPIPE_CHAOS_DIR": str(tmp_path),
    }
    faults, marker_dir = parse_faults(env)
    by_kind = {f.kind: f for f in faults}
    assert (by_kind["FAIL"].step, by_kind["FAIL"].rank) == (3, 1)
    save = by_kind["SAVE"]
    assert (save.step, save.rank, save.where, save.signum) == (8, 0, "manifest", signal.SIGTERM)
    assert marker_dir == tmp_path
    bad = {
        "HPCPIPE_CHAOS_SAVE": ("step=8,point=elsewhere", "point='elsewhere'"),
        "HPCPIPE_CHAOS_SIGTERM": ("step=8,signal=KILL", "signal"),
    }
    for var, (value, needle) in bad.items():
        with pytest.raises(ChaosConfigError, match=var) as caught:
            parse_faults({var: value, "HPCPIPE_CHAOS_DIR": str(tmp_path)})
        assert needle in str(caught.value)
    with pytest.raises(ChaosConfigError, match="needs HPCPIPE_CHAOS_DIR"):
        parse_faults({"HPCPIPE_CHAOS_SAVE": "step=8"})


def test_kill_group_also_kills_descendants_in_their_own_session() -> None:
    # The child starts a grandchild in a new session (as torch's elastic agent starts workers).
    script = (
        "import subprocess, sys, time\n"
        "sleep = [sys.executable, '-c', 'import time; time.sleep(600)']\n"
        "p = subprocess.Popen(sleep, start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    assert grandchild in jobs.descendants(proc.pid)
    jobs.kill_group(proc)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{grandchild}").exists() and _state(grandchild) != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{grandchild}").exists() or _state(grandchild) == "Z"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return "gone"


def test_resume_runs_only_the_missing_trials_of_the_same_seed(tmp_path: Path) -> None:
    path = _file(tmp_path, "- {name: fine, kind: always_pass}")
    out = tmp_path / "out"
    assert run_cli("chaos", "run", str(path), "-n", "2", "--out", str(out), "--no-progress").returncode == 0
    more = run_cli("chaos", "run", str(path), "-n", "3", "--out", str(out), "--resume", "--no-progress")
    assert more.returncode == 0, more.stderr
    assert "1/1 trials recovered (2 recorded before, skipped)" in more.stderr
    rows = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert [r["trial"] for r in rows] == [0, 1, 2]
    assert "| fine | always_pass | 3 | 3/3 |" in (out / "chaos.md").read_text()  # planned anew: 3
    other = run_cli("chaos", "run", str(path), "--seed", "9", "--out", str(out), "--resume", "--no-progress")
    assert other.returncode == 2 and "give the same scenarios and --seed" in other.stderr


def test_resume_still_fails_on_the_failures_recorded_before(tmp_path: Path) -> None:
    path = _file(tmp_path, "- {name: broken, kind: must_fail}")
    out = tmp_path / "out"
    assert run_cli("chaos", "run", str(path), "-n", "1", "--out", str(out), "--no-progress").returncode == 1
    again = run_cli("chaos", "run", str(path), "-n", "1", "--out", str(out), "--resume", "--no-progress")
    assert again.returncode == 1, again.stderr  # nothing new ran; the recorded failure stands


def test_an_out_that_is_a_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = _file(tmp_path, "- {name: fine, kind: always_pass}")
    (tmp_path / "taken").write_text("")
    proc = run_cli("chaos", "run", str(path), "--out", str(tmp_path / "taken"), "--no-progress")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: --out {tmp_path / 'taken'}: cannot create it (File exists)"
    ], proc.stderr


def test_the_disk_full_scenario_is_refused_up_front_without_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of its trials failed, counted as a recovery that did not happen."""
    from typer.testing import CliRunner

    from hpcpipe.cli import chaos
    from hpcpipe.cli.app import app

    monkeypatch.setattr(chaos.os, "geteuid", lambda: 1000)
    out = tmp_path / "out"
    # The whole shipped file runs without it (the docs' first command), saying so.
    seen: list[list[str]] = []
    skipped: list[dict[str, str]] = []
    monkeypatch.setattr(
        "hpcpipe.chaos.runner.run_plan",
        lambda plan, progress: (seen.append([s.name for s in plan.scenarios]), skipped.append(plan.skipped)),
    )
    monkeypatch.setattr(chaos, "_print_report", lambda out: type("R", (), {"ok": True})())
    monkeypatch.setattr("hpcpipe.launch.zygote.prestart", lambda imports: None)
    shipped = CliRunner().invoke(app, ["chaos", "run", "shipped", "--out", str(tmp_path / "all")])
    assert shipped.exit_code == 0, shipped.output
    assert "skipped disk-full" in shipped.output and seen and "disk-full" not in seen[0] and len(seen[0]) > 10
    assert list(skipped[0]) == ["disk-full"]  # recorded in run.json, and chaos.md names it
    result = CliRunner().invoke(app, ["chaos", "run", "shipped", "--only", "disk-full", "--out", str(out)])
    refusal = str(result.exception)  # a UserError: one line, exit 2, under hpcpipe's own main
    assert (
        type(result.exception).__name__ == "UserError"
        and "disk-full mounts a small tmpfs, which needs root" in refusal
    )
    assert not out.exists()
