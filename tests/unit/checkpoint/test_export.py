"""Exports: the Hugging Face directory gives hpcpipe's logits; safetensors round-trips the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_model

from hpcpipe.checkpoint import CheckpointError, CheckpointStore
from hpcpipe.config import JobConfig, load_config
from hpcpipe.models.gpt import GPT
from hpcpipe.recipes.export import export_checkpoint

SAFETENSORS_EXPORT = [".hpcpipe-export", ".hpcpipe-export.lock", "model.safetensors"]  # its folder
VOCAB = 67  # deliberately not a "nice" number: the export must take it from the checkpoint


def make_run(root: Path, variant: str) -> tuple[GPT, Path, JobConfig]:
    """A run directory with config.yaml and one committed checkpoint of a non-trivial model."""
    job = load_config(
        "tiny",
        [
            f"model.variant={variant}",
            "model.n_layers=2",
            "model.d_model=32",
            "model.n_heads=2",
            "model.seq_len=16",
            "model.rope_theta=500",
            "model.ffn_mult=3",
        ],
    )
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(job.to_yaml())
    torch.manual_seed(1)
    model = GPT(job.model, VOCAB)
    with torch.no_grad():  # move every weight off its init (norm weights 1, biases 0 hide bugs)
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    store = CheckpointStore(job.checkpoint, root / "checkpoints")
    store.save(12, model, torch.optim.AdamW(model.parameters()), {})
    store.close()
    return model.eval(), root / "checkpoints" / "step-00000012", job


@pytest.mark.parametrize(
    ("variant", "hf_class"), [("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM")]
)
def test_hf_export_gives_the_same_logits(tmp_path: Path, variant: str, hf_class: str) -> None:
    from transformers import AutoModelForCausalLM

    model, ckpt, job = make_run(tmp_path / "run", variant)
    out = export_checkpoint(ckpt, "hf", tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == hf_class
    config = json.loads((out / "config.json").read_text())
    # Older transformers leave defaults (tying is one) out of config.json.
    assert config.get("tie_word_embeddings", True) is True and hf.config.tie_word_embeddings
    assert config["vocab_size"] == VOCAB
    idx = torch.randint(0, VOCAB, (2, job.model.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx), atol=1e-4, rtol=1e-4)


def test_safetensors_export_round_trips(tmp_path: Path) -> None:
    model, ckpt, job = make_run(tmp_path / "run", "llama")
    out = export_checkpoint(ckpt, "safetensors", tmp_path / "st")
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        metadata = handle.metadata()
        keys = set(handle.keys())
    assert metadata["hpcpipe.step"] == "12" and metadata["hpcpipe.vocab_size"] == str(VOCAB)
    assert len({"tok_emb.weight", "lm_head.weight"} & keys) == 1  # the tied matrix is stored once
    loaded = GPT(job.model, VOCAB)
    load_model(loaded, str(out / "model.safetensors"))
    assert loaded.lm_head.weight is loaded.tok_emb.weight
    idx = torch.randint(0, VOCAB, (1, 8))
    with torch.no_grad():
        assert torch.equal(loaded.eval()(idx), model(idx))


@pytest.mark.parametrize("fmt", ["safetensors", "hf"])
def test_dtype_bf16_writes_bf16_weights(tmp_path: Path, fmt: str) -> None:
    """`--dtype bf16` was ignored for gpt runs: float32 was written without a word."""
    from safetensors.torch import load_file

    model, ckpt, _ = make_run(tmp_path / "run", "llama")
    out = export_checkpoint(ckpt, fmt, tmp_path / fmt, dtype="bf16")
    tensors = load_file(str(out / "model.safetensors"))
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    rounded = model.tok_emb.weight.detach().to(torch.bfloat16)
    names = ["model.embed_tokens.weight"] if fmt == "hf" else ["tok_emb.weight", "lm_head.weight"]
    assert torch.equal(next(tensors[n] for n in names if n in tensors), rounded)  # tied: stored once
    if fmt == "hf":
        from transformers import AutoModelForCausalLM

        assert AutoModelForCausalLM.from_pretrained(out).dtype == torch.bfloat16  # config.json says so


def test_export_refuses_a_damaged_checkpoint(tmp_path: Path) -> None:
    _, ckpt, _ = make_run(tmp_path / "run", "gpt2")
    shard = sorted(ckpt.glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:-1])
    with pytest.raises(CheckpointError, match=f"{shard.name}: wrong size"):
        export_checkpoint(ckpt, "safetensors", tmp_path / "st")
    assert not (tmp_path / "st").exists()


def test_an_export_replaces_an_earlier_one_whole_and_nothing_else(tmp_path: Path) -> None:
    """A safetensors export over an hf one kept its config.json: Hugging Face then loaded a model
    of random weights (every key missing) without an error."""
    _, ckpt, _ = make_run(tmp_path / "run", "gpt2")
    out = tmp_path / "exported"
    export_checkpoint(ckpt, "hf", out)
    assert (out / "config.json").is_file()
    export_checkpoint(ckpt, "safetensors", out)
    assert sorted(p.name for p in out.iterdir()) == SAFETENSORS_EXPORT
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match=r"holds what no hpcpipe export there wrote \(notes\.txt\)"):
        export_checkpoint(ckpt, "safetensors", foreign)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_export_needs_the_run_config(tmp_path: Path) -> None:
    _, ckpt, _ = make_run(tmp_path / "run", "gpt2")
    (tmp_path / "run" / "config.yaml").unlink()
    with pytest.raises(CheckpointError, match=r"config\.yaml"):
        export_checkpoint(ckpt, "hf", tmp_path / "hf")


def test_a_dataset_recipe_exports_in_the_dtype_asked(tmp_path: Path) -> None:
    """A user's DatasetRecipe wrote float32 whatever --dtype said."""
    from safetensors.torch import load_file

    from hpcpipe.config import apply_values
    from hpcpipe.recipes.registry import recipe_class

    job = apply_values(load_config("tiny"), {"run.recipe": "tests.recipes_for_tests:Tiny"})
    root = tmp_path / "run"
    root.mkdir()
    (root / "config.yaml").write_text(job.to_yaml())
    model = recipe_class(job.run.recipe).from_job(job).build_model()
    store = CheckpointStore(job.checkpoint, root / "checkpoints")
    store.save(3, model, torch.optim.AdamW(model.parameters()), {})
    store.close()
    ckpt = root / "checkpoints" / "step-00000003"
    out = export_checkpoint(ckpt, "safetensors", tmp_path / "out", dtype="bf16")
    weights = load_file(str(out / "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    assert torch.equal(weights["0.weight"], model[0].weight.detach().to(torch.bfloat16))


def test_the_cli_exports_into_the_runs_own_directory_and_newest_reads_one_checkpoint(tmp_path: Path) -> None:
    """A checkpoint of a durable tier, exported with --config: it went to the tier's parent's
    export/, not the run's; `ckpt newest` on one checkpoint printed 0 ('no progress')."""
    import shutil

    from tests.helpers import run_cli

    _, ckpt, _ = make_run(tmp_path / "run", "gpt2")
    durable = tmp_path / "durable" / ckpt.name
    shutil.copytree(ckpt, durable)
    config = tmp_path / "run" / "config.yaml"
    proc = run_cli("ckpt", "export", str(durable), "--config", str(config), "--format", "safetensors")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "export" / "step-00000012-safetensors" / "model.safetensors").is_file()
    assert not (tmp_path / "export").exists()
    assert run_cli("ckpt", "newest", str(ckpt)).stdout.strip() == "12"
    assert run_cli("ckpt", "newest", str(tmp_path / "run")).stdout.strip() == "12"


def test_an_export_into_the_working_directory_or_an_old_default_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--out .` exported everything, then failed renaming '.' (a mount point the same); the
    run's own export/<step>-<format> written before the marker existed is replaced."""
    _, ckpt, _ = make_run(tmp_path / "run", "gpt2")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    export_checkpoint(ckpt, "safetensors", Path("."))
    assert sorted(p.name for p in here.iterdir()) == SAFETENSORS_EXPORT
    old = tmp_path / "run" / "export" / f"{ckpt.name}-hf"
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")  # an export of an earlier version: no marker
    export_checkpoint(ckpt, "safetensors", old)
    assert sorted(p.name for p in old.iterdir()) == SAFETENSORS_EXPORT


def test_an_export_never_touches_what_it_did_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--out .` twice, with a run and notes added in between: the second export deleted them
    (the marker made the whole folder replaceable). It refuses now; a run inside --out too."""
    import fcntl
    import os

    _, ckpt, _ = make_run(tmp_path / "run", "gpt2")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    export_checkpoint(ckpt, "safetensors", Path("."))
    (here / "NOTES.md").write_text("mine")
    with pytest.raises(CheckpointError, match=r"holds what no hpcpipe export there wrote \(NOTES\.md\)"):
        export_checkpoint(ckpt, "hf", Path("."))
    assert (here / "NOTES.md").read_text() == "mine" and (here / "model.safetensors").is_file()
    with pytest.raises(CheckpointError, match="which an export must not touch"):
        export_checkpoint(ckpt, "safetensors", tmp_path)  # holds the run and its checkpoint
    (here / "NOTES.md").unlink()
    fd = os.open(here / ".hpcpipe-export.lock", os.O_RDWR)  # another export writing there now
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(CheckpointError, match="another export is writing there now"):
            export_checkpoint(ckpt, "hf", Path("."))
    finally:
        os.close(fd)
    export_checkpoint(ckpt, "hf", Path("."))
    assert (here / "config.json").is_file() and not (here / "model.safetensors.index.json").exists()


def test_the_training_s_adapter_is_staged_recorded_and_keeps_what_is_beside_it(tmp_path: Path) -> None:
    """It was written in place, unrecorded: a kill mid-write left a partial adapter that register
    uploaded. Staged now, with its step; the call threshold and decline rule stay beside it, and
    an adapter written before records is replaced."""
    from hpcpipe.recipes.export_folder import export_folder

    run = tmp_path / "run"
    adapter = run / "export" / "adapter"
    adapter.mkdir(parents=True)
    (run / "config.yaml").write_text("{}")
    for name in ("adapter_config.json", "adapter_model.safetensors", "call_threshold.json", "decline.json"):
        (adapter / name).write_text("before")
    for step in (5, 9):  # over an adapter written before records, then over a recorded one
        with export_folder(adapter, {"format": "adapter", "step": step}, keep_out_of=()) as staging:
            (staging / "adapter_model.safetensors").write_text(f"step {step}")
            assert (
                staging.parent == adapter
                and (adapter / "adapter_model.safetensors").read_text() != f"step {step}"
            )
    record = json.loads((adapter / ".hpcpipe-export").read_text())
    assert record == {"format": "adapter", "step": 9, "files": ["adapter_model.safetensors"]}
    assert sorted(p.name for p in adapter.iterdir()) == [
        ".hpcpipe-export", ".hpcpipe-export.lock", "adapter_model.safetensors", "call_threshold.json",
        "decline.json",
    ]  # fmt: skip


def test_a_file_system_without_flock_exports_unlocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lustre mounted without flock answers ENOSYS: the export ended in a traceback."""
    import errno

    from hpcpipe.checkpoint import export_record
    from hpcpipe.recipes.export_folder import export_folder

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(export_record.fcntl, "flock", no_locks)
    with export_folder(tmp_path / "out", {"format": "safetensors"}, keep_out_of=()) as staging:
        (staging / "model.safetensors").write_text("w")
    assert (tmp_path / "out" / "model.safetensors").read_text() == "w"


def _nfs_flock(fd: int, operation: int) -> None:
    """Linux NFS's flock: a POSIX lock, whose exclusive kind needs a descriptor open for writing."""
    import fcntl

    fcntl.lockf(fd, operation)


def test_on_nfs_exports_and_readers_lock_a_lock_file_no_export_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The lock was the folder, open read-only: on NFS every export's exclusive lock failed with
    EBADF and went on unlocked, saying the file system had no locks."""
    import logging

    from hpcpipe.checkpoint import export_record
    from hpcpipe.checkpoint.export_record import LOCK, finished_files, reading
    from hpcpipe.evaluate.calibrate import adapter_sha256
    from hpcpipe.recipes.export_folder import export_folder

    out = tmp_path / "run" / "export" / "adapter"
    (tmp_path / "run" / "export").mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text("{}")
    monkeypatch.setattr(export_record.fcntl, "flock", _nfs_flock)
    with caplog.at_level(logging.WARNING, logger="hpcpipe.checkpoint"):
        for step in (1, 2):  # the second export finds the first's lock file: not a foreign file
            with export_folder(out, {"format": "adapter", "step": step}, keep_out_of=()) as staging:
                (staging / "adapter_model.safetensors").write_text(f"step {step}")
        with reading(out):
            assert finished_files(out) == ["adapter_model.safetensors"]
    assert "no file locks" not in caplog.text and (out / LOCK).is_file()
    assert json.loads((out / ".hpcpipe-export").read_text())["files"] == ["adapter_model.safetensors"]
    (out / ".hpcpipe-export").unlink()  # an adapter written before records: its folder is the export
    assert finished_files(out, before_records=True) == ["adapter_model.safetensors"]
    (out / LOCK).unlink()
    hashed = adapter_sha256(out)
    (out / LOCK).touch()
    assert adapter_sha256(out) == hashed


def test_the_training_s_adapter_waits_for_a_register_reading_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A register uploading the adapter made the end of training fail at once, naming `--out`."""
    import fcntl
    import logging
    import os
    import threading

    from hpcpipe.checkpoint.export_record import LOCK
    from hpcpipe.recipes.export_folder import export_folder

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    reader = os.open(adapter / LOCK, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(reader, fcntl.LOCK_SH)  # a register hashing and uploading
    with (
        pytest.raises(CheckpointError) as refused,
        export_folder(adapter, {"format": "adapter"}, keep_out_of=(), flag=None, wait_s=0.3),
    ):
        pass
    busy = "still in use by another export or a register after 0.3 s; not written"
    assert str(refused.value) == f"{adapter}: {busy}"  # no `--out`: no option named it
    threading.Timer(0.3, os.close, [reader]).start()  # the upload ends
    with (
        caplog.at_level(logging.WARNING, logger="hpcpipe.checkpoint"),
        export_folder(adapter, {"format": "adapter"}, keep_out_of=(), flag=None, wait_s=30) as staging,
    ):
        (staging / "adapter_model.safetensors").write_text("w")
    assert caplog.text.count("in use by another export or a register; waiting up to 30 s") == 1
    assert (adapter / "adapter_model.safetensors").read_text() == "w"
    (adapter / "notes.txt").write_text("mine")
    foreign = rf"^{adapter}: holds .* \(notes\.txt\); move them out of it$"
    with (
        pytest.raises(CheckpointError, match=foreign),
        export_folder(adapter, {"format": "adapter"}, keep_out_of=(), flag=None),
    ):
        pass


def test_a_lock_file_this_user_may_not_write_or_create(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another user's lock file (read-only to this one) is locked read-only, which NFS refuses
    for an export: one line says why; a reader of a folder it may not write reads unlocked."""
    import errno
    import logging
    import os

    from hpcpipe.checkpoint import export_record
    from hpcpipe.checkpoint.export_record import LOCK, reading
    from hpcpipe.recipes.export_folder import export_folder

    out = tmp_path / "out"
    out.mkdir()
    real_open = os.open

    def denied(path: str | Path, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_ACCMODE == os.O_RDWR or not (out / LOCK).exists():
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, mode)

    monkeypatch.setattr(export_record.fcntl, "flock", _nfs_flock)
    monkeypatch.setattr(export_record.os, "open", denied)
    with caplog.at_level(logging.WARNING, logger="hpcpipe.checkpoint"):
        with reading(out):
            assert not (out / LOCK).exists()
        (out / LOCK).write_bytes(b"")  # another user's (not through os.open)
        with export_folder(out, {"format": "safetensors"}, keep_out_of=()) as staging:
            (staging / "model.safetensors").write_text("w")
    assert f"{out}: cannot create {LOCK} (Permission denied); reading it unlocked" in caplog.text
    assert f"{out}: {LOCK} is read-only to this user, and NFS locks only a writable file" in caplog.text
    assert (out / "model.safetensors").read_text() == "w"
