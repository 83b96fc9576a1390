"""Nothing in a checkpoint is unpickled unsafely: crafted .metadata, byte items and trainer state
are refused without running them, even when the manifest's hashes have been forged to match."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from hpcpipe import compat
from hpcpipe.checkpoint import CheckpointError, CheckpointStore
from hpcpipe.checkpoint.manifest import hash_file
from hpcpipe.checkpoint.safe_dcp import SafeFileSystemReader, SafeLoadPlanner, safe_load_metadata
from hpcpipe.checkpoint.state import load_extra
from hpcpipe.config import CheckpointConfig, ModelConfig
from hpcpipe.models.gpt import GPT


class Payload:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def _model() -> tuple[GPT, torch.optim.Optimizer]:
    model = GPT(ModelConfig(n_layers=1, d_model=16, n_heads=2, seq_len=8), 32)
    return model, torch.optim.AdamW(model.parameters())


def _forge(ckpt: Path, name: str, data: bytes) -> None:
    """Replace a file and rewrite the manifest to match: the attacker controls the directory."""
    (ckpt / name).write_bytes(data)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    algorithm = manifest["hash"]
    manifest["files"][name] = {algorithm: hash_file(ckpt / name, algorithm).digest, "size": len(data)}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture
def committed(tmp_path: Path) -> Path:
    model, optimizer = _model()
    store = CheckpointStore(CheckpointConfig(), tmp_path / "ckpts")
    store.save(1, model, optimizer, {"step": 1})
    store.close()
    return tmp_path / "ckpts" / "step-00000001"


def test_malicious_metadata_is_refused_without_running(committed: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    _forge(committed, ".metadata", pickle.dumps(Payload(marker)))
    model, optimizer = _model()
    store = CheckpointStore(CheckpointConfig(), committed.parent)
    with pytest.raises(CheckpointError, match=r"refusing to load posix\.system"):
        store.restore(model, optimizer)
    assert not marker.exists()


def test_payload_nested_inside_real_metadata_is_refused(committed: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with (committed / ".metadata").open("rb") as handle:
        metadata = safe_load_metadata(handle, "test")
    metadata.planner_data = Payload(marker)
    _forge(committed, ".metadata", pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match="refusing"):
        SafeFileSystemReader(committed).read_metadata()
    assert not marker.exists()


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("torch.serialization", "_get_layout"),
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ],
)
def test_a_torch_without_a_metadata_global_is_named_not_called_corrupt(
    committed: Path, monkeypatch: pytest.MonkeyPatch, module: str, name: str
) -> None:
    """A torch that moved one of DCP's private metadata globals refused every checkpoint as
    "unsafe or corrupt DCP metadata"; now the load names the missing API."""
    monkeypatch.delattr(f"{module}.{name}")
    with pytest.raises(compat.TorchAPIError, match=rf"has no {module}\.{name} \(hpcpipe uses it to read"):
        SafeFileSystemReader(committed).read_metadata()
    model, optimizer = _model()
    with pytest.raises(compat.TorchAPIError, match=rf"{module}\.{name}"):
        CheckpointStore(CheckpointConfig(), committed.parent).restore(model, optimizer)


def test_metadata_globals_are_allowed_where_torch_keeps_them(
    committed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The allow-list is built from the resolved objects: a global torch pickles under another
    module (moved, with an alias left behind) is allowed there too."""
    from torch.distributed.checkpoint import filesystem

    monkeypatch.setattr(filesystem._StorageInfo, "__module__", "torch.distributed.checkpoint.storage")
    assert ("torch.distributed.checkpoint.storage", "_StorageInfo") in compat.dcp_metadata_globals()
    assert ("torch.distributed.checkpoint.filesystem", "_StorageInfo") in compat.dcp_metadata_globals()
    assert SafeFileSystemReader(committed).read_metadata().storage_data


def test_malicious_byte_item_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    dcp.save(
        {"model": {"w": torch.ones(2), "evil": Payload(marker)}}, checkpoint_id=tmp_path / "c", no_dist=True
    )
    target: dict[str, Any] = {"model": {"w": torch.zeros(2), "evil": None}}
    with pytest.raises(BaseException) as err:  # DCP wraps it in its CheckpointException
        dcp.load(
            target,
            storage_reader=SafeFileSystemReader(tmp_path / "c"),
            planner=SafeLoadPlanner(),
            no_dist=True,
        )
    assert "refusing unsafe content" in str(err.value)
    assert not marker.exists()


def test_plain_byte_items_still_load(tmp_path: Path) -> None:
    state = {"a": {"lr": 0.5, "betas": (0.9, 0.95), "name": "x"}}
    dcp.save(state, checkpoint_id=tmp_path / "c", no_dist=True)
    target: dict[str, Any] = {"a": {"lr": None, "betas": None, "name": None}}
    dcp.load(
        target, storage_reader=SafeFileSystemReader(tmp_path / "c"), planner=SafeLoadPlanner(), no_dist=True
    )
    assert target == {"a": {"lr": 0.5, "betas": (0.9, 0.95), "name": "x"}}


def test_malicious_trainer_state_is_refused(committed: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    torch.save({"step": Payload(marker)}, committed / "extra" / "rank-00000.pt")
    with pytest.raises(CheckpointError, match="unsafe or corrupt trainer state"):
        load_extra(committed / "extra" / "rank-00000.pt")
    assert not marker.exists()


def test_forged_hashes_still_cannot_smuggle_code_through_restore(committed: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    data = (committed / "extra" / "rank-00000.pt").read_bytes()
    assert data  # a real file to replace
    path = tmp_path / "evil.pt"
    torch.save({"step": Payload(marker)}, path)
    _forge(committed, "extra/rank-00000.pt", path.read_bytes())
    model, optimizer = _model()
    with pytest.raises(CheckpointError, match=r"rank-00000\.pt"):
        CheckpointStore(CheckpointConfig(), committed.parent).restore(model, optimizer)
    assert not marker.exists()
