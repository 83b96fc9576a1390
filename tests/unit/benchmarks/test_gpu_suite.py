"""benchmarks/gpu_suite.py and its gpu_suite_*.py modules: the budget shares, a failing step among
others, the OOM micro-batch choice, the scrape parser, the one-line reasons. The steps themselves
run in tests/e2e/test_gpu_suite_dry_run.py."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from tests.helpers import IDLE_RANKS

# The suite's modules import one another by name, as a script's folder is on sys.path when it runs.
sys.path.append(str(Path(__file__).resolve().parents[3] / "benchmarks"))
import gpu_suite
import gpu_suite_run as gsr
from gpu_suite_proc import parse_metrics
from gpu_suite_train_steps import choose_oom_micro_batch


def _suite(tmp_path: Path, break_step: str | None = None) -> gsr.Suite:
    return gsr.Suite(
        gpu=False,
        out=tmp_path,
        prepared=tmp_path / "prepared",
        python=sys.executable,
        gpus=0,
        smollm2=tmp_path / "none.gguf",
        break_step=break_step,
    )


def test_a_failing_step_is_recorded_and_the_next_one_still_runs(tmp_path: Path) -> None:
    script = tmp_path / "fine.py"
    script.write_text("print('fine')\n")

    def ok(run: gsr.StepRun) -> gsr.Outcome:
        run.run([], script=script)  # a real subprocess, logged
        return gsr.Outcome(gsr.PASS, "fine")

    def boom(run: gsr.StepRun) -> gsr.Outcome:
        raise KeyError("figures")  # a bug, not a StepFailed: still one line, still the rest run

    def missing(run: gsr.StepRun) -> gsr.Outcome:
        raise gsr.StepSkipped("needs deepspeed")

    steps = [gsr.Step("a", "A", 1, boom), gsr.Step("b", "B", 1, missing), gsr.Step("c", "C", 1, ok)]
    records = gpu_suite.run_suite(_suite(tmp_path), steps, budget=60)
    assert [(r["step"], r["status"]) for r in records] == [("a", "FAIL"), ("b", "SKIP"), ("c", "PASS")]
    assert records[0]["reason"] == "KeyError: 'figures'"
    assert records[1]["reason"] == "needs deepspeed"
    assert records[2]["commands"][0]["rc"] == 0
    assert (tmp_path / records[2]["commands"][0]["log"]).read_text() == "fine\n"
    on_disk = json.loads((tmp_path / "a.json").read_text())
    assert on_disk["status"] == "FAIL" and on_disk["mode"] == "cpu-dry-run"


def test_a_command_that_fails_gives_its_last_line_and_exit_code(tmp_path: Path) -> None:
    run = gsr.StepRun(_suite(tmp_path), "x", time.monotonic() + 30)
    proc, log = run.start([sys.executable, "-c", "import sys; print('working'); sys.exit('error: it broke')"])
    with pytest.raises(gsr.StepFailed, match=r"exited 1: error: it broke$"):
        run.finish(proc, log)
    assert run.commands[0]["rc"] == 1 and (tmp_path / run.commands[0]["log"]).is_file()


def test_a_command_past_its_deadline_is_killed_with_its_group(tmp_path: Path) -> None:
    run = gsr.StepRun(_suite(tmp_path), "slow", time.monotonic() + 1.0)
    started = time.monotonic()
    proc, log = run.start([sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(gsr.StepFailed, match=r"timed out after \d+ s"):
        run.finish(proc, log)
    assert time.monotonic() - started < 20 and proc.poll() is not None


def test_a_forked_hpcpipe_command_past_its_deadline_dies_with_its_workers(tmp_path: Path) -> None:
    """The dry run's ``python -m hpcpipe`` commands fork from hpcpipe's zygote (ForkedCommand): at
    the deadline the whole session goes, the fork server and both ranks with it, and the step
    counts the CPU the zygote reaped."""
    from gpu_suite_proc import ForkedCommand, process_tree

    run = gsr.StepRun(_suite(tmp_path), "forked", time.monotonic() + 15)
    sets = [f"run.out_dir={tmp_path}", "train.steps=1000000", "observe.progress=false"]
    argv = run.argv(["train", "tiny", "--nproc", "2", *[a for s in sets for a in ("--set", s)]])
    proc, log = run.start(argv, IDLE_RANKS)
    assert isinstance(proc, ForkedCommand)
    deadline = time.monotonic() + 20
    while len(process_tree(proc.pid)) < 3 and time.monotonic() < deadline:  # the server and 2 ranks
        time.sleep(0.2)
    tree = process_tree(proc.pid)
    assert len(tree) >= 3, log.read_text()[-2000:]
    run.deadline = time.monotonic() + 1  # 15 s above was room to start; past it, nothing to wait for
    with pytest.raises(gsr.StepFailed, match="timed out after"):
        run.finish(proc, log)
    assert proc.poll() is not None and run.forked_cpu_s > 0
    deadline = time.monotonic() + 20  # SIGTERM first: the ranks leave through their own handlers
    while (left := [pid for pid in tree if Path(f"/proc/{pid}").exists()]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []


def test_the_budget_is_shared_by_weight_and_unused_time_carries_over(tmp_path: Path) -> None:
    def quick(run: gsr.StepRun) -> gsr.Outcome:
        return gsr.Outcome(gsr.PASS, f"{run.left():.0f}")

    steps = [gsr.Step("a", "A", 1, quick), gsr.Step("b", "B", 3, quick), gsr.Step("c", "C", 4, quick)]
    records = gpu_suite.run_suite(_suite(tmp_path), steps, budget=80)
    allowed = [r["timeout_s"] for r in records]
    assert allowed[0] == pytest.approx(10, abs=0.5)  # 80 x 1/8
    assert allowed[1] == pytest.approx(10 + 30, abs=0.5)  # its 30, and a's unused 10
    assert allowed[2] == pytest.approx(80, abs=0.5)  # its 40 and the 40 left: the whole budget


def test_a_spent_budget_fails_the_steps_it_leaves_out(tmp_path: Path) -> None:
    def hog(run: gsr.StepRun) -> gsr.Outcome:
        time.sleep(max(run.left(), 0) + 0.2)
        return gsr.Outcome(gsr.PASS, "late")

    steps = [gsr.Step("a", "A", 1, hog), gsr.Step("b", "B", 0.001, hog)]
    records = gpu_suite.run_suite(_suite(tmp_path), steps, budget=1.5)
    assert records[1]["status"] == "FAIL" and "budget" in records[1]["reason"]


def test_the_broken_step_gets_an_unknown_option(tmp_path: Path) -> None:
    suite = _suite(tmp_path, break_step="compute")
    assert gsr.StepRun(suite, "compute", 0).argv(["bench", "compute"])[-1] == gsr.BREAK_FLAG
    assert gsr.BREAK_FLAG not in gsr.StepRun(suite, "doctor", 0).argv(["doctor"])


def test_the_oom_micro_batch_trains_over_the_memory_and_evaluates_under_it() -> None:
    gib = 2**30
    # H100-like: 80 GiB, 0.75 GiB a sequence to train, 0.3125 GiB to evaluate
    micro = choose_oom_micro_batch(80 * gib, 0.75 * gib, 0.3125 * gib)
    assert micro == 160 and micro * 0.75 >= 1.3 * 80 and micro * 0.3125 <= 0.8 * 80
    assert choose_oom_micro_batch(141 * gib, 0.75 * gib, 0.3125 * gib) == 256
    # training barely heavier than evaluation: no micro-batch does both, None (the step SKIPs)
    assert choose_oom_micro_batch(80 * gib, 0.4 * gib, 0.3125 * gib) is None


def test_prometheus_text_is_parsed_by_series_name() -> None:
    text = (
        "# HELP hpcpipe_steps_total Steps.\n# TYPE hpcpipe_steps_total counter\n"
        'hpcpipe_steps_total{run="r",rank="0"} 12.0\n'
        'hpcpipe_gpu_utilization_ratio{gpu="0"} 0.97\n'
        "hpcpipe_gpu_energy_joules_total 1.5e+06\n"
        "not a sample line\n"
    )
    assert parse_metrics(text) == {
        "hpcpipe_steps_total": 12.0,
        "hpcpipe_gpu_utilization_ratio": 0.97,
        "hpcpipe_gpu_energy_joules_total": 1.5e6,
    }


def test_the_reason_is_the_last_line_without_the_error_box(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("Usage: hpcpipe doctor\n╭─ Error ──╮\n│ No such option: --x │\n╰──────────╯\n\n")
    assert gsr.last_line(log) == "No such option: --x"
    log.write_text("")
    assert gsr.last_line(log) == "(no output)"


def test_unknown_steps_are_refused_with_the_list() -> None:
    with pytest.raises(SystemExit, match=r"unknown step.*nope.*the steps: prepare, doctor"):
        gpu_suite._select(gpu_suite.parse_args(["--only", "gpt,nope"]))
    selected = gpu_suite._select(gpu_suite.parse_args(["--skip", "prepare,doctor"]))
    assert [s.name for s in selected][:2] == ["compute", "gpt"]
