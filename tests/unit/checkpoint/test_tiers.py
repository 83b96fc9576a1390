"""The durable tier: background copies that are verified before they become visible, its own
retention, and resuming from it when the fast tier is gone."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from hpcpipe.checkpoint import CheckpointStore, tiers
from hpcpipe.checkpoint.manifest import verify_dir
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
