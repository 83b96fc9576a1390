"""Pipeline parallelism (``parallel.pp``) on gloo ranks: the tiny GPT (4 blocks) against one
process under each schedule, composed with FSDP2 (pp 2 x dp 2) and with tensor parallelism
(pp 2 x tp 2) on 4 ranks, exact resume after a SIGKILL, checkpoints resharded into other
layouts, the export, and evaluation through the stages.

Tolerance: the stages see the same micro-batches in the same order as one process's gradient
accumulation; they differ only in the order of floating-point sums (the tied embedding's two
gradient halves are added by an all-reduce, the gradient norm by another). Measured: a relative
2.3e-7 over 20 steps at most, pp 2 x tp 2 (2026-11-28); asserted 1e-5, the issue's bound for fp32.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tests.helpers import assert_follows, assert_steps_close, metric_rows, run_cli, run_events, tiny_job_sets

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

RTOL = 1e-5
FOUR_BLOCKS = "model.n_layers=4"


def _train(
    tmp: Path, name: str, nproc: int, *sets: str, env: dict[str, str] | None = None, restarts: int = 0
):  # type: ignore[no-untyped-def]
    args = tiny_job_sets(tmp, name, FOUR_BLOCKS, "observe.progress=false", "checkpoint.every_steps=10", *sets)
    proc = run_cli(
        "train",
        "tiny",
        "--nproc",
        str(nproc),
        "--max-restarts",
        str(restarts),
        *args,
        cwd=tmp,
        timeout=400,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return tmp / name


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pp")


@pytest.fixture(scope="module")
def runs(tmp: Path) -> dict[str, Path]:
    return {
        "single": _train(tmp, "single", 1),
        "1f1b": _train(tmp, "1f1b", 2, "parallel.pp=2"),
        "pp2_tp2": _train(tmp, "pp2_tp2", 4, "parallel.pp=2", "parallel.tp=2"),
    }


@pytest.mark.parametrize(
    ("name", "nproc", "sets"),
    [
        ("1f1b", 2, ()),
        ("gpipe", 2, ("parallel.pp=2", "parallel.pp_schedule=gpipe")),
        # 4 stages of one block, two per rank: stages 0 and 2 on rank 0, 1 and 3 on rank 1
        (
            "interleaved",
            2,
            ("parallel.pp=2", "parallel.pp_schedule=interleaved-1f1b", "parallel.virtual_stages=2"),
        ),
        ("pp2_dp2", 4, ("parallel.pp=2", "train.micro_batch_size=2")),  # FSDP2 inside each stage
        ("pp2_tp2", 4, ()),
    ],
)
def test_each_pipeline_follows_one_process(
    tmp: Path, runs: dict[str, Path], name: str, nproc: int, sets: tuple[str, ...]
) -> None:
    run = runs[name] if name in runs else _train(tmp, name, nproc, *sets)
    assert sorted(metric_rows(run, "loss")) == list(range(1, 21))
    assert_follows(run, runs["single"], RTOL)  # val_loss: eval through the stages


def test_the_layout_is_logged_and_recorded(runs: dict[str, Path]) -> None:
    layout = run_events(runs["pp2_tp2"], "layout")[0]
    assert layout["pp_groups"] == [[0, 2], [1, 3]] and layout["tp_groups"] == [[0, 1], [2, 3]]
    manifest = json.loads((runs["pp2_tp2"] / "checkpoints/step-00000020/manifest.json").read_text())
    assert manifest["layout"]["pp"] == 2 and manifest["optimizer_state"] == "flat"


def test_a_killed_stage_resumes_bit_for_bit(tmp: Path, runs: dict[str, Path]) -> None:
    # where=backward: after the schedule's backwards (it never fired under pp before)
    env = {
        "HPCPIPE_CHAOS_KILL": "step=15,rank=1,where=backward",
        "HPCPIPE_CHAOS_DIR": str(tmp / "kill-markers"),
    }
    killed = _train(tmp, "killed", 2, "parallel.pp=2", env=env, restarts=1)
    assert [e["step"] for e in run_events(killed, "resumed")] == [10]
    assert metric_rows(killed, "loss") == metric_rows(runs["1f1b"], "loss")


def test_a_stage_with_dropout_resumes_bit_for_bit(tmp: Path) -> None:
    """The schedule's shape pass, at a process's first step, drew dropout's random numbers: a
    resumed process drew them at its first step after the checkpoint, and its losses differed."""
    sets = ("parallel.pp=2", "model.dropout=0.1", "train.steps=12")
    whole = _train(tmp, "dropout", 2, *sets)
    env = {"HPCPIPE_CHAOS_KILL": "step=11,rank=1", "HPCPIPE_CHAOS_DIR": str(tmp / "dropout-markers")}
    killed = _train(tmp, "dropout_killed", 2, *sets, env=env, restarts=1)
    assert [e["step"] for e in run_events(killed, "resumed")] == [10]
    assert metric_rows(killed, "loss") == metric_rows(whole, "loss")


@pytest.mark.parametrize(
    ("source", "name", "nproc", "sets"),
    [
        ("1f1b", "from_pp2_to_one", 1, ()),  # pp 2 -> 1
        # pp 2 -> DDP dp 2 on the same two ranks: another layout (the RNG streams and the micro-
        # batch split of pp 2's ranks are not theirs), though the world and tp are unchanged
        ("1f1b", "from_pp2_to_ddp_dp2", 2, ("parallel.strategy=ddp",)),
        (
            "pp2_tp2",
            "from_pp2_tp2_to_fsdp_dp2",
            2,
            ("parallel.strategy=fsdp",),
        ),  # pp 2 -> 1, tp 2 -> 1, dp 1 -> 2
    ],
)
def test_a_pipeline_checkpoint_resumes_in_another_layout(
    tmp: Path, runs: dict[str, Path], source: str, name: str, nproc: int, sets: tuple[str, ...]
) -> None:
    step = "step-00000010"
    shutil.copytree(runs[source] / "checkpoints" / step, tmp / name / "checkpoints" / step)
    resumed = _train(tmp, name, nproc, *sets)
    assert [e["step"] for e in run_events(resumed, "resumed")] == [10]
    assert sorted(metric_rows(resumed, "loss")) == list(range(11, 21))
    assert_steps_close(metric_rows(resumed, "loss"), metric_rows(runs["single"], "loss"), RTOL)


def test_a_checkpoint_of_one_process_resumes_with_the_tied_copies_equal(tmp: Path) -> None:
    """One process saves the optimizer state of the tied embedding under its first name only: the
    last stage's copy (the LM head) started without one, and the copies drifted apart."""
    import torch

    from hpcpipe.checkpoint.manifest import read_manifest
    from hpcpipe.checkpoint.safe_dcp import SafeFileSystemReader, load_state_safely

    _train(tmp, "tie_from_one", 1, "train.steps=2", "checkpoint.every_steps=2")
    run = _train(tmp, "tie_from_one", 2, "parallel.pp=2", "train.steps=4", "checkpoint.every_steps=2")
    assert [e["step"] for e in run_events(run, "resumed")] == [2]
    ckpt = run / "checkpoints" / "step-00000004"
    saved = SafeFileSystemReader(ckpt, read_manifest(ckpt)).read_metadata().state_dict_metadata
    names = ("tok_emb.weight", "lm_head.weight")
    state = {name: torch.zeros(saved[f"model.{name}"].size) for name in names}  # type: ignore[union-attr]
    load_state_safely(ckpt, {"model": state}, "misfit")
    assert torch.equal(state["tok_emb.weight"], state["lm_head.weight"])


def test_the_export_of_a_pipeline_checkpoint_is_the_whole_model(tmp: Path, runs: dict[str, Path]) -> None:
    import torch
    from safetensors.torch import load_file

    exported = {}
    for name in ("single", "pp2_tp2"):
        out = tmp / f"export-{name}"
        ckpt = runs[name] / "checkpoints" / "step-00000020"
        proc = run_cli("ckpt", "export", str(ckpt), "--format", "safetensors", "-o", str(out))
        assert proc.returncode == 0, proc.stderr[-2000:]
        exported[name] = load_file(out / "model.safetensors")
    assert exported["pp2_tp2"].keys() == exported["single"].keys()
    for key, value in exported["single"].items():
        # AdamW divides each update by the gradient's running RMS: near-zero weights move by up
        # to ~1e-5 for a relative 1e-7 in their gradients over 20 steps (measured: 4.6e-5 at most).
        torch.testing.assert_close(exported["pp2_tp2"][key], value, rtol=1e-4, atol=1e-4)


def test_evaluation_through_the_stages_runs_in_train_precision(tmp: Path, runs: dict[str, Path]) -> None:
    """The stages evaluated in fp32 under train.precision=bf16: val_loss depended on the layout."""
    short = ("train.steps=2", "train.eval_every=2", "train.precision=bf16")
    single = _train(tmp, "single_bf16", 1, *short)
    staged = _train(tmp, "pp2_bf16", 2, "parallel.pp=2", *short)
    fp32 = float(metric_rows(runs["single"], "val_loss")[0])  # step 0: the same weights, fp32
    bf16 = float(metric_rows(single, "val_loss")[0])
    assert bf16 != fp32
    assert abs(float(metric_rows(staged, "val_loss")[0]) - bf16) < abs(fp32 - bf16) / 4
