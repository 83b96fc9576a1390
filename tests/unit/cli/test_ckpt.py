"""`hpcpipe ckpt list|verify|export` as a user runs them (a subprocess of the real CLI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from hpcpipe.checkpoint import CheckpointStore
from hpcpipe.config import load_config
from hpcpipe.models.gpt import GPT


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with config.yaml and two committed checkpoints (steps 3 and 6) in both tiers."""
    base = tmp_path_factory.mktemp("ckpt_cli")
    root = base / "run"
    job = load_config(
        "tiny",
        [
            "model.n_layers=1",
            "model.d_model=16",
            "model.n_heads=2",
            "model.seq_len=8",
            f"checkpoint.durable_dir={base / 'durable'}",
        ],
    )
    root.mkdir()
    (root / "config.yaml").write_text(job.to_yaml())
    model = GPT(job.model, 40)
    optimizer = torch.optim.AdamW(model.parameters())
    store = CheckpointStore(job.checkpoint, root / "checkpoints")  # copies each one to durable
    for step in (3, 6):
        store.save(step, model, optimizer, {"step": step})
    store.close()
    return root


def test_list_as_json(cli, run_dir: Path) -> None:  # type: ignore[no-untyped-def]
    proc = cli("ckpt", "list", str(run_dir), "--json", "-")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [(r["step"], r["tier"], r["verified"], r["files"]) for r in rows] == [
        (6, "fast", True, 4),
        (3, "fast", True, 4),
        (6, "durable", True, 4),
        (3, "durable", True, 4),
    ]
    assert all(r["bytes"] > 0 for r in rows)


def test_verify_ok_then_mismatch_then_missing(cli, run_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ok = cli("ckpt", "verify", str(run_dir))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("ok ") == 4 and "durable/step-00000006" in ok.stdout

    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    extra = copy / "checkpoints" / "step-00000003" / "extra" / "rank-00000.pt"
    data = bytearray(extra.read_bytes())
    data[-1] ^= 0xFF
    extra.write_bytes(bytes(data))
    bad = cli("ckpt", "verify", str(copy / "checkpoints" / "step-00000003"))
    assert bad.returncode == 1
    assert "FAIL" in bad.stderr and "extra/rank-00000.pt: BLAKE3 mismatch (expected" in bad.stderr
    assert "Traceback" not in bad.stderr

    missing = cli("ckpt", "verify", str(tmp_path / "nope"))
    assert missing.returncode == 2
    lines = [line for line in missing.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {tmp_path / 'nope'}: no such file or directory"]


def test_export_hf_from_the_cli(run_dir: Path, tmp_path: Path) -> None:
    """In-process (CliRunner): torch and transformers are already loaded by this test run."""
    from typer.testing import CliRunner

    from hpcpipe.cli.app import app

    out = tmp_path / "hf"
    result = CliRunner().invoke(
        app,
        [
            "ckpt",
            "export",
            str(run_dir / "checkpoints" / "step-00000006"),
            "--format",
            "hf",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["model_type"] == "gpt2"
    assert (out / "model.safetensors").is_file()


def test_an_export_into_the_runs_checkpoints_is_refused_and_they_still_verify(run_dir: Path) -> None:
    """Files added to a committed checkpoint fail its verification: the run could not resume."""
    from hpcpipe.checkpoint.manifest import CheckpointError
    from hpcpipe.recipes.export import export_checkpoint

    ckpt = run_dir / "checkpoints" / "step-00000006"
    for out in (ckpt, run_dir / "checkpoints" / "hf"):
        with pytest.raises(CheckpointError, match=r"--out .*: inside the run's checkpoints"):
            export_checkpoint(ckpt, "hf", out)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-")) == [
        "step-00000003",
        "step-00000006",
    ]
    assert not (ckpt / "config.json").exists()


def test_a_relative_checkpoint_dir_is_found_from_elsewhere(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Relative to where the run started (lineage), not to the caller: from another directory
    `newest` printed 0 (the requeue's "no progress") and `list` found nothing. The run's recipe
    is not imported: only its checkpoint section is read."""
    started = tmp_path / "project"
    run = started / "runs" / "r"
    job = load_config("tiny", ["model.n_layers=1", "model.d_model=16", "model.n_heads=2", "model.seq_len=8"])
    run.mkdir(parents=True)
    config = yaml.safe_load(job.to_yaml())
    config["checkpoint"]["dir"] = "relck"
    config["run"]["recipe"] = "not_installed_anywhere:Recipe"
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "lineage.json").write_text(json.dumps({"working_dir": str(started)}))
    model = GPT(job.model, 40)
    store = CheckpointStore(job.checkpoint, started / "relck")
    store.save(4, model, torch.optim.AdamW(model.parameters()), {"step": 4})
    store.close()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = cli("ckpt", "newest", str(run), cwd=elsewhere)
    assert proc.returncode == 0 and proc.stdout.strip() == "4", proc.stderr
    proc = cli("ckpt", "list", str(run), "--json", "-", cwd=elsewhere)
    assert proc.returncode == 0 and [r["step"] for r in json.loads(proc.stdout)] == [4], proc.stderr


def test_newest_of_a_step_directory_without_a_manifest_file_is_refused(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    step = tmp_path / "step-00000001"
    (step / "manifest.json").mkdir(parents=True)
    proc = cli("ckpt", "newest", str(step))
    assert proc.returncode == 2 and "not a committed checkpoint" in proc.stderr, proc.stdout


def test_dot_inside_a_checkpoint_names_that_checkpoint(  # type: ignore[no-untyped-def]
    cli, run_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """`.` has no name: `newest .` refused a checkpoint as "not named step-NNNNNNNN" and
    `export .` wrote to export/-hf."""
    import shutil

    from typer.testing import CliRunner

    from hpcpipe.cli.app import app

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    ckpt = copy / "checkpoints" / "step-00000006"
    proc = cli("ckpt", "newest", ".", cwd=ckpt)
    assert proc.returncode == 0 and proc.stdout.strip() == "6", proc.stderr
    monkeypatch.chdir(ckpt)
    result = CliRunner().invoke(app, ["ckpt", "export", ".", "--format", "hf"])
    assert result.exit_code == 0, result.output
    assert (copy / "export" / "step-00000006-hf" / "config.json").is_file()
    assert not (copy / "export" / "-hf").exists()
