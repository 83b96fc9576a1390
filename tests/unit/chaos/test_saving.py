"""The saving scenarios' checks and clock, with the runs faked: they must fail a recovery that
lost committed checkpoints or started over, and time the new start, not the first run."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from hpcpipe.chaos import jobs, saving
from hpcpipe.chaos.scenario import Scenario, TrialContext, trial_rng

REFERENCE = {s: 5.0 - s * 0.01 for s in range(1, 21)}


def _context(tmp_path: Path, kind: str) -> TrialContext:
    scenario = Scenario(name=kind, kind=kind, set=["checkpoint.every_steps=4"])
    return TrialContext(
        scenario, 0, 0, trial_rng(0, scenario.name, 3), tmp_path / "work", tmp_path / "shared"
    )


def _fake_runs(monkeypatch: pytest.MonkeyPatch, first_code: int, resumed_from: int | None) -> list[float]:
    """The first run fails with ``first_code`` after logging every step; the second logs every
    step again, one second after it starts, resuming from ``resumed_from`` (None: from scratch)."""
    starts: list[float] = []

    def train(ctx: TrialContext, name: str, *args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        starts.append(time.time())
        run = ctx.work / name
        run.mkdir(parents=True, exist_ok=True)
        later = 1.0 if len(starts) > 1 else 0.0
        with (run / "metrics.jsonl").open("a") as fh:
            for step, loss in REFERENCE.items():
                fh.write(json.dumps({"step": step, "loss": loss, "time": time.time() + later}) + "\n")
        with (run / "events.jsonl").open("a") as fh:
            if len(starts) > 1 and resumed_from is not None:
                fh.write(json.dumps({"event": "resumed", "step": resumed_from, "time": time.time()}) + "\n")
            if len(starts) == 1 and first_code == 75:
                fh.write(json.dumps({"event": "preempted", "step": 9, "time": time.time()}) + "\n")
        return subprocess.CompletedProcess([], first_code if len(starts) == 1 else 0, "", "")

    monkeypatch.setattr(jobs, "train", train)
    monkeypatch.setattr(jobs, "reference_losses", lambda ctx, *a, **k: REFERENCE)
    return starts


def test_a_killed_save_that_lost_every_checkpoint_and_started_over_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A from-scratch rerun reproduces the reference bitwise: lost steps alone passed it."""
    _fake_runs(monkeypatch, first_code=-9, resumed_from=None)
    ctx = _context(tmp_path, "kill_during_save")
    result = saving.kill_during_save(ctx)
    assert not result.recovered
    assert "was lost" in result.detail or "resumed from [], expected" in result.detail


def test_a_sigterm_in_a_save_is_timed_from_the_new_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run's own next step (logged after the fault) read as the recovery: 0.03 s."""
    starts = _fake_runs(monkeypatch, first_code=75, resumed_from=None)
    ctx = _context(tmp_path, "sigterm_during_save")
    result = saving.sigterm_during_save(ctx)
    assert result.ttr_s is not None and result.ttr_s == pytest.approx(1.0, abs=0.5)  # the second start's
    assert len(starts) == 2
    assert not result.recovered  # the faked run committed no checkpoint
