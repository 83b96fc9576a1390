"""The data, generated from the Python standard library's own source (a real text corpus on every
machine): fixed-length byte windows of the ``.py`` files of a few packages, labelled with the
package. Files, not windows, are split between training and validation, so no validation window
shares a file with a training one."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from hpcpipe import DataError


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def in_validation(path: Path, root: Path, val_fraction: float) -> bool:
    """A file's split: a hash of its path inside the stdlib, the same on every machine."""
    key = hashlib.sha256(str(path.relative_to(root)).encode()).digest()
    return int.from_bytes(key[:8], "big") / 2**64 < val_fraction


def package_bytes(root: Path, package: str, validation: bool, val_fraction: float) -> bytes:
    """The concatenated source of one package's files of one split."""
    directory = root / package
    files = sorted(directory.rglob("*.py")) if directory.is_dir() else []
    if not files:
        raise DataError(f"{directory}: no .py files (recipe.classes names a standard-library package)")
    chosen = [f for f in files if in_validation(f, root, val_fraction) == validation]
    if not chosen:  # a package of one file: its split gets the first file anyway
        chosen = files[:1]
    return b"\n".join(f.read_bytes() for f in chosen)


def windows(
    classes: list[str], window: int, per_class: int, seed: int, validation: bool, val_fraction: float
) -> TensorDataset:
    """``per_class`` windows of ``window`` bytes per package: x int64 (N, window), y int64 (N,)."""
    root = stdlib_root()
    xs, ys = [], []
    for label, package in enumerate(classes):
        text = np.frombuffer(package_bytes(root, package, validation, val_fraction), dtype=np.uint8)
        if len(text) <= window:
            raise DataError(f"{root / package}: fewer than recipe.window={window} bytes of source")
        rng = np.random.default_rng([seed, label, int(validation)])
        starts = rng.integers(0, len(text) - window, size=per_class)
        xs.append(np.stack([text[s : s + window] for s in starts]))
        ys.append(np.full(per_class, label))
    x = torch.from_numpy(np.concatenate(xs).astype(np.int64))
    y = torch.from_numpy(np.concatenate(ys).astype(np.int64))
    return TensorDataset(x, y)
