"""hpcpipe.chaos.jobs: the loss comparison against the uninterrupted reference run."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from hpcpipe.chaos import jobs
from hpcpipe.chaos.scenario import Scenario, TrialContext, trial_rng

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(
    ("reference", "got", "rel", "lost"),
    [
        ({1: 5.0, 2: 4.9}, {1: 5.0, 2: 4.9}, 0.0, []),
        ({1: 5.0, 2: 4.9}, {1: 5.0, 2: NAN}, 0.0, [2]),  # NaN > tol is False: it matched
        ({1: 5.0, 2: 4.9}, {1: 5.0, 2: NAN}, 1e-3, [2]),
        ({1: 5.0, 2: NAN}, {1: 5.0, 2: NAN}, 0.0, [2]),
        ({1: 5.0, 2: INF}, {1: 5.0, 2: INF}, 1e-3, [2]),
        ({1: 5.0, 2: 4.9}, {1: 5.0, 2: -INF}, 1e-3, [2]),
        ({1: 5.0, 2: 4.9}, {1: 5.0}, 0.0, [2]),
        ({1: 5.0, 2: 4.9}, {1: 5.0, 2: 4.9004}, 1e-3, []),
    ],
)
def test_a_non_finite_or_missing_loss_is_lost(
    reference: dict[int, float], got: dict[int, float], rel: float, lost: list[int]
) -> None:
    assert jobs.lost_steps(reference, got, rel) == lost


def _ctx(tmp_path: Path, *sets: str) -> TrialContext:
    scenario = Scenario.model_validate({"name": "k", "kind": "kill_rank", "set": list(sets)})
    return TrialContext(scenario, 0, 0, trial_rng(0, "k", 0), tmp_path / "work", tmp_path / "shared")


def test_every_step_is_logged_whatever_the_scenario_sets(tmp_path: Path) -> None:
    """The scenario's sets came after observe.log_every=1: 1000 left the reference with no row."""
    assert jobs.job_config(_ctx(tmp_path, "observe.log_every=1000")).observe.log_every == 1


def _fake_reference(monkeypatch: pytest.MonkeyPatch, steps: list[int]) -> list[list[str]]:
    """``hpcpipe train`` of the reference, as if it logged a loss at ``steps``; the calls made."""
    calls: list[list[str]] = []

    def train(args: list[str], cwd: Path, *rest: object, **kwargs: object) -> subprocess.CompletedProcess:
        calls.append(args)
        (cwd / "reference").mkdir(parents=True)
        rows = [{"step": s, "loss": 5.0 - s / 10} for s in steps]
        (cwd / "reference" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(jobs, "run_hpcpipe", train)
    return calls


@pytest.mark.parametrize(
    ("cached", "message"),
    [
        ({}, "logged no loss"),
        ({"10": 4.0, "20": 3.0}, r"a loss for steps \[10, 20\] only"),
        ({"1": 5.0, "3": 4.0}, r"a loss for steps \[1, 3\] only"),
    ],
)
def test_a_reference_without_every_step_fails_the_trial(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    cached: dict,
    message: str,
) -> None:
    """An empty reference compared nothing: any resumed run, one with no rows too, matched it.
    One cached before every step was logged (an older hpcpipe, found under --resume) is trained
    again: it failed every trial of its scenarios, not saying to delete OUT/shared/references."""
    ctx = _ctx(tmp_path)
    key = jobs.job_config(ctx, f"parallel.nproc={ctx.scenario.nproc}").training_hash()[:16]
    cache = ctx.shared / "references" / f"{key}.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps(cached))
    calls = _fake_reference(monkeypatch, [1, 2])
    assert jobs.reference_losses(ctx) == {1: 4.9, 2: 4.8}
    assert len(calls) == 1 and json.loads(cache.read_text()) == {"1": 4.9, "2": 4.8}
    assert capsys.readouterr().err == (
        f"chaos: {cache}: a cached reference without every step's loss; training it again\n"
    )
    assert jobs.reference_losses(ctx) == {1: 4.9, 2: 4.8} and len(calls) == 1  # cached now

    cache.unlink()
    _fake_reference(monkeypatch, [int(k) for k in cached])  # a fresh reference as thin fails
    with pytest.raises(RuntimeError, match=message):
        jobs.reference_losses(ctx)
    assert not cache.exists()


def test_a_loss_that_is_not_a_number_reads_nan(tmp_path: Path) -> None:
    rows = [{"step": 0, "val_loss": 5.0}, {"step": 1, "loss": 5.0}, {"step": 2, "loss": None}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = jobs.losses(tmp_path)
    assert found[1] == 5.0 and math.isnan(found[2])
