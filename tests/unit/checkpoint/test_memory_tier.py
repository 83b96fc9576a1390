"""The raw shard layout and the memory tier, in one process: checkpoints restore bitwise from
``/dev/shm`` copies an agent owns, a copy that differs from the disk manifest is passed over,
what does not fit is refused before anything is written, and checkpoints written before the raw
layout (DCP's torch.save files) still restore."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.unit.checkpoint.test_store import assert_same, make_model, snapshot, train_step

from hpcpipe.checkpoint import CheckpointStore, memory_tier
from hpcpipe.checkpoint.manifest import FileEntry, Manifest, hash_file, write_manifest
from hpcpipe.checkpoint.raw_format import ALIGN
from hpcpipe.checkpoint.safe_dcp import safe_load_metadata
from hpcpipe.checkpoint.state import extra_name, serialize_extra
from hpcpipe.config import CheckpointConfig
from hpcpipe.errors import UserError

pytestmark = pytest.mark.skipif(not memory_tier.SHM_ROOT.is_dir(), reason="needs /dev/shm")


def _saved(root: Path, steps: int = 2) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Train and save ``steps`` steps through a store with the memory tier; (last state, events)."""
    model, optimizer = make_model()
    events: list[dict[str, Any]] = []
    store = CheckpointStore(
        CheckpointConfig(), root, events=lambda kind, f: events.append({"kind": kind, **f})
    )
    for step in range(1, steps + 1):
        train_step(model, optimizer)
        store.save(step, model, optimizer, {"step": step})
    store.close()  # waits for the copies into memory
    return snapshot(model, optimizer), events


def _restore(root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    model, optimizer = make_model(seed=1)
    events: list[dict[str, Any]] = []
    store = CheckpointStore(
        CheckpointConfig(), root, events=lambda kind, f: events.append({"kind": kind, **f})
    )
    assert store.restore(model, optimizer) is not None
    store.close()
    restored = next(e for e in events if e["kind"] == "checkpoint_restored")
    return snapshot(model, optimizer), restored


def test_restore_reads_the_owned_memory_copy_bitwise(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    with memory_tier.owned(root, None) as tier:
        assert tier is not None
        saved, events = _saved(root)  # the store finds the tier its agent (this process) owns
        kept = [e["step"] for e in events if e["kind"] == "checkpoint_memory_kept"]
        assert kept == [1, 2] and sorted(p.name for p in tier.glob("step-*")) == ["step-00000002"]
        state, restored = _restore(root)
        assert_same(state, saved)
        assert restored["memory_files"] == 2  # both shards (io_threads=2); .metadata comes from disk
    assert not tier.exists(), "the tier goes when its last owner does"


def test_a_memory_copy_that_differs_from_the_manifest_is_never_used(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    with memory_tier.owned(root, None) as tier:
        assert tier is not None
        saved, _ = _saved(root)
        shard = sorted((tier / "step-00000002").glob("*.distcp"))[0]
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x40  # same size: only the hash can tell
        shard.write_bytes(bytes(data))
        state, restored = _restore(root)
        assert_same(state, saved)
        assert restored["memory_files"] == 1  # the damaged shard came from the disk


def test_what_does_not_fit_is_refused_before_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = tmp_path / "step-00000001"
    ckpt.mkdir()
    (ckpt / "a.distcp").write_bytes(b"x" * 4096)
    tier = memory_tier.MemoryTier(tmp_path / "shm", limit=1000)
    tier.root.mkdir()
    reason = tier.keep(1, ckpt, ["a.distcp"])
    assert reason == "0.00 GB of files > checkpoint.memory_limit_gb (0.00 GB)"
    tier.limit = 1 << 30
    monkeypatch.setattr(memory_tier, "_free", lambda path: 100)  # a full /dev/shm
    reason = tier.keep(1, ckpt, ["a.distcp"])
    assert reason is not None and "free space" in reason and "\n" not in reason
    assert list(tier.root.iterdir()) == []  # nothing half-written
    tier.close()


def test_a_limit_larger_than_shm_is_one_line() -> None:
    with pytest.raises(UserError, match=r"^checkpoint.memory_limit_gb=1e\+06 is larger than /dev/shm"):
        memory_tier.limit_bytes(1e6)


def test_shards_hold_raw_tensors_at_aligned_offsets(tmp_path: Path) -> None:
    saved, _ = _saved(tmp_path, steps=1)
    ckpt = tmp_path / "step-00000001"
    assert json.loads((ckpt / "manifest.json").read_text())["tensor_format"] == "raw"
    with (ckpt / ".metadata").open("rb") as handle:
        metadata = safe_load_metadata(handle, "metadata")
    weight = next(i for i in metadata.storage_data if i.fqn == "model.tok_emb.weight")
    info = metadata.storage_data[weight]
    assert info.offset % ALIGN == 0
    stored = torch.frombuffer(bytearray((ckpt / info.relative_path).read_bytes()), dtype=torch.float32)
    count = info.length // 4
    assert torch.equal(
        stored[info.offset // 4 : info.offset // 4 + count], saved["params"]["tok_emb.weight"].flatten()
    )


def test_a_checkpoint_in_dcp_torch_save_layout_still_restores(tmp_path: Path) -> None:
    """What hpcpipe wrote before the raw layout: DCP's own FileSystemWriter, no tensor_format."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizer = make_model()
    train_step(model, optimizer)
    ckpt = tmp_path / "step-00000001"
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=dcp.FileSystemWriter(ckpt), no_dist=True)
    (ckpt / "extra").mkdir()
    (ckpt / extra_name(0)).write_bytes(serialize_extra({"step": 1}))
    files = {p.relative_to(ckpt).as_posix(): hash_file(p) for p in ckpt.rglob("*") if p.is_file()}
    write_manifest(ckpt, Manifest(1, 1, "", {k: FileEntry(e.digest, e.size) for k, e in files.items()}))
    assert "tensor_format" not in json.loads((ckpt / "manifest.json").read_text())
    state, restored = _restore(tmp_path)
    assert_same(state, snapshot(model, optimizer))
    assert restored["step"] == 1


def test_a_name_someone_else_made_in_shm_is_not_used(tmp_path: Path) -> None:
    """/dev/shm is every user's: a link planted at the tier's name must not lead writes elsewhere."""
    root = tmp_path / "ckpt"
    victim = tmp_path / "victim"
    (victim / "step-00000001").mkdir(parents=True)
    planted = memory_tier.tier_root(root)
    planted.symlink_to(victim)
    try:
        with memory_tier.owned(root, None) as tier:
            assert tier is None
            assert memory_tier.MemoryTier.of_agent(root, None) is None
    finally:
        planted.unlink()
    assert [p.name for p in victim.iterdir()] == ["step-00000001"]


def test_an_agent_removes_the_tiers_no_agent_holds(tmp_path: Path) -> None:
    """An agent killed with SIGKILL left its tier in RAM until a reboot (1,731 of them here)."""
    import fcntl
    import os

    shm = tmp_path / "shm"
    shm.mkdir()
    abandoned, held = memory_tier.tier_root(tmp_path / "a", shm), memory_tier.tier_root(tmp_path / "b", shm)
    making = memory_tier.tier_root(tmp_path / "c", shm)  # an agent between its mkdir and its lock
    for root in (abandoned, held, making):
        (root / "step-00000005").mkdir(parents=True, mode=0o700)
        root.chmod(0o700)
    for root in (abandoned, held):
        (root / ".lock").touch()
    holder = os.open(held / ".lock", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_SH)  # a live agent
    try:
        with memory_tier.owned(tmp_path / "mine", None, shm) as tier:
            assert tier is not None and tier.is_dir()
            assert not abandoned.exists() and (held / "step-00000005").is_dir() and making.is_dir()
    finally:
        os.close(holder)


@pytest.mark.parametrize("when", ["before its owner check", "before its lock"])
def test_a_tier_another_agent_sweeps_away_while_this_one_takes_it_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """Another agent's sweep removed an abandoned tier between this one's mkdir and its lock: a
    FileNotFoundError traceback, or (a moment earlier) a run without its tier, blaming another user."""
    import os
    import shutil

    root = memory_tier.tier_root(tmp_path / "ckpt", tmp_path)
    name = "_ours" if when == "before its owner check" else "open"
    owner = memory_tier if name == "_ours" else memory_tier.os
    real, swept = getattr(owner, name), []

    def after_a_sweep(path: object, *args: object, **kwargs: object) -> object:
        if not swept and (name == "_ours" or str(path).endswith(".lock")):
            swept.append(True)
            shutil.rmtree(root)  # the sweep of another agent, at the worst moment
        return real(path, *args, **kwargs)

    monkeypatch.setattr(owner, name, after_a_sweep)
    fd = memory_tier._hold_shared(root)
    assert fd is not None and swept and (root / ".lock").is_file()
    os.close(fd)
