"""Hash-verified, atomically committed checkpoints (DCP), in a fast and a durable tier.

``CheckpointStore`` is what the trainer uses (``store.py`` describes the protocol);
``verify_dir``/``read_manifest`` check a directory; ``capture_rng_state``/``restore_rng_state``
build the RNG part of the trainer's per-rank ``extra`` state; ``export.py`` turns a checkpoint
into safetensors or a Hugging Face model directory.

Names that need torch are imported on first use, so ``hpcpipe ckpt list|verify`` (manifest and
hashing only) start in a fraction of a second.
"""

from __future__ import annotations

import importlib
from typing import Any

from hpcpipe.checkpoint.manifest import CheckpointError, Manifest, Problem, read_manifest, verify_dir

__all__ = [
    "CheckpointError",
    "CheckpointStore",
    "EventFn",
    "Manifest",
    "Problem",
    "RestoreInfo",
    "capture_rng_state",
    "read_manifest",
    "restore_rng_state",
    "verify_dir",
]

_LAZY = {
    "CheckpointStore": "hpcpipe.checkpoint.store",
    "EventFn": "hpcpipe.checkpoint.store",
    "RestoreInfo": "hpcpipe.checkpoint.store",
    "capture_rng_state": "hpcpipe.checkpoint.state",
    "restore_rng_state": "hpcpipe.checkpoint.state",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hpcpipe.checkpoint' has no attribute {name!r}")
