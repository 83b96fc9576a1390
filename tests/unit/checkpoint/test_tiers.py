"""The durable tier: background copies that are verified before they become visible, its own
retention, and resuming from it when the fast tier is gone."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from hpcpipe.checkpoint import CheckpointStore, tiers
from hpcpipe.checkpoint.manifest import step_dir_name, verify_dir
from hpcpipe.config import CheckpointConfig, ModelConfig
from hpcpipe.models.gpt import GPT

Events = list[tuple[str, dict[str, Any]]]


def _model() -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layers=1, d_model=16, n_heads=2, seq_len=8), 32)
    return model, torch.optim.AdamW(model.parameters())


def _store(tmp_path: Path, events: Events, **cfg: Any) -> CheckpointStore:
    config = CheckpointConfig(durable_dir=str(tmp_path / "durable"), **cfg)
    return CheckpointStore(config, tmp_path / "fast", events=lambda k, f: events.append((k, f)))


def _names(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


@pytest.mark.parametrize("async_save", [False, True])
def test_durable_copies_follow_the_schedule_and_verify(tmp_path: Path, async_save: bool) -> None:
    events: Events = []
    store = _store(tmp_path, events, keep_last=2, durable_every_steps=2, **{"async": async_save})
    model, optimizer = _model()
    for step in range(1, 7):
        store.save(step, model, optimizer, {"step": step})
    store.close()
    assert _names(tmp_path / "fast") == ["step-00000005", "step-00000006"]
    assert _names(tmp_path / "durable") == ["step-00000004", "step-00000006"]
    assert all(verify_dir(p)[1] == [] for p in (tmp_path / "durable").iterdir())
    copied = [f["step"] for k, f in events if k == "checkpoint_durable_copied"]
    assert copied == [2, 4, 6]


def test_forced_save_is_copied_whatever_the_schedule(tmp_path: Path) -> None:
    events: Events = []
    store = _store(tmp_path, events, durable_every_steps=100)
    model, optimizer = _model()
    store.save(3, model, optimizer, {})
    store.save(4, model, optimizer, {}, force_durable=True)
    store.close()
    assert _names(tmp_path / "durable") == ["step-00000004"]


def test_resume_from_durable_when_the_fast_tier_is_lost(tmp_path: Path) -> None:
    events: Events = []
    store = _store(tmp_path, events)
    model, optimizer = _model()
    store.save(8, model, optimizer, {"step": 8})
    store.close()
    shutil.rmtree(tmp_path / "fast")  # e.g. the job moved to another node
    fresh, fresh_opt = _model()
    restorer = _store(tmp_path, events)
    assert restorer.restore(fresh, fresh_opt) == {"step": 8}
    assert restorer.restored is not None and restorer.restored.tier == "durable"
    for key, value in model.state_dict().items():
        assert torch.equal(value, fresh.state_dict()[key])


def test_the_durable_copy_training_resumed_from_is_never_pruned(tmp_path: Path) -> None:
    """checkpoint.keep_last keeps the checkpoint training resumed from in every tier: resumed
    from the durable tier (the fast one lost), its durable copy outlives keep_last=1."""
    events: Events = []
    model, optimizer = _model()
    first = _store(tmp_path, events)
    first.save(8, model, optimizer, {"step": 8})
    first.close()
    shutil.rmtree(tmp_path / "fast")
    restorer = _store(tmp_path, events, keep_last=1)
    assert restorer.restore(model, optimizer) == {"step": 8}
    for step in (9, 10):
        restorer.save(step, model, optimizer, {"step": step})
    restorer.close()
    assert _names(tmp_path / "durable") == ["step-00000008", "step-00000010"]
    assert _names(tmp_path / "fast") == ["step-00000010"]


def test_a_copy_that_does_not_verify_never_becomes_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_copy = tiers._copy_durably

    def corrupting_copy(src: Path, dest: Path) -> None:
        real_copy(src, dest)
        if dest.suffix == ".distcp":
            with dest.open("r+b") as handle:
                handle.write(b"\x00\x01")

    monkeypatch.setattr(tiers, "_copy_durably", corrupting_copy)
    events: Events = []
    store = _store(tmp_path, events)
    model, optimizer = _model()
    store.save(1, model, optimizer, {})
    store.close()
    assert _names(tmp_path / "durable") == []  # neither step-* nor a leftover .tmp-*
    failed = [f for k, f in events if k == "checkpoint_durable_failed"]
    assert failed and ".distcp" in failed[0]["error"] and "BLAKE3 mismatch" in failed[0]["error"]
    assert _names(tmp_path / "fast") == ["step-00000001"]


def test_prune_leaves_a_checkpoint_committed_while_it_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pruning runs behind the training loop, and a save may commit while it does: what was not
    in the listing it decided on is not deleted. Acting on a second listing deleted the newest
    checkpoint as "not kept" (a fresh clone's suite, 2026-12-04: step 5 of
    test_durable_copies_follow_the_schedule_and_verify gone before its own verification)."""
    for step in (3, 4):
        (tmp_path / step_dir_name(step)).mkdir()
    real_committed = tiers.Tier.committed

    def committed_then_a_save_commits(self: tiers.Tier) -> list[tuple[int, Path]]:
        listed = real_committed(self)
        (tmp_path / step_dir_name(5)).mkdir(exist_ok=True)  # step 5 committed after the listing
        return listed

    monkeypatch.setattr(tiers.Tier, "committed", committed_then_a_save_commits)
    deleted = tiers.Tier("fast", tmp_path).prune(keep_last=1, keep_every=0, protected=set)
    assert deleted == [3]
    assert _names(tmp_path) == ["step-00000004", "step-00000005"]


def test_prune_reads_what_is_protected_after_its_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps 4 and 5 commit while the job pruning for step 3 starts, 4 already queued for its
    own verification: read after the listing, the queue protects 4 (read before, it would not,
    and 4 would be deleted unverified); 5, the newest, is kept by keep_last."""
    (tmp_path / step_dir_name(3)).mkdir()
    queued = {3}
    real_committed = tiers.Tier.committed

    def two_saves_commit_first(self: tiers.Tier) -> list[tuple[int, Path]]:
        for step in (4, 5):
            (tmp_path / step_dir_name(step)).mkdir(exist_ok=True)
        queued.add(4)
        return real_committed(self)

    monkeypatch.setattr(tiers.Tier, "committed", two_saves_commit_first)
    tier = tiers.Tier("fast", tmp_path)
    assert tier.prune(keep_last=1, keep_every=0, protected=lambda: set(queued)) == []
    assert _names(tmp_path) == ["step-00000003", "step-00000004", "step-00000005"]


class _Crash(BaseException):
    """The process killed at that point (nothing after it runs)."""


def _saved(tier: tiers.Tier, step: int, text: str) -> Path:
    tmp = tier.new_temporary(step, "tok")
    tmp.mkdir(parents=True)
    (tmp / "weights").write_text(text)
    return tmp


@pytest.mark.parametrize("crash_in", ["rmtree", "second_rename"])
def test_a_crash_while_a_step_is_saved_again_keeps_one_whole_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_in: str
) -> None:
    """The old copy was deleted before the new one was renamed in: killed during that deletion
    (minutes on a shared file system), the run had neither, and the next start removed the new
    one as a temporary."""
    tier = tiers.Tier("fast", tmp_path)
    tier.commit(_saved(tier, 20, "old"), 20)
    real_replace = tiers.os.replace

    def crashing_rmtree(*args: Any, **kwargs: Any) -> None:
        raise _Crash

    def crashing_replace(src: Any, dest: Any) -> None:
        if Path(src).name.startswith(".tmp-"):
            raise _Crash
        real_replace(src, dest)

    if crash_in == "rmtree":
        monkeypatch.setattr(tiers.shutil, "rmtree", crashing_rmtree)
    else:
        monkeypatch.setattr(tiers.os, "replace", crashing_replace)
    with pytest.raises(_Crash):
        tier.commit(_saved(tier, 20, "new"), 20)
    monkeypatch.undo()
    tier.cleanup_temporaries()  # the next start
    [(step, path)] = tier.committed()
    assert step == 20 and (path / "weights").read_text() == ("new" if crash_in == "rmtree" else "old")
    assert _names(tmp_path) == ["step-00000020"]


def test_a_commit_makes_every_directory_of_the_checkpoint_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the top folder was fsynced: after a power loss a committed step could lack
    extra/rank-N.pt (a subdirectory's entries are its own)."""
    from hpcpipe import fsutil

    synced: list[str] = []
    monkeypatch.setattr(fsutil, "fsync_dir", lambda path: synced.append(Path(path).name))
    tier = tiers.Tier("fast", tmp_path)
    tmp = _saved(tier, 5, "w")
    (tmp / "extra").mkdir()
    (tmp / "extra" / "rank-00000.pt").write_bytes(b"x")
    tier.commit(tmp, 5)
    assert "extra" in synced and synced.index("extra") < synced.index(tmp.name)
