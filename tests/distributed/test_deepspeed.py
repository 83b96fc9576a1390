"""DeepSpeed ZeRO-3 on 2 gloo ranks (``DS_ACCELERATOR=cpu``): the tiny GPT against FSDP2, exact
resume after a rank is SIGKILLed, a bit flip in a DeepSpeed shard falling back to the checkpoint
before it, and the export (hpcpipe's and DeepSpeed's own ``zero_to_fp32``) loading in transformers.

``stage3_param_persistence_threshold: 0`` makes ZeRO-3 partition every parameter: by default it
keeps parameters under 100k elements whole on every rank, which is all of the tiny model, and
the test would not see partitioning at all.

Tolerance: FSDP2 and ZeRO-3 see the same global batches from the same initial weights and run
the same AdamW; they differ in the order of floating-point reductions only. Measured: a relative
1e-7 over 20 steps; asserted: 1e-4.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.helpers import needs_package, run_cli, tiny_job_sets

from hpcpipe.observe.metrics import read_metrics

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600), needs_package("deepspeed", "deepspeed")]

RTOL = 1e-4
PARTITION_ALL = "parallel.deepspeed_config={zero_optimization: {stage3_param_persistence_threshold: 0}}"
DEEPSPEED = ("parallel.strategy=deepspeed", "parallel.zero_stage=3", PARTITION_ALL)


def _train(tmp: Path, name: str, *sets: str, env: dict[str, str] | None = None, restarts: int = 0):  # type: ignore[no-untyped-def]
    # micro-batch 2 x 2 ranks x accumulation 2 = the preset's global batch of 8: the engine's
    # accumulation boundary is the loop's, and gradient clipping is active (norms > 1).
    args = tiny_job_sets(
        tmp, name, "train.steps=20", "train.micro_batch_size=2", "observe.progress=false", *sets
    )
    return run_cli(
        "train", "tiny", "--nproc", "2", "--max-restarts", str(restarts), *args, cwd=tmp, timeout=300, env=env
    )


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


def _events(run_dir: Path, kind: str) -> list[dict]:  # type: ignore[type-arg]
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deepspeed")


@pytest.fixture(scope="module")
def runs(tmp: Path) -> dict[str, Path]:
    for name, sets in {
        "fsdp": ("parallel.strategy=fsdp", "checkpoint.every_steps=10"),
        "zero3": (*DEEPSPEED, "checkpoint.every_steps=10"),
    }.items():
        proc = _train(tmp, name, *sets)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return {"fsdp": tmp / "fsdp", "zero3": tmp / "zero3"}


def test_zero3_follows_fsdp2(runs: dict[str, Path]) -> None:
    fsdp, zero3 = _losses(runs["fsdp"]), _losses(runs["zero3"])
    assert sorted(zero3) == list(range(1, 21))
    assert [zero3[s] for s in sorted(zero3)] == pytest.approx([fsdp[s] for s in sorted(fsdp)], rel=RTOL)
    assert zero3[20] < zero3[1] - 0.5  # it learns
    assert (runs["zero3"] / "sample.txt").read_text().strip()  # every rank generated through ZeRO-3


def test_checkpoint_is_deepspeeds_own_format_in_the_verified_store(runs: dict[str, Path]) -> None:
    ckpt = runs["zero3"] / "checkpoints" / "step-00000020"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["engine"] == "deepspeed" and manifest["world_size"] == 2
    files = set(manifest["files"])
    for rank in (0, 1):
        for kind in ("model", "optim"):
            assert f"deepspeed/global_step20/zero_pp_rank_{rank}_mp_rank_00_{kind}_states.pt" in files
        assert f"extra/rank-{rank:05d}.pt" in files
    assert {"deepspeed/latest", "deepspeed/zero_to_fp32.py"} <= files


def test_sigkilled_rank_restarts_and_resumes_exactly(tmp: Path, runs: dict[str, Path]) -> None:
    env = {"HPCPIPE_CHAOS_KILL": "step=15,rank=1", "HPCPIPE_CHAOS_DIR": str(tmp / "kill-markers")}
    proc = _train(tmp, "killed", *DEEPSPEED, "checkpoint.every_steps=10", env=env, restarts=1)
    assert proc.returncode == 0, proc.stderr[-4000:]
    resumed = _events(tmp / "killed", "resumed")
    assert [e["step"] for e in resumed] == [10]
    assert _losses(tmp / "killed") == _losses(runs["zero3"])  # bit for bit


def test_bit_flip_in_a_shard_falls_back_to_the_previous_checkpoint(tmp: Path, runs: dict[str, Path]) -> None:
    run_dir = tmp / "flipped"
    shutil.copytree(runs["zero3"], run_dir)
    (run_dir / "metrics.jsonl").unlink()
    shard = (
        run_dir
        / "checkpoints/step-00000020/deepspeed/global_step20/zero_pp_rank_1_mp_rank_00_optim_states.pt"
    )
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))

    proc = _train(tmp, "flipped", *DEEPSPEED, "checkpoint.every_steps=10")
    assert proc.returncode == 0, proc.stderr[-4000:]
    fallback = _events(run_dir, "checkpoint_fallback")
    assert fallback and fallback[0]["step"] == 20 and fallback[0]["file"].endswith(shard.name)
    assert [e["step"] for e in _events(run_dir, "resumed")] == [10]
    reference = _losses(runs["zero3"])
    assert _losses(run_dir) == {s: reference[s] for s in range(11, 21)}


def test_export_and_deepspeeds_zero_to_fp32_give_the_same_weights(tmp: Path, runs: dict[str, Path]) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    ckpt = runs["zero3"] / "checkpoints" / "step-00000020"
    out = tmp / "export-hf"
    proc = run_cli("ckpt", "export", str(ckpt), "--format", "safetensors", "-o", str(tmp / "export-st"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_cli("ckpt", "export", str(ckpt), "--format", "hf", "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    model = AutoModelForCausalLM.from_pretrained(out)
    tokens = torch.tensor([[1, 5, 9, 2, 7]])
    assert torch.isfinite(model(tokens).logits).all()

    # DeepSpeed's own script, as it wrote it into the checkpoint, consolidates the same weights.
    ds_out = tmp / "zero_to_fp32"
    script = ckpt / "deepspeed" / "zero_to_fp32.py"
    # (Its --safe_serialization refuses the GPT's tied embedding and head: torch's format then.)
    cmd = [sys.executable, str(script), str(ckpt / "deepspeed"), str(ds_out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = {}
    for part in ds_out.glob("*.bin"):
        theirs.update(torch.load(part, map_location="cpu", weights_only=True))
    ours = load_file(str(tmp / "export-st" / "model.safetensors"))
    assert set(ours) <= set(theirs)
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=0)


def test_a_dcp_checkpoint_is_refused_by_deepspeed_with_one_line(tmp: Path, runs: dict[str, Path]) -> None:
    run_dir = tmp / "from-fsdp"
    shutil.copytree(runs["fsdp"], run_dir)
    before = {p.name: p.read_bytes() for p in (run_dir / "checkpoints").rglob("*") if p.is_file()}
    proc = _train(tmp, "from-fsdp", *DEEPSPEED, "train.steps=30")
    assert proc.returncode == 2
    assert "written by DCP" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(_losses(run_dir)) == list(range(1, 21))  # nothing trained
    after = {p.name: p.read_bytes() for p in (run_dir / "checkpoints").rglob("*") if p.is_file()}
    assert after == before  # nothing lost


def test_zero2_resumes_and_exports(tmp: Path) -> None:
    """ZeRO-1/2 files hold DeepSpeed's fragment addresses: resume and export read them safely."""
    zero2 = ("parallel.strategy=deepspeed", "parallel.zero_stage=2", "checkpoint.every_steps=4")
    proc = _train(tmp, "zero2", *zero2, "train.steps=4")
    assert proc.returncode == 0, proc.stderr[-4000:]
    proc = _train(tmp, "zero2", *zero2, "train.steps=6")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [e["step"] for e in _events(tmp / "zero2", "resumed")] == [4]
    ckpt = tmp / "zero2" / "checkpoints" / "step-00000006"
    proc = run_cli("ckpt", "export", str(ckpt), "--format", "safetensors", "-o", str(tmp / "zero2-export"))
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_zero0_logs_its_steps_without_a_gradient_norm(tmp: Path) -> None:
    """ZeRO-0's engine measures no gradient norm: rank 0's log line formatted None and died."""
    zero0 = ("parallel.strategy=deepspeed", "parallel.zero_stage=0", "observe.progress=true")
    proc = _train(tmp, "zero0", *zero0, "train.steps=2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "gnorm n/a" in proc.stdout
    assert [r["grad_norm"] for r in read_metrics(tmp / "zero0") if "loss" in r] == [None, None]


def test_a_key_deepspeed_refuses_exits_2_naming_it_without_a_traceback(tmp: Path) -> None:
    bogus = "parallel.deepspeed_config={zero_optimization: {stage: 3, no_such_knob: 1}}"
    proc = _train(tmp, "bogus", "parallel.strategy=deepspeed", bogus)
    assert proc.returncode == 2
    assert "DeepSpeed's DeepSpeedZeroConfig refuses no_such_knob: Extra inputs" in proc.stderr
    assert "Traceback" not in proc.stderr
