"""hf-causal-lm end to end: SmolLM2-135M-Instruct (its GGUF file, ``make fc-assets``) fine-tuned with
LoRA on text and exported as a directory transformers loads; a random tiny Llama fine-tuned in full
on chats rendered with its chat template and on a Parquet column, exported and loaded back.
(1 process vs 2 DDP vs 2 FSDP2 ranks and the bitwise resume are `hpcpipe recipes check
hf-causal-lm`'s, in test_recipe_check.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tests.helpers import run_cli

from hpcpipe.checkpoint.export import load_weights
from hpcpipe.observe.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / "data" / "external" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"

pytestmark = pytest.mark.timeout(900)


def _train(tmp: Path, preset: str, name: str, *sets: str, cwd: Path = ROOT) -> Path:
    base = [
        f"run.name={name}",
        f"run.out_dir={tmp}",
        f"data.prepared_dir={tmp}/prepared",
        "observe.progress=false",
    ]
    args = [
        a for s in [*base, "checkpoint.every_steps=2", "observe.log_every=1", *sets] for a in ("--set", s)
    ]
    proc = run_cli("train", preset, *args, cwd=cwd, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return tmp / name


def _export_hf(run: Path, *options: str) -> Path:
    [ckpt] = sorted((run / "checkpoints").glob("step-*"))[-1:]
    proc = run_cli(
        "ckpt", "export", str(ckpt), "--format", "hf", "--out", str(run / "hf"), *options, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run / "hf"


@pytest.mark.slow
@pytest.mark.skipif(not GGUF.is_file(), reason="no SmolLM2 GGUF: run `make fc-assets`")
def test_smollm2_lora_on_text_exports_a_model_transformers_loads(tmp_path: Path) -> None:
    sets = [
        "data.max_bytes=60000",
        "model.seq_len=64",
        "train.steps=2",
        "train.eval_batches=1",
        "train.eval_every=2",
    ]
    run = _train(tmp_path, "hf-causal-lm-smollm2", "smollm2", *sets)
    manifest = json.loads(next((tmp_path / "prepared").glob("*/manifest.json")).read_text())
    assert manifest["tokenizer"]["kind"] == "pretrained" and manifest["tokenizer"]["vocab_size"] == 49152
    evals = [r for r in read_metrics(run) if "val_ppl" in r]
    assert [r["step"] for r in evals] == [0, 2] and evals[-1]["val_ppl"] < evals[0]["val_ppl"] * 1.5
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = _export_hf(run, "--dtype", "bf16")  # half the bytes to write and read back
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("def main():", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()


def _tiny_with_template(tmp: Path) -> Path:
    """@tiny-llama-random (built as a run builds it, without the run) with a chat template added: a
    model directory of our own."""
    from hpcpipe.models.tiny_lm import default_tiny_dir

    built = default_tiny_dir(tmp / "models")
    model = tmp / "chat-model"
    shutil.copytree(built, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return model


def test_full_fine_tuning_on_chats_and_on_a_parquet_column(tmp_path: Path) -> None:
    model = _tiny_with_template(tmp_path)
    chats = tmp_path / "chats.jsonl"
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"add {i} and {i + 1}"},
                {"role": "assistant", "content": str(2 * i + 1)},
            ]
        }
        for i in range(300)
    ]
    chats.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    sets = [f"model.name_or_path={model}", "recipe.finetune=full", "train.steps=4", "train.eval_every=4"]
    run = _train(tmp_path, "hf-causal-lm-tiny", "chat", *sets, "data.format=chat", f"data.sources=[{chats}]")
    from transformers import AutoModelForCausalLM

    shards = json.loads(
        next(
            p for p in (tmp_path / "prepared").glob("*/manifest.json") if "chat" in p.read_text()
        ).read_text()
    )
    assert shards["data_config"]["format"] == "chat" and shards["splits"]["train"]["documents"] > 200
    exported = AutoModelForCausalLM.from_pretrained(_export_hf(run))
    base = AutoModelForCausalLM.from_pretrained(model)
    trained = AutoModelForCausalLM.from_pretrained(model)
    load_weights(sorted((run / "checkpoints").glob("step-*"))[-1], trained)  # every weight trained
    for name, tensor in exported.state_dict().items():
        assert torch.equal(tensor, trained.state_dict()[name]), name
    assert not torch.equal(exported.lm_head.weight, base.lm_head.weight)
    table = tmp_path / "texts.parquet"
    pq.write_table(pa.table({"body": [f"line {i} of a parquet file" for i in range(500)]}), table)
    parquet = _train(
        tmp_path,
        "hf-causal-lm-tiny",
        "parquet",
        *sets,
        "data.format=parquet",
        "data.text_field=body",
        f"data.sources=[{table}]",
    )
    assert [r["step"] for r in read_metrics(parquet) if "val_loss" in r] == [0, 4]
