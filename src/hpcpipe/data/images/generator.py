"""Small, valid image datasets in every on-disk format hpcpipe reads, for tests and offline demos.

The images are learnable, not noise: class k is a grating with its own orientation and frequency
under pixel noise, so a few hundred steps of ResNet-18 separate the classes and a test can tell
a training pipeline that learns from one that does not. Files are laid out exactly as the
upstream archives extract (``cifar-10-batches-py/``, ``cifar-10-batches-bin/``, ``train-images-
idx3-ubyte.gz``, ``train/<class>/*.png``), so the same readers serve real and generated data.
"""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np

GENERATED_FORMATS = ("cifar10", "cifar100", "cifar10-binary", "cifar100-binary", "idx", "imagefolder")
GENERATED_MARKER = ".hpcpipe-make-images.json"  # the options a directory was written with
# Formats whose class list is read off the split's own files (a folder per class): a split with
# fewer images than classes lacks some, and train and test then differ. CIFAR names its classes
# in its meta file, and IDX reads one list for both splits (formats.read_idx).
CLASSES_FROM_FILES = {"imagefolder": 4}


def synthetic_images(
    n: int, num_classes: int, channels: int, size: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images (n, C, size, size) and int64 labels (n,): one grating per class plus noise."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n, dtype=np.int64) % num_classes
    rng.shuffle(labels)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64) / size
    angle = np.pi * labels / num_classes  # (n,)
    freq = 2.0 + (labels % 3)
    phase = rng.uniform(0, 2 * np.pi, n)
    wave = np.sin(
        2
        * np.pi
        * freq[:, None, None]
        * (np.cos(angle)[:, None, None] * xx + np.sin(angle)[:, None, None] * yy)
        + phase[:, None, None]
    )
    base = 0.5 + 0.35 * wave  # (n, H, W) in [0.15, 0.85]
    tint = 0.8 + 0.4 * rng.random((n, channels, 1, 1))  # colour varies per image, not per class
    pixels = base[:, None] * tint + 0.08 * rng.standard_normal((n, channels, size, size))
    return (np.clip(pixels, 0, 1) * 255).astype(np.uint8), labels


def write_cifar_python(out: Path, n_train: int, n_test: int, hundred: bool = False, seed: int = 0) -> Path:
    """``out/cifar-10-batches-py`` (5 train batches) or ``out/cifar-100-python``, pickled as upstream."""
    classes = 100 if hundred else 10
    folder = out / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"class_{i}".encode() for i in range(classes)]
    train_x, train_y = synthetic_images(n_train, classes, 3, 32, seed)
    test_x, test_y = synthetic_images(n_test, classes, 3, 32, seed + 1)
    labels_key = b"fine_labels" if hundred else b"labels"

    def dump(name: str, value: object) -> None:
        (folder / name).write_bytes(pickle.dumps(value, protocol=2))

    def batch(x: np.ndarray, y: np.ndarray) -> dict[bytes, object]:
        return {b"data": x.reshape(len(x), 3072), labels_key: y.tolist()}

    if hundred:
        dump("meta", {b"fine_label_names": names, b"coarse_label_names": [b"all"]})
        dump("train", batch(train_x, train_y))
        dump("test", batch(test_x, test_y))
        return folder
    dump("batches.meta", {b"label_names": names, b"num_cases_per_batch": -(-n_train // 5), b"num_vis": 3072})
    for i, (x, y) in enumerate(
        zip(np.array_split(train_x, 5), np.array_split(train_y, 5), strict=True), start=1
    ):
        dump(f"data_batch_{i}", batch(x, y))
    dump("test_batch", batch(test_x, test_y))
    return folder


def write_cifar_binary(out: Path, n_train: int, n_test: int, hundred: bool = False, seed: int = 0) -> Path:
    """``out/cifar-10-batches-bin`` or ``out/cifar-100-binary``: <label byte(s)><3072 pixels> records."""
    classes = 100 if hundred else 10
    folder = out / ("cifar-100-binary" if hundred else "cifar-10-batches-bin")
    folder.mkdir(parents=True, exist_ok=True)
    names = "\n".join(f"class_{i}" for i in range(classes)) + "\n"
    (folder / ("fine_label_names.txt" if hundred else "batches.meta.txt")).write_text(names)

    def records(x: np.ndarray, y: np.ndarray) -> bytes:
        label_cols = [np.zeros_like(y), y] if hundred else [y]  # CIFAR-100: coarse, then fine
        labels = np.stack(label_cols, axis=1).astype(np.uint8)
        return np.concatenate([labels, x.reshape(len(x), 3072)], axis=1).tobytes()

    train_x, train_y = synthetic_images(n_train, classes, 3, 32, seed)
    test_x, test_y = synthetic_images(n_test, classes, 3, 32, seed + 1)
    if hundred:
        (folder / "train.bin").write_bytes(records(train_x, train_y))
        (folder / "test.bin").write_bytes(records(test_x, test_y))
        return folder
    for i, (x, y) in enumerate(
        zip(np.array_split(train_x, 5), np.array_split(train_y, 5), strict=True), start=1
    ):
        (folder / f"data_batch_{i}.bin").write_bytes(records(x, y))
    (folder / "test_batch.bin").write_bytes(records(test_x, test_y))
    return folder


def idx_bytes(array: np.ndarray) -> bytes:
    """An unsigned-byte IDX file: magic 0x00000800 | ndim, big-endian dims, then the data."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_idx(out: Path, n_train: int, n_test: int, gz: bool = True, seed: int = 0, size: int = 28) -> Path:
    """MNIST-style ``train-images-idx3-ubyte[.gz]`` etc. in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    ext = ".gz" if gz else ""
    for prefix, n, s in (("train", n_train, seed), ("t10k", n_test, seed + 1)):
        x, y = synthetic_images(n, 10, 1, size, s)
        for kind, array in (
            (f"images-idx3-ubyte{ext}", x[:, 0]),
            (f"labels-idx1-ubyte{ext}", y.astype(np.uint8)),
        ):
            data = idx_bytes(array)
            (out / f"{prefix}-{kind}").write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return out


def write_imagefolder(
    out: Path, n_train: int, n_test: int, num_classes: int = 4, seed: int = 0, size: int = 32
) -> Path:
    """``out/{train,test}/class_<k>/<i>.png`` (RGB PNG files)."""
    from PIL import Image

    for split, n, s in (("train", n_train, seed), ("test", n_test, seed + 1)):
        x, y = synthetic_images(n, num_classes, 3, size, s)
        for i, (image, label) in enumerate(zip(x, y.tolist(), strict=True)):
            folder = out / split / f"class_{label}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image.transpose(1, 2, 0)).save(folder / f"{i:06d}.png")
    return out


def write_dataset(fmt: str, out: Path, n_train: int, n_test: int, seed: int = 0) -> Path:
    """Write a generated dataset of ``data.format`` ``fmt``; returns the directory for ``data.root``."""
    if fmt in ("cifar10", "cifar100"):
        write_cifar_python(out, n_train, n_test, hundred=fmt == "cifar100", seed=seed)
    elif fmt in ("cifar10-binary", "cifar100-binary"):
        write_cifar_binary(out, n_train, n_test, hundred=fmt == "cifar100-binary", seed=seed)
    elif fmt == "idx":
        write_idx(out, n_train, n_test, seed=seed)
    elif fmt == "imagefolder":
        write_imagefolder(out, n_train, n_test, seed=seed)
    else:
        raise ValueError(f"cannot generate format {fmt!r} (known: {', '.join(GENERATED_FORMATS)})")
    return out
