"""The hash manifest of an image dataset, written on first read and verified on every later one.

Upstream checksums are not hard-coded: the first time hpcpipe reads a dataset directory it
records the SHA-256 and size of every file the reader uses, plus the training set's per-channel
mean and standard deviation (the normalisation), in
``<data.prepared_dir>/images/<format>-<hash of the directory path>/manifest.json``. The dataset
directory itself is never written (it may be a read-only system directory). A later read that
finds a file changed, missing or added refuses to train and names the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hpcpipe.config import DataConfig
from hpcpipe.data.images.formats import ImageSplit, dataset_files, image_root, read_splits
from hpcpipe.errors import DataError
from hpcpipe.recipes.base import DataSummary

MANIFEST_VERSION = 1
STATS_SAMPLE = 2048  # images whose pixels estimate the normalisation of a folder on disk


@dataclass(frozen=True)
class ImageDatasetInfo:
    root: Path
    manifest_path: Path
    manifest_sha256: str
    mean: tuple[float, ...]  # per channel, pixel values scaled to [0, 1]
    std: tuple[float, ...]
    classes: tuple[str, ...]
    train_samples: int
    shape: tuple[int, int, int]  # (C, H, W)
    recorded_now: bool  # this call read the dataset for the first time and wrote the manifest


def manifest_path_for(cfg: DataConfig, root: Path) -> Path:
    key = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return Path(cfg.prepared_dir) / "images" / f"{cfg.format}-{key}" / "manifest.json"


def file_digests(root: Path, files: list[Path]) -> dict[str, dict[str, Any]]:
    digests = {}
    for path in files:
        try:
            with path.open("rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError as exc:
            raise DataError(f"{path}: cannot read ({exc.strerror})") from None
        digests[path.relative_to(root).as_posix()] = {"sha256": digest, "size": path.stat().st_size}
    return digests


def verify_or_record(cfg: DataConfig) -> ImageDatasetInfo:
    """Check the dataset against its manifest, or read it fully and write the manifest."""
    root = image_root(cfg.format, cfg.root)
    path = manifest_path_for(cfg, root)
    files = file_digests(root, dataset_files(cfg.format, root))
    recorded_now = not path.is_file()
    if not recorded_now:
        manifest = _load(path)
        _compare(manifest["files"], files, root, path)
    else:
        splits = read_splits(cfg.format, root)  # fails on a corrupt file before anything is written
        mean, std = channel_stats(splits["train"])
        # No root: its SHA-256 is the dataset's identity (lineage, staging key), and the same
        # files mounted elsewhere are the same data. The manifest's own path is keyed by the root.
        # One written with "root" before stays as it is, so runs that recorded it resume unchanged.
        manifest = {
            "version": MANIFEST_VERSION,
            "format": cfg.format,
            "files": files,
            "mean": mean,
            "std": std,
            "classes": splits["train"].classes,
            "train_samples": len(splits["train"]),
            "shape": list(splits["train"].shape),
        }
        _write_atomically(path, manifest)
    return _info(root, path, manifest, recorded_now)


def recorded_info(cfg: DataConfig) -> ImageDatasetInfo:
    """The manifest's facts without hashing the files again (the preparing rank verified them).

    Records the dataset first when no manifest exists yet (a recipe used without ``prepare``).
    """
    root = image_root(cfg.format, cfg.root)
    path = manifest_path_for(cfg, root)
    if not path.is_file():
        return verify_or_record(cfg)
    return _info(root, path, _load(path), recorded_now=False)


def _info(root: Path, path: Path, manifest: dict[str, Any], recorded_now: bool) -> ImageDatasetInfo:
    return ImageDatasetInfo(
        root=root,
        manifest_path=path,
        manifest_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        mean=tuple(manifest["mean"]),
        std=tuple(manifest["std"]),
        classes=tuple(manifest["classes"]),
        train_samples=int(manifest["train_samples"]),
        shape=tuple(manifest["shape"]),
        recorded_now=recorded_now,
    )


def channel_stats(split: ImageSplit) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of the pixels in [0, 1] (a sample of decoded files for folders)."""
    if split.images is not None:
        pixels = split.images
    else:
        from hpcpipe.data.images.formats import decode_image_file

        size = split.shape[1:]
        step = max(1, len(split.paths) // STATS_SAMPLE)
        pixels = np.stack([decode_image_file(p, size).numpy() for p in split.paths[::step]])
    mean, std = _chunked_mean_std(pixels)
    mean, std = mean / 255.0, std / 255.0
    return [round(float(m), 6) for m in mean], [round(max(float(s), 1e-3), 6) for s in std]


def _chunked_mean_std(pixels: np.ndarray, chunk: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and (population) std of (N, C, H, W) uint8 pixels, two passes in float64.

    In chunks of images: float64 temporaries of the whole split are 8x its size (GBs for
    EMNIST-sized IDX) on the node that records the manifest.
    """
    count = pixels.shape[0] * pixels.shape[2] * pixels.shape[3]
    total = np.zeros(pixels.shape[1])
    for start in range(0, len(pixels), chunk):
        total += pixels[start : start + chunk].sum(axis=(0, 2, 3), dtype=np.float64)
    mean = total / count  # (C,)
    squares = np.zeros(pixels.shape[1])
    for start in range(0, len(pixels), chunk):
        centred = pixels[start : start + chunk].astype(np.float64) - mean[None, :, None, None]
        squares += (centred * centred).sum(axis=(0, 2, 3))
    return mean, np.sqrt(squares / count)


def _load(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text())
        if manifest.get("version") != MANIFEST_VERSION or not isinstance(manifest.get("files"), dict):
            raise ValueError("unknown layout")
        return dict(manifest)
    except (OSError, ValueError) as exc:
        raise DataError(
            f"{path}: unreadable dataset manifest ({exc}); delete it to record the dataset again"
        ) from None


def _compare(recorded: dict[str, Any], found: dict[str, Any], root: Path, manifest: Path) -> None:
    for name, entry in recorded.items():
        now = found.get(name)
        if now is None:
            raise DataError(f"{root / name}: missing (listed in {manifest})")
        if now["sha256"] != entry["sha256"]:
            raise DataError(
                f"{root / name}: changed since hpcpipe first read it (SHA-256 differs from {manifest}); "
                "restore the file, or delete the manifest if the change is intended"
            )
    extra = sorted(set(found) - set(recorded))
    if extra:
        raise DataError(f"{root / extra[0]}: not in {manifest} (new file); delete the manifest to record it")


def _write_atomically(path: Path, manifest: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, path)


def info_summary(fmt: str, info: ImageDatasetInfo) -> DataSummary:
    """``hpcpipe data prepare``'s account of an image dataset: verified, or recorded now."""
    verb = "recorded" if info.recorded_now else "verified against"
    return DataSummary(
        headline=f"{verb} [bold]{info.manifest_path}[/]: {info.train_samples:,} training images "
        f"{tuple(info.shape)}, {len(info.classes)} classes, mean {info.mean}, std {info.std}",
        details={
            "format": fmt,
            "root": str(info.root),
            "manifest": str(info.manifest_path),
            "manifest_sha256": info.manifest_sha256,
            "classes": list(info.classes),
            "train_samples": info.train_samples,
            "shape": list(info.shape),
            "mean": list(info.mean),
            "std": list(info.std),
            "verified": not info.recorded_now,
        },
    )
