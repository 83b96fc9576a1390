"""Pickle payloads forged into the files hpcpipe unpickles: a checkpoint's DCP metadata, its
trainer state and byte items, and a CIFAR python batch.

The attacker is assumed to control the whole directory, so a forged checkpoint's manifest is
rewritten to match: its hashes verify, and only the safe loaders stand between the bytes and
code execution.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from hpcpipe.checkpoint.manifest import MANIFEST_NAME, hash_file
from hpcpipe.checkpoint.safe_dcp import safe_load_metadata
from hpcpipe.data.images.generator import write_dataset

PAYLOADS = ("os.system", "subprocess.call", "builtins.exec", "builtins.eval")
# Where a restore unpickles: DCP's .metadata (whole, or a payload nested in real metadata), a
# rank's trainer state (extra/rank-NNNNN.pt) and a non-tensor item inside a .distcp file.
CHECKPOINT_PLACES = ("metadata", "metadata_nested", "trainer_state", "byte_item")
CIFAR_FILES = ("data_batch_1", "data_batch_2", "data_batch_5", "test_batch", "batches.meta")
CIFAR_SHAPES = ("whole", "data", "label")  # the payload as the batch, as its pixels, inside its labels


@dataclass(frozen=True)
class Payload:
    """Unpickling this calls ``call``, which creates ``marker``."""

    call: str  # one of PAYLOADS
    marker: str

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if self.call == "os.system":
            return os.system, (f"touch {shlex.quote(self.marker)}",)
        if self.call == "subprocess.call":
            return subprocess.call, (["touch", self.marker],)
        code = f"open({self.marker!r}, 'w').close()"
        return (exec if self.call == "builtins.exec" else eval), (code,)


def forge_checkpoint(ckpt: Path, place: str, payload: Payload, pick: float, protocol: int) -> Path:
    """Plant ``payload`` at ``place`` in committed checkpoint ``ckpt``; the forged file.

    ``pick`` in [0, 1) chooses among the candidates (which rank's state, which byte item)."""
    if place == "metadata":
        (ckpt / ".metadata").write_bytes(pickle.dumps(payload, protocol))
        forged = [ckpt / ".metadata"]
    elif place == "metadata_nested":
        metadata = _metadata(ckpt)
        metadata.planner_data = payload
        (ckpt / ".metadata").write_bytes(pickle.dumps(metadata, protocol))
        forged = [ckpt / ".metadata"]
    elif place == "trainer_state":
        forged = [_pick(sorted((ckpt / "extra").glob("rank-*.pt")), pick)]
        forged[0].write_bytes(_torch_bytes({"step": payload}))
    else:
        forged = _forge_byte_item(ckpt, payload, pick)
    _rehash(ckpt, [*forged, ckpt / ".metadata"])
    return forged[0]


def _forge_byte_item(ckpt: Path, payload: Payload, pick: float) -> list[Path]:
    """Append the payload to the .distcp file of a random non-tensor item and point the metadata
    at it (an appended record leaves every other item's offset valid)."""
    metadata = _metadata(ckpt)
    items = [
        i
        for i in metadata.storage_data
        if isinstance(metadata.state_dict_metadata[i.fqn], BytesStorageMetadata)
    ]
    item = _pick(sorted(items, key=lambda i: i.fqn), pick)
    info = metadata.storage_data[item]
    shard = ckpt / info.relative_path
    data = _torch_bytes(payload)
    info.offset, info.length = shard.stat().st_size, len(data)
    with shard.open("ab") as handle:
        handle.write(data)
    (ckpt / ".metadata").write_bytes(pickle.dumps(metadata))
    return [shard]


def _pick(items: list[Any], pick: float) -> Any:
    return items[int(pick * len(items))]


def _metadata(ckpt: Path) -> Any:
    with (ckpt / ".metadata").open("rb") as handle:
        return safe_load_metadata(handle, str(ckpt / ".metadata"))


def _torch_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _rehash(ckpt: Path, files: list[Path]) -> None:
    """Rewrite the manifest entries of ``files`` so the forged checkpoint verifies."""
    manifest = json.loads((ckpt / MANIFEST_NAME).read_text())
    algorithm = manifest.get("hash", "sha256")
    for path in files:
        entry = hash_file(path, algorithm)
        manifest["files"][path.relative_to(ckpt).as_posix()] = {algorithm: entry.digest, "size": entry.size}
    (ckpt / MANIFEST_NAME).write_text(json.dumps(manifest))


def forge_cifar(root: Path, name: str, payload: Payload, shape: str, seed: int, protocol: int) -> Path:
    """A valid generated CIFAR-10 python dataset under ``root`` whose ``name`` carries ``payload``
    (``shape``: one of CIFAR_SHAPES)."""
    write_dataset("cifar10", root, n_train=64, n_test=16, seed=seed)
    value: Any = payload if shape == "whole" else {b"data": payload, b"labels": [0]}
    if shape == "label":
        value = {b"batch_label": b"training batch 1 of 5", b"labels": [payload]}
    path = root / "cifar-10-batches-py" / name
    path.write_bytes(pickle.dumps(value, protocol))
    return path
