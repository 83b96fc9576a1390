"""Scaling-law fits recover known parameters from noisy synthetic runs; inputs from CSVs and run dirs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from hpcpipe.bench.scaling_inputs import load_observations, read_csv
from hpcpipe.bench.scaling_law import Points, chinchilla_fit, compute_optimal, fit_all, power_law_fit
from hpcpipe.config import load_config
from hpcpipe.errors import UserError

# Hoffmann et al. (2022), approach 3's fitted values.
TRUE = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


def synthetic(noise: float, seed: int = 0) -> Points:
    rng = np.random.default_rng(seed)
    n, d = np.meshgrid(np.logspace(7, 9.5, 6), np.logspace(9, 11.5, 6))
    n, d = n.ravel(), d.ravel()
    loss = TRUE["E"] + TRUE["A"] / n ** TRUE["alpha"] + TRUE["B"] / d ** TRUE["beta"]
    return Points(n, d, loss * np.exp(rng.normal(0.0, noise, n.size)))


def test_chinchilla_fit_recovers_known_parameters() -> None:
    fit = chinchilla_fit(synthetic(noise=0.005))
    assert fit["alpha"] == pytest.approx(TRUE["alpha"], rel=0.1)
    assert fit["beta"] == pytest.approx(TRUE["beta"], rel=0.1)
    assert fit["E"] == pytest.approx(TRUE["E"], rel=0.05)
    exact = chinchilla_fit(synthetic(noise=0.0), starts=4)
    for key, value in TRUE.items():
        assert exact[key] == pytest.approx(value, rel=1e-3), key


def test_bootstrap_intervals_cover_the_truth() -> None:
    result = fit_all(synthetic(noise=0.005, seed=1), flops=1e21, bootstrap=30, seed=0)
    assert result["bootstrap"] == 30 and result["n_points"] == 36
    for key in ("alpha", "beta", "E"):
        low, high = result["intervals"][f"chinchilla.{key}"]
        assert low <= TRUE[key] <= high, (key, low, high)
    truth = compute_optimal(TRUE, 1e21)
    assert result["compute_optimal"]["params"] == pytest.approx(truth["params"], rel=0.2)
    low, high = result["intervals"]["compute_optimal.params"]
    assert low < truth["params"] < high
    again = fit_all(synthetic(noise=0.005, seed=1), flops=1e21, bootstrap=30, seed=0)
    assert again["intervals"] == result["intervals"]  # seeded: same inputs, same report


def test_kaplan_power_law_recovers_exponent() -> None:
    rng = np.random.default_rng(2)
    n = np.logspace(6, 10, 12)
    loss = (8.8e13 / n) ** 0.076 * np.exp(rng.normal(0, 0.003, n.size))  # Kaplan et al.'s L(N)
    fit = power_law_fit(n, loss)
    assert fit["alpha"] == pytest.approx(0.076, rel=0.05)
    assert np.log10(fit["x_c"]) == pytest.approx(np.log10(8.8e13), abs=0.5)


def test_compute_optimal_minimises_loss_at_fixed_flops() -> None:
    flops = 1e22
    best = compute_optimal(TRUE, flops)
    assert 6 * best["params"] * best["tokens"] == pytest.approx(flops)
    n_grid = best["params"] * np.logspace(-1, 1, 401)
    loss = TRUE["E"] + TRUE["A"] / n_grid ** TRUE["alpha"] + TRUE["B"] / (flops / 6 / n_grid) ** TRUE["beta"]
    assert n_grid[np.argmin(loss)] == pytest.approx(best["params"], rel=0.02)


def test_too_few_or_degenerate_points() -> None:
    with pytest.raises(UserError, match="more runs than"):
        fit_all(Points(np.ones(3), np.ones(3), np.ones(3)), None, 0, 0)
    with pytest.raises(UserError, match="two model sizes"):
        fit_all(Points(np.full(6, 1e6), np.logspace(8, 9, 6), np.ones(6)), None, 0, 0)


def test_csv_reading_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "runs.csv"
    good.write_text("name,params,tokens,loss\na,1e6,2e9,3.5\nb,2e6,2e9,3.2\n")
    assert [(p["params"], p["loss"]) for p in read_csv(good)] == [(1e6, 3.5), (2e6, 3.2)]
    (tmp_path / "nocol.csv").write_text("params,loss\n1,2\n")
    with pytest.raises(UserError, match=re.escape("nocol.csv: missing column")):
        read_csv(tmp_path / "nocol.csv")
    (tmp_path / "text.csv").write_text("params,tokens,loss\n1e6,lots,3\n")
    with pytest.raises(UserError, match=re.escape("text.csv:2: params, tokens and loss must be numbers")):
        read_csv(tmp_path / "text.csv")
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(UserError, match=re.escape("binary.csv")):
        read_csv(tmp_path / "binary.csv")


def fake_run(
    root: Path, name: str, layers: int, steps: int, val_loss: float | None, finished_at: int | None = -1
) -> Path:
    """A run trained to ``finished_at`` (default: its steps; None: stopped) and evaluated at the end."""
    cfg = load_config("tiny", [f"run.name={name}", f"model.n_layers={layers}", f"train.steps={steps}"])
    run = root / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(cfg.to_yaml())
    rows = [{"step": steps, "loss": 3.0}] + ([{"step": steps, "val_loss": val_loss}] if val_loss else [])
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished_at is not None:
        end = {"event": "run_finished", "step": steps if finished_at == -1 else finished_at}
        (run / "events.jsonl").write_text(json.dumps(end) + "\n")
    return run


def test_run_directories(tmp_path: Path) -> None:
    from hpcpipe.models.gpt import GPT

    fake_run(tmp_path / "runs", "a", 2, 100, 2.5)
    fake_run(tmp_path / "runs", "b", 4, 50, 2.4)
    fake_run(tmp_path / "runs", "unfinished", 2, 10, None)
    points, skipped = load_observations([str(tmp_path / "runs")])
    assert [p["source"].rsplit("/", 1)[1] for p in points] == ["a", "b"]
    assert points[0]["tokens"] == 100 * 8 * 32  # steps x global batch x seq_len
    model = load_config("tiny", ["model.n_layers=4"]).model
    assert points[1]["params"] == GPT(model, 257).num_params(non_embedding=True)
    assert len(skipped) == 1 and "unfinished: metrics.jsonl has no val_loss" in skipped[0]
    # A ResNet run got the GPT's N from its config's unused model section, and "tokens".
    vision = tmp_path / "runs" / "vision"
    vision.mkdir()
    vision_cfg = load_config("resnet-tiny")
    (vision / "config.yaml").write_text(vision_cfg.to_yaml())
    (vision / "events.jsonl").write_text(
        json.dumps({"event": "run_finished", "step": vision_cfg.train.steps})
    )
    (vision / "metrics.jsonl").write_text(json.dumps({"step": 4, "val_loss": 1.5}) + "\n")
    points, skipped = load_observations([str(tmp_path / "runs")])
    assert len(points) == 2 and any(
        "'resnet-cifar' gives no parameter and token counts" in s for s in skipped
    )
    (vision / "config.yaml").unlink()
    with pytest.raises(UserError, match=re.escape("unfinished: metrics.jsonl has no val_loss")):
        load_observations([str(tmp_path / "runs" / "unfinished")])
    with pytest.raises(UserError, match="neither a run directory nor a directory of runs"):
        load_observations([str(tmp_path)])


def test_only_runs_trained_to_their_end_and_evaluated_after_step_0_are_observations(tmp_path: Path) -> None:
    """`fit runs/` took a stopped run, and one evaluated only at step 0 as D = 0."""
    fake_run(tmp_path / "runs", "a", 2, 100, 2.5)
    fake_run(tmp_path / "runs", "stopped", 2, 100, 2.9, finished_at=None)
    fake_run(tmp_path / "runs", "shorter", 2, 100, 2.9, finished_at=40)  # an earlier, shorter run's end
    zero = fake_run(tmp_path / "runs", "zero", 2, 100, None)
    (zero / "metrics.jsonl").write_text(json.dumps({"step": 0, "val_loss": 5.5}) + "\n")
    points, skipped = load_observations([str(tmp_path / "runs")])
    assert [p["source"].rsplit("/", 1)[1] for p in points] == ["a"]
    assert sorted(s.split(": ", 1)[1] for s in skipped) == [
        "its last val_loss is at step 0, before any training",
        "not finished (events.jsonl has no run_finished at train.steps=100)",
        "not finished (events.jsonl has no run_finished at train.steps=100)",
    ]


def test_a_run_whose_recipe_module_raises_on_import_is_skipped_with_why(tmp_path: Path) -> None:
    """`fit runs/` ended in a traceback on that one run, and fitted none of the others."""
    fake_run(tmp_path / "runs", "a", 2, 100, 2.5)
    buggy = fake_run(tmp_path / "runs", "buggy", 2, 100, 2.4)
    config = buggy / "config.yaml"
    config.write_text(config.read_text().replace("recipe: gpt", "recipe: tests.recipe_raises_on_import:A"))
    points, skipped = load_observations([str(tmp_path / "runs")])
    assert [p["source"].rsplit("/", 1)[1] for p in points] == ["a"]
    assert len(skipped) == 1 and skipped[0].startswith(f"{buggy}: run.recipe "), skipped
    assert "recipe_raises_on_import.py:3: division by zero" in skipped[0], skipped


def test_cli_fit_and_bad_inputs(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pts = synthetic(noise=0.003)
    csv = tmp_path / "sweep.csv"
    csv.write_text(
        "params,tokens,loss\n"
        + "".join(f"{n},{d},{loss}\n" for n, d, loss in zip(pts.params, pts.tokens, pts.loss, strict=True))
    )
    png = tmp_path / "fit.png"
    proc = cli(
        "scaling-law",
        "fit",
        str(csv),
        "--flops",
        "1e21",
        "--bootstrap",
        "5",
        "--png",
        str(png),
        "--json",
        "-",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["chinchilla"]["alpha"] == pytest.approx(TRUE["alpha"], rel=0.1)
    assert png.stat().st_size > 10_000 and result["compute_optimal"]["flops"] == 1e21
    for args, needle in (
        ([str(tmp_path / "missing.csv")], "missing.csv: no such file or directory"),
        ([str(tmp_path)], "neither a run directory nor a directory of runs"),
    ):
        proc = cli("scaling-law", "fit", *args)
        assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_the_fit_says_how_well_it_predicts_runs_it_did_not_see() -> None:
    """Five parameters through few points fit anything: an outlier gave alpha 23.8, unremarked."""
    clean = fit_all(synthetic(noise=0.005, seed=1), flops=None, bootstrap=0, seed=0)["quality"]
    assert clean["log_rmse"] < 0.01 and clean["loo_log_rmse"] < 0.01
    points = synthetic(noise=0.005, seed=1)
    points.loss[7] *= 3.0  # one diverged-looking run
    spoiled = fit_all(points, flops=None, bootstrap=0, seed=0)["quality"]
    assert spoiled["loo_log_rmse"] > 10 * clean["loo_log_rmse"]


def test_too_few_or_non_finite_points_are_refused() -> None:
    points = synthetic(noise=0.0)
    few = points.take(np.array([0, 7, 14, 21, 28]))  # as many runs as parameters
    with pytest.raises(UserError, match="need more runs than L\\(N, D\\)'s 5 parameters, got 5"):
        fit_all(few, flops=None, bootstrap=0, seed=0)
    points.loss[3] = float("nan")
    with pytest.raises(UserError, match="must be finite"):
        fit_all(points, flops=None, bootstrap=0, seed=0)
