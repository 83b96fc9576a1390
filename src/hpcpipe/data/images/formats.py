"""Image classification datasets read from disk: CIFAR-10/100 (python pickle and binary), IDX, ImageFolder.

Every reader returns an ``ImageSplit`` per split ("train", "test"): uint8 images (N, C, H, W) in
memory, int64 labels (N,) and the class names; an ImageFolder tree stays on disk as file paths
and is decoded per sample. Nothing is downloaded. A missing, truncated or malformed file raises
``DataError`` naming it.

The CIFAR python batches are pickles, i.e. untrusted input that could run code when unpickled:
``SafeBatchUnpickler`` builds only the dict / list / str / bytes / int values and the NumPy array
reconstruction those files are made of, and refuses any other global before it is imported.
"""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hpcpipe.errors import DataError

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
SPLITS = ("train", "test")


@dataclass
class ImageSplit:
    """One split: images in memory (``images``) or on disk (``paths``), labels and class names."""

    labels: np.ndarray  # (N,) int64 in [0, len(classes))
    classes: list[str]
    images: np.ndarray | None = None  # (N, C, H, W) uint8, or None for files decoded per sample
    paths: list[Path] = field(default_factory=list)
    shape: tuple[int, int, int] = (0, 0, 0)  # (C, H, W) of every sample

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, limit: int | None) -> ImageSplit:
        """The first ``limit`` samples (all when None)."""
        if limit is None or limit >= len(self):
            return self
        images = None if self.images is None else self.images[:limit]
        return ImageSplit(self.labels[:limit], self.classes, images, self.paths[:limit], self.shape)


# -- CIFAR python batches: a restricted unpickler ------------------------------------------------

# The globals a CIFAR python batch needs: NumPy's array reconstruction (module name before and
# after NumPy 2's rename) and the dtype; ``_codecs.encode`` is how Python 3 writes bytes in
# protocol 2 (a pure str -> bytes function). Everything else (os.system, eval, ...) is refused.
_ALLOWED_GLOBALS = {
    ("_codecs", "encode"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


class UnsafePickleError(DataError):
    """A pickle asked for a global outside the CIFAR layout (refused before it was imported)."""


class SafeBatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise UnsafePickleError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def load_cifar_batch(path: Path) -> dict[str, Any]:
    """A CIFAR python batch as a dict with str keys; DataError naming the file otherwise."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: missing") from None
    try:
        # The original batches were pickled by Python 2: strings come back as bytes.
        value = SafeBatchUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except UnsafePickleError as exc:
        raise DataError(f"{path}: not a CIFAR batch ({exc}); nothing from it was run") from None
    except Exception as exc:  # truncated or garbage bytes surface as many exception types
        raise DataError(f"{path}: corrupt CIFAR python batch ({type(exc).__name__}: {exc})") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}: a CIFAR batch is a dict, found {type(value).__name__}")
    return {k.decode() if isinstance(k, bytes) else str(k): v for k, v in value.items()}


def _cifar_dir(root: Path, names: tuple[str, ...]) -> Path:
    """``root`` itself or the extracted archive directory under it (cifar-10-batches-py, ...)."""
    for candidate in (root, *(root / name for name in names)):
        if candidate.is_dir() and any((candidate / marker).exists() for marker in _CIFAR_MARKERS):
            return candidate
    markers, where = ", ".join(_CIFAR_MARKERS), ", ".join(names)
    raise DataError(f"{root}: no CIFAR files there (looked for {markers} in it and in {where})")


_CIFAR_MARKERS = ("batches.meta", "meta", "batches.meta.txt", "fine_label_names.txt")


def _cifar_images(data: Any, path: Path, n: int | None = None) -> np.ndarray:
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(f"{path}: 'data' must be a uint8 array of shape (N, 3072)")
    if n is not None and len(data) != n:
        raise DataError(f"{path}: {len(data)} images but {n} labels")
    return data.reshape(-1, 3, 32, 32)  # rows are R(1024) G(1024) B(1024), row-major 32x32


def _int_labels(values: Any, path: Path, key: str, num_classes: int) -> np.ndarray:
    if not isinstance(values, list | np.ndarray) or not all(isinstance(v, int | np.integer) for v in values):
        raise DataError(f"{path}: {key!r} must be a list of integers")
    labels = np.asarray(values, dtype=np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"{path}: {key!r} has labels outside [0, {num_classes})")
    return labels


def _names(value: Any, path: Path, key: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, bytes | str) for v in value):
        raise DataError(f"{path}: {key!r} must be a non-empty list of class names")
    return [v.decode() if isinstance(v, bytes) else v for v in value]


def cifar_python_files(root: Path, hundred: bool) -> dict[str, list[Path]]:
    """The batch files of each split (plus ``meta``), in the order they are read."""
    if hundred:
        folder = _cifar_dir(root, ("cifar-100-python",))
        return {"meta": [folder / "meta"], "train": [folder / "train"], "test": [folder / "test"]}
    folder = _cifar_dir(root, ("cifar-10-batches-py",))
    train = [folder / f"data_batch_{i}" for i in range(1, 6)]
    return {"meta": [folder / "batches.meta"], "train": train, "test": [folder / "test_batch"]}


def read_cifar_python(root: Path, hundred: bool) -> dict[str, ImageSplit]:
    files = cifar_python_files(root, hundred)
    meta_path = files["meta"][0]
    meta = load_cifar_batch(meta_path)
    names_key, labels_key = ("fine_label_names", "fine_labels") if hundred else ("label_names", "labels")
    classes = _names(meta.get(names_key), meta_path, names_key)

    def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
        batch = load_cifar_batch(path)
        labels = _int_labels(batch.get(labels_key), path, labels_key, len(classes))
        return _cifar_images(batch.get("data"), path, len(labels)), labels

    return _cifar_splits(files, classes, read_batch)


def _cifar_splits(
    files: dict[str, list[Path]],
    classes: list[str],
    read_batch: Callable[[Path], tuple[np.ndarray, np.ndarray]],
) -> dict[str, ImageSplit]:
    """Each split's batch files read with ``read_batch`` -> (images (n, 3, 32, 32), labels (n,))."""
    splits = {}
    for split in SPLITS:
        batches = [read_batch(path) for path in files[split]]
        images = np.concatenate([x for x, _ in batches])
        labels = np.concatenate([y for _, y in batches])
        splits[split] = ImageSplit(labels, classes, images, shape=(3, 32, 32))
    return splits


# -- CIFAR binary version -------------------------------------------------------------------------


def cifar_binary_files(root: Path, hundred: bool) -> dict[str, list[Path]]:
    if hundred:
        folder = _cifar_dir(root, ("cifar-100-binary",))
        return {
            "meta": [folder / "fine_label_names.txt"],
            "train": [folder / "train.bin"],
            "test": [folder / "test.bin"],
        }
    folder = _cifar_dir(root, ("cifar-10-batches-bin",))
    train = [folder / f"data_batch_{i}.bin" for i in range(1, 6)]
    return {"meta": [folder / "batches.meta.txt"], "train": train, "test": [folder / "test_batch.bin"]}


def read_cifar_binary(root: Path, hundred: bool) -> dict[str, ImageSplit]:
    """Records of <label byte(s)><3072 pixel bytes>: CIFAR-100 has a coarse then a fine label."""
    files = cifar_binary_files(root, hundred)
    meta_path = files["meta"][0]
    classes = [
        line.strip() for line in _read(meta_path).decode(errors="replace").splitlines() if line.strip()
    ]
    if not classes:
        raise DataError(f"{meta_path}: no class names")
    label_bytes = 2 if hundred else 1
    record = label_bytes + 3072

    def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
        raw = np.frombuffer(_read(path), dtype=np.uint8)
        if len(raw) == 0 or len(raw) % record:
            raise DataError(
                f"{path}: {len(raw)} bytes is not a whole number of {record}-byte records (truncated?)"
            )
        rows = raw.reshape(-1, record)
        labels = rows[:, label_bytes - 1].astype(np.int64)  # CIFAR-100: the fine label comes second
        if labels.max() >= len(classes):
            raise DataError(f"{path}: labels outside [0, {len(classes)}) (wrong format? cifar10 vs cifar100)")
        return rows[:, label_bytes:].reshape(-1, 3, 32, 32), labels

    return _cifar_splits(files, classes, read_batch)


# -- IDX (MNIST, Fashion-MNIST) ------------------------------------------------------------------

_IDX_PREFIX = {"train": "train", "test": "t10k"}


def idx_files(root: Path) -> dict[str, list[Path]]:
    """``{split: [images, labels]}``: ``<prefix>-images-idx3-ubyte`` and labels, ``.gz`` or not."""
    found: dict[str, list[Path]] = {}
    for split, prefix in _IDX_PREFIX.items():
        found[split] = []
        for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
            candidates = [root / f"{prefix}-{kind}{ext}" for ext in ("", ".gz")]
            path = next((c for c in candidates if c.is_file()), None)
            if path is None:
                raise DataError(f"{root}: missing {prefix}-{kind} (or .gz)")
            found[split].append(path)
    return found


def read_idx_array(path: Path) -> np.ndarray:
    """An IDX file as a NumPy array; DataError naming the file when truncated or malformed."""
    raw = _read(path)
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:  # zlib.error: a damaged deflate stream
            raise DataError(f"{path}: corrupt gzip ({exc})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path}: not an unsigned-byte IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise DataError(f"{path}: truncated IDX header")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(dims))
    if len(raw) - header != expected:
        raise DataError(
            f"{path}: {len(raw) - header} data bytes, the header {dims} says {expected} (truncated?)"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def read_idx(root: Path, classes: list[str] | None = None) -> dict[str, ImageSplit]:
    """Both splits; without ``classes``, one class per label up to the highest in either split.

    The class list must be one for both: the model is sized from the train split's, and a test
    label beyond it would crash the first evaluation after all the training.
    """
    arrays = {}
    for split, (images_path, labels_path) in idx_files(root).items():
        images, labels = read_idx_array(images_path), read_idx_array(labels_path).astype(np.int64)
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataError(f"{images_path}: expected (N, H, W) images and N labels in {labels_path.name}")
        if len(labels) == 0:
            raise DataError(f"{labels_path}: no images in the {split} split")
        arrays[split] = images, labels, labels_path
    names = classes or [str(i) for i in range(max(int(a[1].max()) for a in arrays.values()) + 1)]
    splits = {}
    for split, (images, labels, labels_path) in arrays.items():
        if labels.max() >= len(names):
            raise DataError(f"{labels_path}: labels outside [0, {len(names)})")
        _, h, w = images.shape
        splits[split] = ImageSplit(labels, names, images[:, None], shape=(1, h, w))  # (N, 1, H, W)
    return splits


def fashion_mnist_root(root: str | None) -> Path:
    """``data.root`` or Debian's package directory; DataError saying how to install it."""
    path = Path(root) if root else FASHION_MNIST_DIR
    if not path.is_dir():
        hint = "install it with `apt-get install dataset-fashion-mnist`" if not root else "check data.root"
        raise DataError(f"{path}: Fashion-MNIST not found ({hint})")
    return path


# -- ImageFolder ---------------------------------------------------------------------------------


def imagefolder_files(root: Path) -> dict[str, list[Path]]:
    """Every image of ``root/train/<class>/`` and ``root/test/<class>/`` (torchvision's rules)."""
    return {split: [path for path, _ in samples] for split, samples in _imagefolder_samples(root)[1].items()}


def _imagefolder_samples(root: Path) -> tuple[list[str], dict[str, list[tuple[Path, int]]]]:
    """The class names and, per split, each image with its class index, as torchvision's
    ``make_dataset`` finds them: every image anywhere below ``<split>/<class>/`` (nested folders
    too, ``train/<class>/images/*.JPEG`` as in Tiny-ImageNet) is of that class."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    samples: dict[str, list[tuple[Path, int]]] = {}
    classes: list[str] | None = None
    for split in SPLITS:
        folder = root / split
        if not folder.is_dir():
            raise DataError(f"{folder}: missing (an imagefolder root holds train/<class>/ and test/<class>/)")
        try:
            names, index = find_classes(str(folder))
            if classes is not None and names != classes:
                raise DataError(f"{folder}: classes {names} differ from train/'s {classes}")
            classes = names
            found = make_dataset(str(folder), index, extensions=IMG_EXTENSIONS)
        except FileNotFoundError as exc:  # no class folders, or a class folder without images
            raise DataError(f"{folder}: {exc}") from None
        samples[split] = [(Path(path), label) for path, label in found]
    assert classes is not None  # SPLITS is not empty
    return classes, samples


def read_imagefolder(root: Path) -> dict[str, ImageSplit]:
    """Paths and labels; every image is decoded later at the size of the first training image."""
    classes, samples = _imagefolder_samples(root)
    first = decode_image_file(samples["train"][0][0], None)
    splits = {}
    for split, found in samples.items():
        labels = np.asarray([label for _, label in found], dtype=np.int64)
        paths = [path for path, _ in found]
        splits[split] = ImageSplit(labels, classes, None, paths, shape=tuple(first.shape))
    return splits


def decode_image_file(path: Path, size: tuple[int, int] | None) -> Any:
    """uint8 tensor (3, H, W) of an image file (decoded by Pillow), resized to ``size`` if it differs."""
    import torch
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            rgb = img.convert("RGB")
            if size is not None and (rgb.height, rgb.width) != tuple(size):
                rgb = rgb.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            pixels = np.asarray(rgb, dtype=np.uint8)  # (H, W, 3)
    except FileNotFoundError:
        raise DataError(f"{path}: missing") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise DataError(f"{path}: cannot decode image ({exc})") from None
    return torch.from_numpy(pixels.transpose(2, 0, 1).copy())


# -- dispatch ----------------------------------------------------------------------------------------


def dataset_files(fmt: str, root: Path) -> list[Path]:
    """Every file the reader of ``fmt`` reads under ``root`` (what the hash manifest covers)."""
    listers: dict[str, Callable[[], dict[str, list[Path]]]] = {
        "cifar10": lambda: cifar_python_files(root, hundred=False),
        "cifar100": lambda: cifar_python_files(root, hundred=True),
        "cifar10-binary": lambda: cifar_binary_files(root, hundred=False),
        "cifar100-binary": lambda: cifar_binary_files(root, hundred=True),
        "idx": lambda: idx_files(root),
        "fashion-mnist": lambda: idx_files(root),
        "imagefolder": lambda: imagefolder_files(root),
    }
    return [path for paths in listers[fmt]().values() for path in paths]


def read_splits(fmt: str, root: Path) -> dict[str, ImageSplit]:
    """``{"train": ..., "test": ...}`` for ``data.format`` ``fmt`` under ``root``."""
    if fmt in ("cifar10", "cifar100"):
        return read_cifar_python(root, hundred=fmt == "cifar100")
    if fmt in ("cifar10-binary", "cifar100-binary"):
        return read_cifar_binary(root, hundred=fmt == "cifar100-binary")
    if fmt == "idx":
        return read_idx(root)
    if fmt == "fashion-mnist":
        return read_idx(root, FASHION_MNIST_CLASSES)
    if fmt == "imagefolder":
        return read_imagefolder(root)
    raise DataError(f"data.format: {fmt!r} is not an image format")


def image_root(fmt: str, root: str | None) -> Path:
    """The dataset directory: ``data.root`` (required except for fashion-mnist)."""
    if fmt == "fashion-mnist":
        return fashion_mnist_root(root)
    if not root:
        raise DataError(f"data.root: data.format={fmt} needs the dataset directory")
    path = Path(root)
    if not path.is_dir():
        from hpcpipe.data.images.generator import GENERATED_FORMATS

        hint = ""
        if fmt in GENERATED_FORMATS and not path.exists():  # never suggest writing over a file
            hint = f" (for a small generated dataset: hpcpipe data make-images {fmt} {root})"
        raise DataError(f"{path}: data.root is not a directory{hint}")
    return path


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: missing") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None
