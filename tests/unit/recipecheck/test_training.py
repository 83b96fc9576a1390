"""The parity properties of `hpcpipe recipes check`: losses and gradient norms step by step, and
runs that do not clip (a clip factor's rounding, fed back into the weights, is not a recipe bug)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcpipe.layout import RunLayout
from hpcpipe.recipecheck.job import STEPS, check_job
from hpcpipe.recipecheck.training import check_parity

LOSSES = [2.31, 2.39, 2.86, 2.73, 2.63, 1.63]
NORMS = [83.33, 68.46, 66.20, 47.12, 58.15, 40.17]


def _run(root: Path, name: str, losses: list[float], norms: list[float | None]) -> Path:
    run = root / name
    path = RunLayout(run).metrics
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"step": 0, "val_loss": 2.35}]  # an evaluation row has no training loss
    pairs = enumerate(zip(losses, norms, strict=True))
    rows += [{"step": i + 1, "loss": x, "grad_norm": g} for i, (x, g) in pairs]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_equal_losses_and_norms_within_rounding_pass_and_say_both(tmp_path: Path) -> None:
    single = _run(tmp_path, "single", LOSSES, NORMS)
    other = _run(tmp_path, "fsdp", LOSSES, [n * (1 + 1.2e-6) for n in NORMS])
    detail = check_parity(single, other, "2 FSDP2 ranks", 1e-4)
    assert detail == (
        f"losses of {STEPS} steps within relative 0.0e+00 of 1 process, gradient norms within 1.2e-06 "
        "(tolerance 0.0001)"
    )


def test_a_norm_over_one_shard_only_fails_though_the_losses_agree(tmp_path: Path) -> None:
    """What a norm that forgot to reduce over ranks gives with 2 equal shards: 1/sqrt(2) of it."""
    single = _run(tmp_path, "single", LOSSES, NORMS)
    other = _run(tmp_path, "fsdp", LOSSES, [n / 2**0.5 for n in NORMS])
    with pytest.raises(AssertionError, match=r"2 FSDP2 ranks against 1 process: step 1: grad_norm 58\.9"):
        check_parity(single, other, "2 FSDP2 ranks", 1e-4)


def test_losses_are_compared_first_and_a_missing_norm_is_named(tmp_path: Path) -> None:
    single = _run(tmp_path, "single", LOSSES, NORMS)
    drifted = _run(tmp_path, "ddp", [*LOSSES[:4], 2.64, 1.63], NORMS)
    with pytest.raises(AssertionError, match=r"step 5: loss 2\.64 against 2\.63 \(relative 0\.0038"):
        check_parity(single, drifted, "2 DDP ranks", 1e-4)
    unmeasured = _run(tmp_path, "unmeasured", LOSSES, [None] * STEPS)
    with pytest.raises(AssertionError, match="no training grad_norm at step 1"):
        check_parity(single, unmeasured, "2 DDP ranks", 1e-4)


def test_the_checked_job_does_not_clip_whatever_the_config_says(tmp_path: Path) -> None:
    job = check_job("gpt", None, ["train.grad_clip=1.0"], tmp_path)
    assert job.train.grad_clip == 0.0
    assert "grad_clip: 0.0" in (tmp_path / "job.yaml").read_text()


def test_runs_that_built_other_data_are_named_before_their_losses(tmp_path: Path) -> None:
    """A recipe whose datasets() differ between processes failed parity as '2 DDP ranks: loss
    9.54 against 5.39', blamed on DDP."""
    single = _run(tmp_path, "single", LOSSES, NORMS)
    other = _run(tmp_path, "ddp", [x * 2 for x in LOSSES], NORMS)
    for run, digest in ((single, "a" * 64), (other, "b" * 64)):
        RunLayout(run).lineage.write_text(json.dumps({"dataset_manifest_sha256": digest}))
    with pytest.raises(AssertionError, match=r"built other data than 1 process \(dataset fingerprint bbbb"):
        check_parity(single, other, "2 DDP ranks", 1e-4)


def test_a_failed_run_names_what_its_worker_raised_and_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The detail was the launcher's last line, "error: training workers failed with exit code 1",
    and DDP's own message was only in the log."""
    import subprocess

    from hpcpipe.recipecheck import training

    stderr = (
        "Traceback (most recent call last):\n"
        '  File "/src/variants.py", line 85, in loss\n'
        "    return F.mse_loss(model(x), y)\n"
        "                      ^^^^^^^^\n"
        "RuntimeError: Expected to have finished reduction in the prior iteration before starting a "
        "new one. This error indicates that your module has parameters that were not used in\n"
        "producing loss.\n"
        "agent: worker rank 0 (local rank 0, pid 18481) failed with exit code 1\n"
        "error: training workers failed with exit code 1; run dir: /w/runs/ddp\n"
    )
    failed = subprocess.CompletedProcess(["hpcpipe"], 1, "", stderr)
    monkeypatch.setattr(training, "run_hpcpipe", lambda *a, **k: failed)
    with pytest.raises(training.RunFailed) as err:
        training.train(tmp_path, "ddp", 2, "ddp")
    assert str(err.value) == (
        "ddp run exited 1: RuntimeError: Expected to have finished reduction in the prior iteration before "
        "starting a new one. This error indicates that your module has parameters that were not used in "
        f"(log: {tmp_path}/ddp.err)"
    )
    refused = subprocess.CompletedProcess(["hpcpipe"], 2, "", "error: recipe.hidden: bad value\n")
    monkeypatch.setattr(training, "run_hpcpipe", lambda *a, **k: refused)
    with pytest.raises(training.RunFailed, match=r"^ddp run exited 2: error: recipe.hidden: bad value \(log"):
        training.train(tmp_path, "ddp", 2, "ddp")
