"""checkpoint/after_commit.py: what runs after a commit (verification, durable copy), seen
through the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.unit.checkpoint.test_store import make_model, store_for, train_step


@pytest.mark.parametrize("async_save", [False, True])
def test_a_final_save_of_the_step_just_saved_only_adds_the_durable_copy(
    tmp_path: Path, async_save: bool
) -> None:
    """A preemption (or a pruned trial) right after the periodic save wrote the step again: twice
    the save inside the grace, and its commit moved the first copy aside under its verification
    and durable copy (false checkpoint_verify_failed / checkpoint_durable_failed events)."""
    events: list[tuple[str, dict[str, Any]]] = []
    model, optimizer = make_model()
    durable = tmp_path / "durable"
    cfg = {"keep_last": 1, "async_save": async_save, "durable_dir": str(durable), "durable_every_steps": 100}
    store = store_for(tmp_path / "fast", events, **cfg)
    for step in (10, 11):
        train_step(model, optimizer)
        store.save(step, model, optimizer, {"step": step})
        store.save(step, model, optimizer, {"step": step}, force_durable=True)
        store.wait()
    store.close()
    assert [kind for kind, _ in events if kind.endswith("_failed")] == []
    assert [f["step"] for kind, f in events if kind == "checkpoint_committed"] == [10, 11]
    assert [f["step"] for kind, f in events if kind == "checkpoint_durable_copied"] == [10, 11]
    assert sorted(p.name for p in durable.iterdir()) == ["step-00000011"]
