"""CheckpointStore in one process: commit layout, exact restore, async snapshots, fallback on every
kind of damage, retention, temporaries, a full disk. DCP runs without a process group here."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hpcpipe.checkpoint import (
    CheckpointError,
    CheckpointStore,
    capture_rng_state,
    restore_rng_state,
    safe_dcp,
)
from hpcpipe.checkpoint.manifest import hash_file, verify_dir
from hpcpipe.config import CheckpointConfig, ModelConfig
from hpcpipe.models.gpt import GPT

TINY = ModelConfig(n_layers=1, d_model=16, n_heads=2, seq_len=8)
VOCAB = 32


def make_model(seed: int = 0) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = GPT(TINY, VOCAB)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: GPT, optimizer: torch.optim.Optimizer) -> None:
    idx = torch.randint(0, VOCAB, (2, 8))
    loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def snapshot(model: GPT, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Deep copies of parameters and optimizer moments, comparable with ``assert_same``."""
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    moments = {i: {k: v.clone() for k, v in s.items()} for i, s in optimizer.state_dict()["state"].items()}
    return {"params": params, "moments": moments}


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["params"].keys() == b["params"].keys()
    for key in a["params"]:
        assert torch.equal(a["params"][key], b["params"][key]), key
    assert a["moments"].keys() == b["moments"].keys()
    for index, state in a["moments"].items():
        for key, value in state.items():
            assert torch.equal(value, b["moments"][index][key]), (index, key)


def store_for(
    root: Path, events: list[tuple[str, dict[str, Any]]] | None = None, **cfg: Any
) -> CheckpointStore:
    sink = (lambda kind, fields: events.append((kind, fields))) if events is not None else None
    return CheckpointStore(CheckpointConfig(**cfg), root, config_hash="cafe", events=sink)


def save_steps(root: Path, steps: list[int], **cfg: Any) -> dict[int, dict[str, Any]]:
    """Train and save at each step; the snapshot of model + optimizer at every saved step."""
    model, optimizer = make_model()
    store = store_for(root, **cfg)
    states = {}
    for step in steps:
        train_step(model, optimizer)
        store.save(step, model, optimizer, {"step": step})
        states[step] = snapshot(model, optimizer)
    store.close()
    return states


def restore_into_fresh(
    root: Path, events: list[tuple[str, dict[str, Any]]] | None = None, **cfg: Any
) -> tuple[dict[str, Any] | None, dict[str, Any], CheckpointStore]:
    model, optimizer = make_model(seed=123)  # different init: a real load must overwrite it
    store = store_for(root, events, **cfg)
    extra = store.restore(model, optimizer)
    store.close()
    return extra, snapshot(model, optimizer), store


# -- commit --------------------------------------------------------------------------------------


def test_commit_layout_and_manifest(tmp_path: Path) -> None:
    save_steps(tmp_path, [7])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000007"]
    ckpt = tmp_path / "step-00000007"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["step"] == 7 and manifest["world_size"] == 1 and manifest["config_hash"] == "cafe"
    on_disk = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest["files"]) == on_disk
    assert {".metadata", "extra/rank-00000.pt"} <= on_disk
    assert any(name.endswith(".distcp") for name in on_disk)
    algorithm = manifest["hash"]
    assert algorithm == CheckpointConfig().hash
    for name, entry in manifest["files"].items():
        assert entry == {
            "size": (ckpt / name).stat().st_size,
            algorithm: hash_file(ckpt / name, algorithm).digest,
        }


@pytest.mark.parametrize("async_save", [False, True])
def test_restore_is_exact(tmp_path: Path, async_save: bool) -> None:
    states = save_steps(tmp_path, [1, 2], async_save=async_save)
    extra, restored, store = restore_into_fresh(tmp_path)
    assert extra == {"step": 2}
    assert_same(restored, states[2])
    assert store.restored is not None and store.restored.step == 2 and store.restored.tier == "fast"


def test_async_save_writes_the_state_of_the_call_not_later_updates(tmp_path: Path) -> None:
    model, optimizer = make_model()
    train_step(model, optimizer)
    store = store_for(tmp_path, async_save=True)
    store.save(1, model, optimizer, {"step": 1})
    at_save = snapshot(model, optimizer)
    for _ in range(3):  # training goes on while the background thread writes
        train_step(model, optimizer)
    store.close()
    _, restored, _ = restore_into_fresh(tmp_path)
    assert_same(restored, at_save)


def test_extra_round_trips_rng_state(tmp_path: Path) -> None:
    model, optimizer = make_model()
    store = store_for(tmp_path)
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    store.save(1, model, optimizer, {"rng": capture_rng_state(), "loader": {"offset": 3}})
    store.close()
    expected = (torch.rand(3), random.random(), np.random.rand())
    extra, _, _ = restore_into_fresh(tmp_path)
    assert extra is not None and extra["loader"] == {"offset": 3}
    restore_rng_state(extra["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]


# -- verify and fall back ------------------------------------------------------------------------


def _shard(ckpt: Path) -> Path:
    return sorted(ckpt.glob("*.distcp"))[0]


def _truncate(ckpt: Path) -> str:
    shard = _shard(ckpt)
    shard.write_bytes(shard.read_bytes()[:-100])
    return shard.name


def _flip_bit(ckpt: Path) -> str:
    shard = _shard(ckpt)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    return shard.name


def _delete_manifest(ckpt: Path) -> str:
    (ckpt / "manifest.json").unlink()
    return "manifest.json"


def _delete_shard(ckpt: Path) -> str:
    shard = _shard(ckpt)
    shard.unlink()
    return shard.name


def _flip_metadata(ckpt: Path) -> str:
    meta = ckpt / ".metadata"
    data = bytearray(meta.read_bytes())
    data[10] ^= 0xFF
    meta.write_bytes(bytes(data))
    return ".metadata"


@pytest.mark.parametrize("damage", [_truncate, _flip_bit, _delete_manifest, _delete_shard, _flip_metadata])
def test_damaged_newest_falls_back_to_previous(tmp_path: Path, damage: Any) -> None:
    states = save_steps(tmp_path, [1, 2])
    bad_file = damage(tmp_path / "step-00000002")
    events: list[tuple[str, dict[str, Any]]] = []
    extra, restored, _ = restore_into_fresh(tmp_path, events)
    assert extra == {"step": 1}
    assert_same(restored, states[1])
    fallbacks = [fields for kind, fields in events if kind == "checkpoint_fallback"]
    assert fallbacks and fallbacks[0]["file"] == bad_file and fallbacks[0]["step"] == 2
    assert [kind for kind, _ in events][-1] == "checkpoint_restored"


def test_fallback_walks_past_several_bad_checkpoints(tmp_path: Path) -> None:
    states = save_steps(tmp_path, [1, 2, 3], keep_last=5)
    _flip_bit(tmp_path / "step-00000003")
    _delete_manifest(tmp_path / "step-00000002")
    extra, restored, _ = restore_into_fresh(tmp_path)
    assert extra == {"step": 1}
    assert_same(restored, states[1])


def test_none_verifies_is_one_clear_error(tmp_path: Path) -> None:
    save_steps(tmp_path, [1])
    name = _flip_bit(tmp_path / "step-00000001")
    with pytest.raises(CheckpointError) as err:
        restore_into_fresh(tmp_path)
    message = str(err.value)
    assert "\n" not in message and name in message and "scratch_if_none_verify" in message


def test_none_verifies_can_start_from_scratch(tmp_path: Path) -> None:
    save_steps(tmp_path, [1])
    _truncate(tmp_path / "step-00000001")
    events: list[tuple[str, dict[str, Any]]] = []
    extra, _, _ = restore_into_fresh(tmp_path, events, scratch_if_none_verify=True)
    assert extra is None
    assert "checkpoint_none_verify" in [kind for kind, _ in events]


def test_resume_modes(tmp_path: Path) -> None:
    assert restore_into_fresh(tmp_path)[0] is None  # auto, nothing there: fresh start
    with pytest.raises(CheckpointError, match="resume=required"):
        restore_into_fresh(tmp_path, resume="required")
    assert restore_into_fresh(tmp_path, resume="never")[0] is None  # nothing there: fresh
    save_steps(tmp_path, [1, 6])
    # An earlier run's checkpoints: a fresh start there would mix them (its step 1 replaced,
    # step 6 left to be the next resume's "newest"), so it is refused.
    with pytest.raises(CheckpointError, match=r"resume=never: .* \(newest step 6\); give the new run"):
        restore_into_fresh(tmp_path, resume="never")


def test_resume_never_restarts_fresh_within_its_own_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The elastic agent's restart (or a requeue) of a resume=never job starts fresh, as before."""
    save_steps(tmp_path, [1])
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert restore_into_fresh(tmp_path, resume="never")[0] is None


def test_a_checkpoint_of_another_model_is_a_clear_error(tmp_path: Path) -> None:
    save_steps(tmp_path, [1])
    model = GPT(ModelConfig(n_layers=1, d_model=32, n_heads=2, seq_len=8), VOCAB)
    store = store_for(tmp_path)
    with pytest.raises(CheckpointError, match="does not load into this model"):
        store.restore(model, torch.optim.AdamW(model.parameters()))


# -- retention and temporaries -------------------------------------------------------------------


@pytest.mark.parametrize("async_save", [False, True])
def test_retention_under_many_quick_saves(tmp_path: Path, async_save: bool) -> None:
    """keep_last=2 + keep_every=4 over 12 saves, with a reader verifying the newest all along."""
    errors: list[str] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            committed = sorted(tmp_path.glob("step-*"))
            if committed:
                _, problems = verify_dir(committed[-1])
                errors.extend(str(p) for p in problems if committed[-1].exists())

    thread = threading.Thread(target=reader)
    thread.start()
    events: list[tuple[str, dict[str, Any]]] = []
    model, optimizer = make_model()
    store = store_for(tmp_path, events, keep_last=2, keep_every=4, async_save=async_save)
    for step in range(1, 13):
        store.save(step, model, optimizer, {"step": step})
    store.close()
    done.set()
    thread.join()
    assert errors == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000004",
        "step-00000008",
        "step-00000011",
        "step-00000012",
    ]
    assert all(not verify_dir(p)[1] for p in tmp_path.iterdir())
    assert not [kind for kind, _ in events if kind.endswith("_failed")]


def test_a_lagging_verifier_never_prunes_what_it_has_yet_to_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saves outrun the after-commit thread (CI saw it with async saves): the job for step 1
    runs when steps 2-5 are committed; keep_last=2 must not delete 2 and 3 before their own
    jobs verify them (that was a spurious checkpoint_verify_failed)."""
    from hpcpipe.checkpoint import after_commit

    release = threading.Event()
    real_verify = after_commit.verify_dir

    def verify_after_release(path: Path) -> Any:
        assert release.wait(timeout=30), "the test never released the verifier"
        return real_verify(path)

    monkeypatch.setattr(after_commit, "verify_dir", verify_after_release)
    events: list[tuple[str, dict[str, Any]]] = []
    model, optimizer = make_model()
    store = store_for(tmp_path, events, keep_last=2)
    for step in range(1, 6):
        store.save(step, model, optimizer, {"step": step})
    release.set()
    store.close()
    assert [kind for kind, _ in events if kind.endswith("_failed")] == []
    assert [f["step"] for kind, f in events if kind == "checkpoint_verified"] == [1, 2, 3, 4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000005"]


def test_a_step_renamed_into_place_while_an_older_job_prunes_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that started over beside an older run's step 30, keep_last=1: the job for step 12
    prunes just after step 14 is renamed into place, before 14 is queued. 14 was reserved before
    its rename, so it is protected; by step order alone 30 is "the newest" and 14 was deleted
    before its own verification."""
    from hpcpipe.checkpoint import after_commit, tiers

    save_steps(tmp_path, [30])
    renamed, pruned = threading.Event(), threading.Event()
    real_verify, real_commit, real_prune = after_commit.verify_dir, tiers.Tier.commit, tiers.Tier.prune

    def verify_12_once_14_is_renamed(path: Path) -> Any:
        if path.name == "step-00000012":
            assert renamed.wait(timeout=30), "step 14 was never renamed into place"
        return real_verify(path)

    def commit_then_let_the_job_for_12_prune(self: tiers.Tier, tmp: Path, step: int) -> Path:
        final = real_commit(self, tmp, step)
        if step == 14:
            renamed.set()
            assert pruned.wait(timeout=30), "the job for step 12 never pruned"
        return final

    def prune_then_tell(self: tiers.Tier, *args: Any) -> list[int]:
        deleted = real_prune(self, *args)
        pruned.set()
        return deleted

    monkeypatch.setattr(after_commit, "verify_dir", verify_12_once_14_is_renamed)
    monkeypatch.setattr(tiers.Tier, "commit", commit_then_let_the_job_for_12_prune)
    monkeypatch.setattr(tiers.Tier, "prune", prune_then_tell)
    events: list[tuple[str, dict[str, Any]]] = []
    model, optimizer = make_model()
    store = store_for(tmp_path, events, keep_last=1)
    for step in (12, 14):
        store.save(step, model, optimizer, {"step": step})
    store.close()
    assert [kind for kind, _ in events if kind.endswith("_failed")] == []
    assert [f["step"] for kind, f in events if kind == "checkpoint_verified"] == [12, 14]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000014", "step-00000030"]


def test_the_checkpoint_resumed_from_is_never_pruned(tmp_path: Path) -> None:
    save_steps(tmp_path, [5])
    model, optimizer = make_model()
    store = store_for(tmp_path, keep_last=1)
    store.restore(model, optimizer)
    for step in (6, 7, 8):
        store.save(step, model, optimizer, {})
    store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000005", "step-00000008"]


def test_cleanup_removes_only_our_temporaries(tmp_path: Path) -> None:
    save_steps(tmp_path, [1])
    ours = [tmp_path / ".tmp-step-00000002-ab12cd-1", tmp_path / ".trash-step-00000001-0f0f"]
    for path in ours:
        (path / "extra").mkdir(parents=True)
        (path / "extra" / "rank-00000.pt").write_bytes(b"x")
    (tmp_path / ".tmp-notes").mkdir()
    (tmp_path / ".tmp-step-00000003-file").write_text("a file, not a save")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (tmp_path / ".tmp-step-00000004-link").symlink_to(outside)
    store = store_for(tmp_path)
    in_flight = tmp_path / f".tmp-step-00000009-{store._token}-1"  # this store's own save
    in_flight.mkdir()
    removed = store.cleanup_temporaries()
    assert removed == sorted(p.name for p in ours)
    assert in_flight.is_dir()
    assert not any(p.exists() for p in ours)
    assert (tmp_path / ".tmp-notes").is_dir() and (tmp_path / ".tmp-step-00000003-file").is_file()
    assert outside.is_dir() and (tmp_path / "step-00000001").is_dir()


# -- a full disk ---------------------------------------------------------------------------------


@pytest.mark.parametrize("async_save", [False, True])
def test_full_disk_is_a_clear_error_and_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, async_save: bool
) -> None:
    model, optimizer = make_model()
    store = store_for(tmp_path, async_save=async_save)
    store.save(1, model, optimizer, {"step": 1})
    store.wait()
    real_init = safe_dcp._HashingStream.__init__

    class FullDisk:
        """A shard file on a full disk: opening works, writing fails with ENOSPC."""

        def __init__(self, raw: Any) -> None:
            self.raw = raw

        def write(self, data: Any) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name: str) -> Any:
            return getattr(self.raw, name)

    def on_full_disk(self: Any, raw: Any, path: Path, algorithm: str = "sha256") -> None:
        real_init(self, FullDisk(raw) if path.name == "__0_1.distcp" else raw, path, algorithm)

    monkeypatch.setattr(safe_dcp._HashingStream, "__init__", on_full_disk)
    with pytest.raises(CheckpointError) as err:
        store.save(2, model, optimizer, {"step": 2})
        store.wait()
    message = str(err.value)
    assert "No space left on device" in message and "__0_1.distcp" in message and str(tmp_path) in message
    assert "\n" not in message
    monkeypatch.undo()
    store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001"]
    assert verify_dir(tmp_path / "step-00000001")[1] == []
    store = store_for(tmp_path)  # and the store still works after the disk is freed
    store.save(3, model, optimizer, {})
    store.close()
    assert (tmp_path / "step-00000003").is_dir()


def test_same_step_saved_again_replaces_the_old_one(tmp_path: Path) -> None:
    save_steps(tmp_path, [4])
    before = (tmp_path / "step-00000004" / "manifest.json").read_text()
    save_steps(tmp_path, [4])
    assert (tmp_path / "step-00000004" / "manifest.json").read_text() != before
    assert verify_dir(tmp_path / "step-00000004")[1] == []
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000004"]


def test_rejects_extra_that_weights_only_cannot_load(tmp_path: Path) -> None:
    model, optimizer = make_model()
    store = store_for(tmp_path)
    with pytest.raises(TypeError, match=r"extra\.loader\.perm"):
        store.save(1, model, optimizer, {"loader": {"perm": np.arange(3)}})
    store.close()
    assert list(tmp_path.iterdir()) == []


# -- checkpoint.hash: blake3 (the default) and sha256 ---------------------------------------------


@pytest.mark.parametrize(
    ("algorithm", "label", "digest"),
    [
        ("blake3", "BLAKE3", lambda data: __import__("blake3").blake3(data).hexdigest()),
        ("sha256", "SHA-256", lambda data: hashlib.sha256(data).hexdigest()),
    ],
)
def test_each_hash_commits_verifies_and_restores(
    tmp_path: Path, algorithm: str, label: str, digest: Any
) -> None:
    states = save_steps(tmp_path, [1, 2], hash=algorithm)
    ckpt = tmp_path / "step-00000002"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["hash"] == algorithm
    for name, entry in manifest["files"].items():
        data = (ckpt / name).read_bytes()
        assert entry == {"size": len(data), algorithm: digest(data)}
    shard = next(ckpt.glob("*.distcp"))
    (ckpt / shard.name).write_bytes(b"\0" + shard.read_bytes()[1:])  # one byte changed
    events: list[tuple[str, dict[str, Any]]] = []
    extra, restored, _ = restore_into_fresh(tmp_path, events=events)
    assert extra == {"step": 1}  # fell back past the damaged step 2
    assert_same(restored, states[1])
    fallback = next(fields for kind, fields in events if kind == "checkpoint_fallback")
    assert fallback["file"] == shard.name and fallback["reason"] == f"{label} mismatch"


def test_blake3_without_the_package_names_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "blake3", None)  # import blake3 -> ImportError
    with pytest.raises(CheckpointError, match=r"checkpoint\.hash=blake3 needs the blake3 package"):
        store_for(tmp_path, hash="blake3")


def _statvfs_with_free(free: int) -> Any:
    return lambda _path: os.statvfs_result((4096, 1, 0, 0, free, 0, 0, 0, 0, 255))


@pytest.mark.parametrize(("free", "expected"), [(1 << 20, "No space left on device"), (1 << 30, "cut short")])
def test_a_short_write_in_torchs_zip_writer_is_named_by_the_space_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free: int, expected: str
) -> None:
    # What a full disk looked like once in CI: no OSError, a RuntimeError from inline_container.cc.
    from torch.distributed.checkpoint.api import CheckpointException

    from hpcpipe.checkpoint import save_errors

    short = RuntimeError("[enforce fail at inline_container.cc:671] . unexpected pos 704 vs 598")
    exc = CheckpointException("save", {1: (short, None)})
    monkeypatch.setattr(save_errors.os, "statvfs", _statvfs_with_free(free))
    cause = save_errors.short_write(exc, tmp_path / ".tmp-step-00000004")
    assert cause is not None and save_errors.root_os_error(exc) is None
    message = save_errors.save_error_message(4, tmp_path, cause)
    assert expected in message and message.endswith("earlier checkpoints are intact")
    bug = CheckpointException("save", {0: (RuntimeError("a bug"), None)})
    assert save_errors.short_write(bug, tmp_path) is None


def test_a_checkpoint_that_failed_verification_takes_no_place_in_retention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """keep_last=2 counted step 15, known bad, and deleted step 10: one usable checkpoint was
    left, and nothing to fall back to if step 20 were lost."""
    from hpcpipe.checkpoint import after_commit
    from hpcpipe.checkpoint.manifest import Problem

    real_verify = after_commit.verify_dir

    def fifteen_is_damaged(path: Path) -> Any:
        found, problems = real_verify(path)
        return (
            (found, [Problem("__0_0.distcp", "sha256 mismatch")])
            if path.name.endswith("15")
            else (found, problems)
        )

    monkeypatch.setattr(after_commit, "verify_dir", fifteen_is_damaged)
    events: list[tuple[str, dict[str, Any]]] = []
    model, optimizer = make_model()
    store = store_for(tmp_path, events, keep_last=2)
    for step in (10, 15, 20):
        store.save(step, model, optimizer, {"step": step})
    store.close()
    assert [f["step"] for kind, f in events if kind == "checkpoint_verify_failed"] == [15]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000010", "step-00000020"]
