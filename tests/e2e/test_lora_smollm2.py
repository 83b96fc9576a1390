"""The real-model path: SmolLM2-135M-Instruct from its GGUF file (``make fc-assets``) trains a few
LoRA steps with its own chat template, exports an adapter and is evaluated on BFCL files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers import run_cli

from hpcpipe.models.gguf_cache import kept_root
from hpcpipe.observe.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / "data" / "external" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
BFCL_SAMPLES = ROOT / "tests" / "data" / "bfcl"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not GGUF.is_file(), reason="no SmolLM2 GGUF: run `make fc-assets`"),
]


def test_smollm2_gguf_trains_exports_and_evaluates(tmp_path: Path) -> None:
    sets = [
        "run.name=smoke",
        f"run.out_dir={tmp_path}",
        f"model.name_or_path={GGUF.parent}",
        f"data.prepared_dir={tmp_path}/prepared",
        "data.synthetic_rows=60",
        "model.seq_len=512",
        "train.steps=2",
        "train.global_batch_size=2",
        "observe.log_every=1",
        "observe.progress=false",
    ]
    args = [arg for s in sets for arg in ("--set", s)]
    proc = run_cli("train", "lora-fc-smollm2", *args, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "smoke"
    report = json.loads((run / "data_report.json").read_text())
    assert report["template"] == "tokenizer"  # SmolLM2's own chat template, read from the GGUF file
    rows = [r for r in read_metrics(run) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(r["loss"] == r["loss"] for r in rows)
    assert (run / "export" / "adapter" / "adapter_model.safetensors").is_file()
    # De-quantised once per machine (models/gguf_cache.py): the evaluation below reads this copy.
    kept = kept_root(tmp_path / "prepared" / "models")
    assert kept is not None and list(kept.glob("gguf-*/model/model.safetensors"))

    ev = ["--bfcl-dir", str(BFCL_SAMPLES), "--categories", "simple", "--limit", "1"]
    ev += ["--heldout-limit", "1", "--max-new-tokens", "16", "--json", "-"]
    proc = run_cli("eval", "function-calling", str(run), *ev, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["overall"]["cases"] == 2
