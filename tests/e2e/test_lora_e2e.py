"""The lora-function-calling recipe end to end on one process with the tiny model: only adapters
train, the run directory holds its reports, both exports give the trained model's logits, the
evaluation CLI scores a run, and bad input stops with one line and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.helpers import run_cli

from hpcpipe.config import load_config
from hpcpipe.observe.metrics import read_metrics

pytestmark = pytest.mark.timeout(300)

BFCL_SAMPLES = Path(__file__).resolve().parents[1] / "data" / "bfcl"


def _sets(tmp: Path, name: str, *extra: str) -> list[str]:
    sets = [
        f"run.name={name}",
        f"run.out_dir={tmp}",
        f"data.prepared_dir={tmp}/prepared",
        "observe.progress=false",
        "model.name_or_path=@tiny-llama-random",  # mechanics: the pre-trained base is not needed
        *extra,
    ]
    return [arg for s in sets for arg in ("--set", s)]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lora")


@pytest.fixture(scope="module")
def run(tmp: Path) -> Path:
    sets = _sets(tmp, "tiny", "train.steps=8", "checkpoint.every_steps=4", "observe.log_every=2")
    proc = run_cli("train", "lora-fc-tiny", *sets, cwd=tmp, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return tmp / "tiny"


def _recipe(run: Path):  # type: ignore[no-untyped-def]
    from hpcpipe.recipes.lora_fc import LoraFCRecipe

    return LoraFCRecipe.from_job(load_config(run / "config.yaml"))


def test_only_lora_parameters_are_trainable(run: Path) -> None:
    model = _recipe(run).build_model()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable), trainable[:4]
    assert frozen and not any("lora_" in n for n in frozen)
    # Every requested target module got its adapters, lm_head included.
    targets = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable}
    assert targets == set(load_config(run / "config.yaml").lora.target_modules)


def test_top_layers_adapts_only_the_last_decoder_layers(run: Path) -> None:
    from hpcpipe.recipes.lora_fc import LoraFCRecipe

    job = load_config(run / "config.yaml")  # the tiny model: 2 decoder layers
    lora = job.lora.model_copy(update={"top_layers": 1})
    model = LoraFCRecipe(job.model, lora, job.data, job.train, job.run.seed).build_model()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    adapted = {n.split(".layers.")[1].split(".")[0] for n in trainable if ".layers." in n}
    assert adapted == {"1"}  # and lm_head (a target here), above every layer, keeps its adapter
    assert any("lm_head" in n for n in trainable)


def test_the_run_directory_reports_data_throughput_and_params(run: Path) -> None:
    report = json.loads((run / "data_report.json").read_text())
    assert report["encoded"]["train"] > 0 and report["encoded"]["heldout"] > 0
    assert report["sequences"]["train"] > 0 and 0.5 < report["packing"]["fill"] <= 1.0
    assert report["template"] == "own (ChatML)"  # the tiny tokenizer has no chat template
    assert report["malformed"] == {} and set(report["dropped"]) <= {"too_long", "no_supervised_tokens"}
    summary = json.loads((run / "lora_summary.json").read_text())
    assert 0 < summary["params"]["trainable"] < summary["params"]["frozen"]
    assert summary["flops_per_token"] == "4N frozen + 6N adapters"
    rows = [r for r in read_metrics(run) if "loss" in r]
    assert [r["step"] for r in rows] == [2, 4, 6, 8]
    last = rows[-1]
    # All tokens, real (non-padding) tokens and supervised (assistant) tokens are counted apart.
    assert last["tokens_per_s"] >= last["real_tokens_per_s_per_device"] > 0
    assert last["real_tokens_per_s_per_device"] > last["supervised_tokens_per_s_per_device"] > 0
    assert rows[-1]["loss"] < rows[0]["loss"]


def _trained_model(run: Path) -> torch.nn.Module:
    """The run's model as it stood at its last step: base + adapters restored from the checkpoint."""
    from hpcpipe.checkpoint.store import CheckpointStore

    job = load_config(run / "config.yaml")
    model = _recipe(run).build_model()
    params = [p for p in model.parameters() if p.requires_grad]
    store = CheckpointStore(job.checkpoint, run / "checkpoints", trainable_only=True)
    try:
        restored = store.restore(model, torch.optim.AdamW(params))
    finally:
        store.close()
    assert restored is not None and restored["step"] == 8
    return model.eval()


def _logits(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits.float()  # (B, T, V)


def test_adapter_and_merged_exports_give_the_trained_models_logits(run: Path, tmp: Path) -> None:
    from transformers import AutoModelForCausalLM

    from hpcpipe.models.hf_lm import resolve_source
    from hpcpipe.models.lora_export import load_with_adapter

    job = load_config(run / "config.yaml")
    source = resolve_source(job.model, job.data.prepared_dir)
    ids = torch.randint(3, 1000, (2, 48), generator=torch.Generator().manual_seed(0))
    expected = _logits(_trained_model(run), ids)
    at_end = _logits(load_with_adapter(source, run / "export/adapter"), ids)  # written by the run
    torch.testing.assert_close(at_end, expected, rtol=1e-4, atol=1e-4)

    ckpt = sorted((run / "checkpoints").glob("step-*"))[-1]
    outs = {}
    for fmt, dtype in (("adapter", "fp32"), ("merged", "fp32"), ("merged", "bf16")):
        out = tmp / f"export-{fmt}-{dtype}"
        args = ["--format", fmt, "--dtype", dtype, "--out", str(out)]
        proc = run_cli("ckpt", "export", str(ckpt), *args, cwd=tmp)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs[fmt, dtype] = out
    adapter_model = load_with_adapter(source, outs["adapter", "fp32"])
    torch.testing.assert_close(_logits(adapter_model, ids), expected, rtol=1e-4, atol=1e-4)
    merged = AutoModelForCausalLM.from_pretrained(outs["merged", "fp32"])
    assert not any("lora" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(_logits(merged, ids), expected, rtol=1e-4, atol=1e-4)
    merged_bf16 = AutoModelForCausalLM.from_pretrained(outs["merged", "bf16"], dtype=torch.bfloat16)
    assert next(merged_bf16.parameters()).dtype == torch.bfloat16
    diff = (_logits(merged_bf16, ids) - expected).abs().max().item()
    assert diff < 0.1 * expected.abs().max().item()  # bf16 weights: ~3 significant digits
    with adapter_model.disable_adapter():  # the adapter changed the model: the base alone differs
        assert (_logits(adapter_model, ids) - expected).abs().max() > 1e-2
    # --dtype bf16 of the adapter format wrote fp32 (in process here: the CLI is shown above).
    from safetensors.torch import load_file

    from hpcpipe.recipes.export import export_checkpoint

    bf16 = export_checkpoint(ckpt, "adapter", tmp / "export-adapter-bf16", dtype="bf16")
    assert {t.dtype for t in load_file(str(bf16 / "adapter_model.safetensors")).values()} == {torch.bfloat16}


def test_eval_cli_scores_a_run_on_heldout_and_bfcl_files(run: Path, tmp: Path) -> None:
    out = tmp / "eval"
    args = ["--bfcl-dir", str(BFCL_SAMPLES), "--categories", "simple,multiple,irrelevance"]
    args += ["--limit", "2", "--heldout-limit", "6", "--max-new-tokens", "24", "--out", str(out)]
    proc = run_cli("eval", "function-calling", str(run), *args, "--json", "-", cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout)
    written = json.loads((out / "eval.json").read_text())
    assert printed["overall"] == written["overall"]
    assert {"simple", "multiple", "irrelevance"} <= set(written["categories"])
    assert sum(c["cases"] for c in written["categories"].values()) == written["overall"]["cases"] == 12
    for key in ("parse_rate", "decision_acc", "ast_acc", "exact", "call_auc"):
        assert 0.0 <= written["overall"][key] <= 1.0
    assert all(0.0 <= case["p_call"] <= 1.0 for case in written["cases"])
    assert "| category |" in (out / "eval.md").read_text()


def test_eval_cli_constrain_writes_beside_the_free_evaluation(run: Path, tmp: Path) -> None:
    args = ["--bfcl-dir", str(BFCL_SAMPLES), "--categories", "multiple", "--limit", "2"]
    args += ["--heldout-limit", "2", "--max-new-tokens", "24", "--constrain", "--json", "-"]
    proc = run_cli("eval", "function-calling", str(run), *args, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = json.loads((run / "eval-constrained" / "eval.json").read_text())
    assert written["meta"]["constrained"] is True and written["meta"]["unconstrained_cases"] == 0
    assert written["overall"]["cases"] == 4 == json.loads(proc.stdout)["overall"]["cases"]
    assert "--constrain" in (run / "eval-constrained" / "eval.md").read_text()


def test_eval_decline_withdraws_calls_below_a_threshold_set_on_near_misses(run: Path, tmp: Path) -> None:
    evaluated, judged = tmp / "eval-to-judge", tmp / "eval-judged"
    args = ["--bfcl-dir", str(BFCL_SAMPLES), "--categories", "simple,irrelevance", "--limit", "2"]
    args += ["--heldout-limit", "4", "--max-new-tokens", "24", "--constrain", "--out", str(evaluated)]
    assert run_cli("eval", "function-calling", str(run), *args, cwd=tmp).returncode == 0
    decline = ["eval", "decline", str(run), "--eval-dir", str(evaluated), "--bfcl-dir", str(BFCL_SAMPLES)]
    decline += ["--cases", "12", "--target", "0.9", "--out", str(judged), "--json", "-"]
    proc = run_cli(*decline, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rule = json.loads((run / "export" / "adapter" / "decline.json").read_text())
    assert rule["cases"] == 12 and rule["target"] == 0.9 and rule["weight"] == 4.0 and rule["constrained"]
    before = json.loads((evaluated / "eval.json").read_text())["cases"]
    written = json.loads((judged / "eval.json").read_text())
    assert written["meta"]["decline"]["threshold"] == rule["threshold"]
    assert [c["id"] for c in written["cases"]] == [c["id"] for c in before]
    for old, new in zip(before, written["cases"], strict=True):
        calls = old["reply"].lstrip().startswith("<tool_call>")
        assert ("decline_score" in new) == calls
        if "declined_call" in new:  # withdrawn: no call now, and below the threshold
            assert new["declined_call"] == old["reply"] and new["decline_score"] < rule["threshold"]
            assert not new["reply"].startswith("<tool_call>") and new["ast"] == (not new["expects_call"])
        else:
            assert new["ast"] == old["ast"]
    assert written["meta"]["decline"]["declined"] == sum("declined_call" in c for c in written["cases"])
    assert json.loads(proc.stdout)["overall"] == written["overall"]
    assert "declined after they were written" in (judged / "eval.md").read_text()
    # An evaluation without P(call) per case (older hpcpipe) is refused before any model loads.
    stale = tmp / "eval-stale"
    stale.mkdir()
    old_eval = json.loads((evaluated / "eval.json").read_text())
    old_eval["cases"] = [{k: v for k, v in c.items() if k != "p_call"} for c in old_eval["cases"]]
    (stale / "eval.json").write_text(json.dumps(old_eval))
    proc = run_cli("eval", "decline", str(run), "--eval-dir", str(stale), cwd=tmp)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "p_call" in lines[0], proc.stderr[-2000:]


def test_eval_decline_without_an_evaluation_is_one_line_and_exit_2(run: Path, tmp: Path) -> None:
    for target, named in ((tmp / "nowhere", "nowhere"), (run, "eval")):
        proc = run_cli("eval", "decline", str(target), "--eval-dir", str(tmp / "no-eval"), cwd=tmp)
        assert proc.returncode == 2, proc.stderr[-3000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and named in lines[0] and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("sets", "names"),
    [
        (["model.name_or_path=/no/such/model"], "model.name_or_path"),
        (["lora.target_modules=[q_proj,qkv_fused]"], "lora.target_modules"),
        (["lora.top_layers=3"], "lora.top_layers"),
    ],
)
def test_bad_model_input_is_one_line_and_exit_2(tmp: Path, sets: list[str], names: str) -> None:
    proc = run_cli("train", "lora-fc-tiny", *_sets(tmp, "bad", "train.steps=1", *sets), cwd=tmp)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_a_dataset_with_zero_valid_rows_is_one_line_and_exit_2(tmp: Path) -> None:
    bad = tmp / "broken.jsonl"
    bad.write_text('{"system": "SYSTEM: no functions", "chat": "no turns here"}\nnot json\n')
    sets = _sets(tmp, "bad-data", "train.steps=1", f"data.sources=[{bad}]")
    proc = run_cli("train", "lora-fc-tiny", *sets, cwd=tmp)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp / "bad-data" / "checkpoints").exists()


def test_eval_of_a_missing_target_is_one_line_and_exit_2(tmp: Path) -> None:
    proc = run_cli("eval", "function-calling", str(tmp / "nowhere"), cwd=tmp)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "nowhere" in proc.stderr, proc.stderr


def test_bench_throughput_runs_the_seed_preset_with_random_weights_of_a_shape(tmp: Path) -> None:
    """`bench throughput lora-fc-qwen2-7b` with `@random:<shape>`: the GPU measurement's path
    (FSDP2, bf16 base and autocast, gradient checkpointing, r=64) at a test-size Qwen2 shape."""
    sets = [
        "model.name_or_path=@random:qwen2-tiny",
        "model.seq_len=1024",
        'data.sources=["@synthetic"]',
        "data.synthetic_rows=120",
        f"data.prepared_dir={tmp}/prepared",
        "train.global_batch_size=2",
        "parallel.nproc=1",
    ]
    args = [arg for s in sets for arg in ("--set", s)]
    out = ["--steps", "2", "--warmup", "1", "--out", str(tmp / "bench"), "--json", "-"]
    proc = run_cli("bench", "throughput", "lora-fc-qwen2-7b", *args, *out, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["unit"] == "tokens" and result["per_s_per_device"] > 0
    job = load_config(Path(result["runs"][0]["run_dir"]) / "config.yaml")
    assert (job.parallel.strategy, job.model.base_dtype, job.lora.r) == ("fsdp", "bf16", 64)
    assert job.model.gradient_checkpointing


def test_a_missing_peft_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from hpcpipe.errors import ConfigError
    from hpcpipe.models.hf_lm import require_peft

    monkeypatch.setitem(sys.modules, "peft", None)  # import peft now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'hpcpipe\[lora\]'"):
        require_peft()
