"""`hpcpipe plan goodput`: Young/Daly intervals, the closed-form goodput, its Monte-Carlo check,
the headroom to 5%, the costs read from a run directory, and the CLI's one-line errors."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from hpcpipe.config import load_config
from hpcpipe.layout import RunLayout
from hpcpipe.plan.closed_form import checkpoint_share, daly_interval, goodput, young_interval
from hpcpipe.plan.failures import DEFAULT_GPU_MTBF_HOURS
from hpcpipe.plan.goodput import SIM_TOLERANCE
from hpcpipe.plan.headroom import delta_at_loss, loss_at_optimum, restart_at_loss
from hpcpipe.plan.inputs import DEFAULT_RESTART_S, GivenTimes, resolve_inputs
from hpcpipe.plan.measured import DURABLE, FAST, read_run_times
from hpcpipe.plan.simulate import simulate_goodput

# -- closed form ---------------------------------------------------------------------------------


def test_young_and_daly_on_a_hand_case() -> None:
    # δ = 50 s, M = 3600 s. Young: sqrt(2 · 50 · 3600) = sqrt(360000) = 600 s.
    assert young_interval(50.0, 3600.0) == pytest.approx(600.0)
    # Daly: δ/(2M) = 50/7200 = 1/144, sqrt = 1/12.
    # τ = 600 · (1 + (1/3)(1/12) + (1/9)(1/144)) − 50 = 600 · (1 + 1/36 + 1/1296) − 50
    #   = 600 + 16.6667 + 0.46296 − 50 = 567.1296 s
    assert daly_interval(50.0, 3600.0) == pytest.approx(567.12963, abs=1e-4)
    # δ ≥ 2M: Daly's interval is M itself.
    assert daly_interval(7200.0, 3600.0) == 3600.0


def test_goodput_on_a_hand_case() -> None:
    # M = 1000 s, τ = 90 s, δ = 10 s, R = 0: E = 1000 · (e^{0.1} − 1) = 1000 · 0.1051709 = 105.1709 s
    # goodput = 90 / 105.1709 = 0.855750; the checkpoint's share = 10 / 105.1709 = 0.095083.
    assert float(goodput(90.0, 10.0, 0.0, 1000.0)) == pytest.approx(0.855750, abs=1e-6)
    assert checkpoint_share(90.0, 10.0, 0.0, 1000.0) == pytest.approx(0.095083, abs=1e-6)
    # R = 100 s multiplies E by e^{0.1} = 1.1051709: E = 116.2318 s, goodput = 90 / 116.2318 = 0.774315.
    assert float(goodput(90.0, 10.0, 100.0, 1000.0)) == pytest.approx(0.774315, abs=1e-6)
    # Without failures (M -> inf) goodput is τ / (τ + δ) = 0.9.
    assert float(goodput(90.0, 10.0, 100.0, 1e15)) == pytest.approx(0.9)


def test_daly_interval_is_the_optimum_of_the_closed_form() -> None:
    mtbf, delta, restart = 11_135.0, 5.0, 660.0  # 16,384 GPUs at Llama 3's rate
    taus = daly_interval(delta, mtbf) * pytest.importorskip("numpy").linspace(0.8, 1.2, 41)
    best = taus[int(goodput(taus, delta, restart, mtbf).argmax())]
    assert best == pytest.approx(daly_interval(delta, mtbf), rel=0.011)  # the grid's step is 1%


# -- simulation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "delta", "restart"),
    [(16_384, 5.0, 660.0), (4_096, 300.0, 900.0), (16, 2.0, 90.0)],
)
def test_simulation_agrees_with_the_closed_form(gpus: int, delta: float, restart: float) -> None:
    mtbf = DEFAULT_GPU_MTBF_HOURS * 3600.0 / gpus
    tau = daly_interval(delta, mtbf)
    sim = simulate_goodput(tau, delta, restart, mtbf, horizon_s=10 * 86400.0, replicas=300, seed=1)
    assert sim is not None
    closed = float(goodput(tau, delta, restart, mtbf))
    assert abs(sim.goodput - closed) / closed <= SIM_TOLERANCE
    assert abs(sim.goodput - closed) <= 5 * sim.stderr + 1e-12  # and within its sampling error


def test_simulation_without_failures_is_exact() -> None:
    # M = 1e15 s: no failure in 10 days, so each replica keeps τ of every τ + δ.
    sim = simulate_goodput(90.0, 10.0, 100.0, 1e15, horizon_s=10 * 86400.0, replicas=3, seed=0)
    assert sim is not None and sim.goodput == pytest.approx(0.9) and sim.segments == 8640


# -- headroom ------------------------------------------------------------------------------------


def test_headroom_hits_the_budget() -> None:
    mtbf = 11_135.0
    delta = delta_at_loss(mtbf)
    assert loss_at_optimum(delta, 0.0, mtbf) == pytest.approx(0.05)
    assert delta == pytest.approx(0.05**2 / 2 * mtbf, rel=0.05)  # loss ≈ sqrt(2 δ / M)
    restart = restart_at_loss(5.0, mtbf)
    assert restart is not None and loss_at_optimum(5.0, restart, mtbf) == pytest.approx(0.05)
    assert restart_at_loss(2 * delta, mtbf) is None  # the checkpoints alone lose more than 5%


# -- measured inputs -----------------------------------------------------------------------------


def _jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run that trained 20 steps of 1 s, saved at 10 and 20, failed, and resumed at 20."""
    run = tmp_path / "run"
    run.mkdir()
    sets = ["checkpoint.every_steps=10", f"checkpoint.durable_dir={tmp_path / 'durable'}"]
    layout = RunLayout(run)
    layout.config.write_text(load_config("tiny", [*sets, "checkpoint.durable_every_steps=4"]).to_yaml())
    _jsonl(
        layout.events,
        [
            {"time": 100.0, "event": "group_start", "restart_count": 0},
            {"time": 111.0, "event": "checkpoint_committed", "step": 10, "write_s": 2.0},
            {"time": 112.0, "event": "checkpoint_durable_copied", "step": 10, "copy_s": 6.0},
            {"time": 122.0, "event": "checkpoint_committed", "step": 20, "write_s": 4.0},
            # the agent restarted the group; these two are the new attempt's, not signs of life
            {"time": 130.0, "event": "restart", "restart_count": 1},
            {"time": 130.0, "event": "group_start", "restart_count": 1},
            {"time": 134.0, "event": "checkpoint_restored", "step": 20, "tier": "fast", "load_s": 3.0},
        ],
    )
    rows = [{"step": s, "loss": 1.0, "time": 100.0 + s, "step_time_s": 1.0} for s in range(1, 21)]
    rows += [{"step": 21, "loss": 1.0, "time": 136.0, "step_time_s": 1.0}]
    _jsonl(layout.metrics, [{"step": 0, "val_loss": 2.0}, *rows])
    return run


def test_reads_medians_restart_and_intervals(run_dir: Path) -> None:
    times = read_run_times(run_dir)
    assert times.save[FAST].seconds == 3.0  # median of write_s 2 and 4
    assert times.save[DURABLE].seconds == 6.0 and times.restore[FAST].seconds == 3.0
    assert DURABLE not in times.restore
    # last sign of the failed attempt 122 s (its commit), first step after the restart 136 s:
    # 136 − 122 − 3 (restore) − 1 step × 1 s = 10 s
    assert times.restart is not None and times.restart.seconds == pytest.approx(10.0)
    assert times.step_time_s == 1.0
    # every 10 steps of 1 s; durable when the step is a multiple of 4 too: lcm(10, 4) = 20 steps
    assert times.intervals == {FAST: 10.0, DURABLE: 20.0}


def test_a_run_whose_recipe_module_raises_on_import_still_gives_its_times(run_dir: Path) -> None:
    """A traceback: the recipe's module (one of its imports missing here) is not needed for times."""
    config = RunLayout(run_dir).config
    config.write_text(config.read_text().replace("recipe: gpt", "recipe: tests.recipe_raises_on_import:A"))
    times = read_run_times(run_dir)
    assert times.save[FAST].seconds == 3.0 and times.intervals == {}
    assert len(times.notes) == 1 and "recipe_raises_on_import.py:3" in times.notes[0], times.notes


def test_restart_starts_when_the_agent_saw_the_failure(run_dir: Path) -> None:
    event = {"time": 129.5, "event": "agent_restart", "restart": 1, "failure_seen": 125.0}
    with RunLayout(run_dir).events.open("a") as f:
        f.write(json.dumps(event) + "\n")
    restart = read_run_times(run_dir).restart
    # 136 (first step) − 125 (failure seen) − 3 (restore) − 1 step × 1 s = 7 s
    assert restart is not None and restart.seconds == pytest.approx(7.0)
    assert "failure seen by the agent" in restart.source


def test_async_saves_charge_the_blocking_part(run_dir: Path) -> None:
    with RunLayout(run_dir).events.open("a") as f:
        for blocking in (0.5, 0.7):
            f.write(json.dumps({"time": 140.0, "event": "checkpoint_staged", "blocking_s": blocking}) + "\n")
    assert read_run_times(run_dir).save[FAST].seconds == pytest.approx(0.6)


def test_given_times_win_and_defaults_say_so(run_dir: Path) -> None:
    inputs = resolve_inputs(GivenTimes(save_s=1.0), read_run_times(run_dir))
    fast, durable = inputs.tiers
    assert (fast.save.seconds, fast.save.source) == (1.0, "given: --save-s")
    assert fast.restore.source.startswith("measured") and inputs.restart.source.startswith("measured")
    assert durable.restore.seconds == 6.0 and durable.restore.source.startswith("default")
    bare = resolve_inputs(GivenTimes(save_s=2.0), None)
    assert [t.tier for t in bare.tiers] == [FAST] and bare.restart.seconds == DEFAULT_RESTART_S


# -- the CLI -------------------------------------------------------------------------------------


def _main(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """``hpcpipe plan goodput ARGS`` in this process, through ``cli/app.py main``; the exit code."""
    from hpcpipe.cli.app import main

    monkeypatch.setattr(sys, "argv", ["hpcpipe", "plan", "goodput", *args])
    with pytest.raises(SystemExit) as stop:
        main()
    return int(stop.value.code or 0)


def test_plans_a_run_directory(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _main(monkeypatch, "--run", str(run_dir), "--gpus", "16,16384", "--replicas", "100", "--days", "5")
    out = capsys.readouterr().out
    assert code == 0, out
    plan = json.loads((RunLayout(run_dir).plan / RunLayout.GOODPUT_JSON).read_text())
    assert [(r["gpus"], r["tier"]) for r in plan["rows"]] == [
        (16, FAST),
        (16, DURABLE),
        (16384, FAST),
        (16384, DURABLE),
    ]
    assert plan["max_sim_gap"] <= SIM_TOLERANCE and "agree" in out
    assert (
        plan["rows"][0]["current_tau_s"] == 10.0
        and (RunLayout(run_dir).plan / RunLayout.GOODPUT_PLOT).is_file()
    )
    assert math.isclose(plan["rows"][2]["job_mtbf_s"], DEFAULT_GPU_MTBF_HOURS * 3600 / 16384)


def test_help_teaches(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich sizes the help from it
    assert _main(monkeypatch, "--help") == 0
    out = capsys.readouterr().out
    assert "Examples" in out and "--gpu-mtbf-hours" in out and "419" in out and "50,677" in out


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--save-s", "1", "--gpu-mtbf-hours", "0"], "--gpu-mtbf-hours"),
        (["--save-s", "1", "--gpu-mtbf-hours", "-5"], "--gpu-mtbf-hours"),
        (["--save-s", "1", "--gpus", "0"], "--gpus"),
        (["--save-s", "1", "--gpus", "1024,-8"], "--gpus"),
        ([], "--save-s"),
        (["--run", "no/such/run"], "no/such/run"),
        (["--run", "EMPTY"], "events.jsonl"),
        (["--save-s", "-2"], "--save-s"),
        (["--save-s", "1", "--restart-s", "nan"], "--restart-s"),
        (["--save-s", "1", "--days", "inf"], "--days"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str],
    names: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [str(tmp_path) if a == "EMPTY" else a for a in args]  # a run directory that never saved
    monkeypatch.chdir(tmp_path)
    assert _main(monkeypatch, *args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and names in err, err
    assert not (tmp_path / "goodput-plan").exists()
