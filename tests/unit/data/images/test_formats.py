"""Image readers on generated files in every format, the restricted unpickler, the hash manifest."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from hpcpipe.config import DataConfig
from hpcpipe.data.images.formats import fashion_mnist_root, load_cifar_batch, read_idx_array, read_splits
from hpcpipe.data.images.generator import GENERATED_FORMATS, idx_bytes, write_dataset
from hpcpipe.data.images.manifest import verify_or_record
from hpcpipe.errors import DataError


@pytest.mark.parametrize("fmt", GENERATED_FORMATS)
def test_every_reader_reads_its_generated_files(fmt: str, tmp_path: Path) -> None:
    root = write_dataset(fmt, tmp_path / fmt, n_train=40, n_test=12, seed=3)
    splits = read_splits(fmt, root)
    train, test = splits["train"], splits["test"]
    assert (len(train), len(test)) == (40, 12)
    channels = 1 if fmt == "idx" else 3
    assert train.shape[0] == channels and test.shape == train.shape
    if train.images is not None:
        assert train.images.dtype == np.uint8 and train.images.shape == (40, *train.shape)
    classes = {"cifar100": 100, "cifar100-binary": 100, "imagefolder": 4}.get(fmt, 10)
    assert len(train.classes) == classes
    assert train.labels.min() >= 0 and train.labels.max() < classes
    assert len(set(train.labels.tolist())) > 1


def test_pickle_and_binary_cifar_hold_the_same_images(tmp_path: Path) -> None:
    pickled = read_splits("cifar10", write_dataset("cifar10", tmp_path / "p", 30, 10, seed=1))
    binary = read_splits("cifar10-binary", write_dataset("cifar10-binary", tmp_path / "b", 30, 10, seed=1))
    for split in ("train", "test"):
        assert np.array_equal(pickled[split].images, binary[split].images)  # type: ignore[arg-type]
        assert np.array_equal(pickled[split].labels, binary[split].labels)


class _Exploit:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, ("touch PWNED",))


def test_a_pickle_with_a_payload_is_refused_and_nothing_runs(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    root = write_dataset("cifar10", tmp_path / "c", 20, 5)
    batch = root / "cifar-10-batches-py" / "data_batch_1"
    batch.write_bytes(pickle.dumps({b"data": _Exploit(), b"labels": [0]}, protocol=2))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        DataError, match=r"data_batch_1: not a CIFAR batch \(refusing to load posix\.system\)"
    ):
        read_splits("cifar10", root)
    assert not (tmp_path / "PWNED").exists()


def test_a_pickle_of_the_wrong_layout_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "batch"
    path.write_bytes(pickle.dumps({b"data": [1, 2, 3], b"labels": [0]}, protocol=2))
    assert load_cifar_batch(path)["labels"] == [0]
    root = write_dataset("cifar10", tmp_path / "c", 20, 5)
    (root / "cifar-10-batches-py" / "test_batch").write_bytes(path.read_bytes())
    with pytest.raises(DataError, match=r"test_batch: 'data' must be a uint8 array"):
        read_splits("cifar10", root)


def test_a_truncated_idx_file_names_itself(tmp_path: Path) -> None:
    data = idx_bytes(np.zeros((5, 28, 28), np.uint8))
    raw = tmp_path / "train-images-idx3-ubyte"
    raw.write_bytes(data[:-100])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: 3820 data bytes, the header"):
        read_idx_array(raw)
    gz = tmp_path / "t.gz"
    gz.write_bytes(gzip.compress(data)[:-20])
    with pytest.raises(DataError, match=r"t\.gz: corrupt gzip"):
        read_idx_array(gz)
    flipped = bytearray(gzip.compress(bytes(range(256)) * 40))
    flipped[20] ^= 0xFF  # inside the deflate stream: zlib.error, not an OSError
    flipped[30] ^= 0xFF
    gz.write_bytes(bytes(flipped))
    with pytest.raises(DataError, match=r"t\.gz: corrupt gzip \(Error -3 while decompressing"):
        read_idx_array(gz)
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x00\x00\x0c\x01abcd")
    with pytest.raises(DataError, match="bad magic"):
        read_idx_array(bad)


def test_a_truncated_cifar_binary_file_names_itself(tmp_path: Path) -> None:
    root = write_dataset("cifar10-binary", tmp_path / "b", 20, 5)
    path = root / "cifar-10-batches-bin" / "test_batch.bin"
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(DataError, match=r"test_batch\.bin: .* not a whole number of 3073-byte records"):
        read_splits("cifar10-binary", root)


def test_an_empty_class_folder_names_the_split(tmp_path: Path) -> None:
    root = write_dataset("imagefolder", tmp_path / "f", 8, 4)
    (root / "train" / "class_9").mkdir()
    with pytest.raises(DataError, match=r"/train: Found no valid file for the classes class_9"):
        read_splits("imagefolder", root)


def test_nested_imagefolder_images_take_their_class_folders_label(tmp_path: Path) -> None:
    """Tiny-ImageNet's layout (``train/<class>/images/*.JPEG``) and a nested folder named like
    another class: the label is the class folder's, as torchvision's ImageFolder gives it."""
    from torchvision.datasets import ImageFolder

    root = write_dataset("imagefolder", tmp_path / "f", 8, 4)
    for split in ("train", "test"):
        for image in sorted((root / split).glob("*/*")):
            nested = image.parent / "images" / image.name
            nested.parent.mkdir(exist_ok=True)
            image.rename(nested)
    first, second = sorted(p.name for p in (root / "train").iterdir())[:2]
    moved = next((root / "train" / first / "images").iterdir())
    (root / "train" / first / second).mkdir()
    moved.rename(root / "train" / first / second / moved.name)
    splits = read_splits("imagefolder", root)
    for split in ("train", "test"):
        reference = ImageFolder(str(root / split))
        expected = {Path(path): label for path, label in reference.samples}
        got = dict(zip(splits[split].paths, splits[split].labels.tolist(), strict=True))
        assert got == expected


def test_fashion_mnist_says_how_to_install_it(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from hpcpipe.data.images import formats as images

    monkeypatch.setattr(images, "FASHION_MNIST_DIR", tmp_path / "absent")
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        fashion_mnist_root(None)


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(), reason="dataset-fashion-mnist absent"
)
def test_the_real_fashion_mnist_is_found_and_read() -> None:
    splits = read_splits("fashion-mnist", fashion_mnist_root(None))
    assert (len(splits["train"]), len(splits["test"])) == (60000, 10000)
    assert splits["train"].shape == (1, 28, 28) and splits["train"].classes[9] == "Ankle boot"
    assert np.bincount(splits["test"].labels).tolist() == [1000] * 10


def test_idx_splits_share_one_class_list_and_an_empty_split_is_named(tmp_path: Path) -> None:
    root = write_dataset("idx", tmp_path / "idx", 8, 32)  # 8 train images hold classes 0-7 only
    splits = read_splits("idx", root)
    assert splits["train"].classes == splits["test"].classes == [str(i) for i in range(10)]
    (root / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(0, np.uint8))))
    no_images = idx_bytes(np.zeros((0, 28, 28), np.uint8))
    (root / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(no_images))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\.gz: no images in the test split$"):
        read_splits("idx", root)


def test_the_manifest_is_written_on_first_read_and_catches_a_change(tmp_path: Path) -> None:
    root = write_dataset("idx", tmp_path / "idx", 30, 10)
    cfg = DataConfig(format="idx", root=str(root), prepared_dir=str(tmp_path / "prepared"))
    first = verify_or_record(cfg)
    assert first.manifest_path.is_file() and first.train_samples == 30 and first.shape == (1, 28, 28)
    assert not list(root.glob("*.json"))  # the dataset directory is never written
    assert 0.3 < first.mean[0] < 0.7 and first.std[0] > 0.1
    assert verify_or_record(cfg).manifest_sha256 == first.manifest_sha256
    labels = root / "t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.compress(idx_bytes(np.zeros(10, np.uint8))))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\.gz: changed since hpcpipe first read it"):
        verify_or_record(cfg)


def test_the_same_files_under_another_mount_point_have_the_same_manifest(tmp_path: Path) -> None:
    """The manifest's SHA-256 is the dataset's identity (lineage, staging key): the same files under
    another path give another manifest file but the same bytes; one written with the absolute root
    before stays as it is (never rewritten), so a run that recorded its SHA-256 resumes on it."""
    root = write_dataset("idx", tmp_path / "here", 20, 8)
    prepared = str(tmp_path / "prepared")
    first = verify_or_record(DataConfig(format="idx", root=str(root), prepared_dir=prepared))
    moved = root.rename(tmp_path / "there")
    second = verify_or_record(DataConfig(format="idx", root=str(moved), prepared_dir=prepared))
    assert second.manifest_path != first.manifest_path
    assert second.manifest_sha256 == first.manifest_sha256
    old = json.loads(second.manifest_path.read_text()) | {"root": str(moved)}
    second.manifest_path.write_text(json.dumps(old, indent=1) + "\n")
    written = second.manifest_path.read_bytes()
    again = verify_or_record(DataConfig(format="idx", root=str(moved), prepared_dir=prepared))
    assert second.manifest_path.read_bytes() == written and again.manifest_sha256 != first.manifest_sha256


def test_image_cli_errors_are_one_line_exit_2(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = cli("data", "prepare", "resnet-tiny", "--set", f"data.root={tmp_path}/nothing")
    assert proc.returncode == 2, proc.stderr
    hint = f"(for a small generated dataset: hpcpipe data make-images cifar10 {tmp_path}/nothing)"
    assert proc.stderr.strip() == f"error: {tmp_path}/nothing: data.root is not a directory {hint}"
    (tmp_path / "a-file").write_text("not a dataset")  # never suggested to be written over
    proc = cli("data", "prepare", "resnet-tiny", "--set", f"data.root={tmp_path}/a-file")
    assert proc.stderr.strip() == f"error: {tmp_path}/a-file: data.root is not a directory"
    root = write_dataset("cifar10", tmp_path / "c", 20, 5)
    (root / "cifar-10-batches-py" / "data_batch_2").write_bytes(b"\x80\x02garbage")
    proc = cli("train", "resnet-tiny", "--set", f"data.root={root}", "--set", f"run.out_dir={tmp_path}/runs")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith(f"error: {root}/cifar-10-batches-py/data_batch_2: corrupt CIFAR")
    proc = cli("train", "resnet-tiny", "--set", "model.variant=gpt2")
    assert (
        proc.returncode == 2 and "model.variant 'gpt2' does not fit run.recipe 'resnet-cifar'" in proc.stderr
    )


def test_make_images_cli_writes_a_dataset_prepare_records_it(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    args = ["data", "make-images", "cifar100-binary", str(tmp_path / "d"), "--train", "100", "--test", "100"]
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    assert cli(*args).returncode == 0  # the same command again: the same dataset, nothing written
    (tmp_path / "d" / ".hpcpipe-make-images.json").unlink()  # made before the marker was
    assert cli(*args).returncode == 0 and (tmp_path / "d" / ".hpcpipe-make-images.json").is_file()
    proc = cli(*args[:-1], "101")  # other images under the same file names would mix two datasets
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: {tmp_path / 'd'}: exists and holds other files (choose a new directory, or delete it)"
    )
    proc = cli("data", "make-images", "imagefolder", str(tmp_path / "e"), "--train", "2")
    assert proc.returncode == 2 and not (tmp_path / "e").exists()  # its readers refused 2 classes against 4
    refusal = "error: --train: 2 images cannot hold one of each of imagefolder's 4 classes"
    assert proc.stderr.strip() == refusal
    assert (
        cli("data", "make-images", "cifar10", str(tmp_path / "f"), "--test", "8").returncode == 0
    )  # meta names them
    sets = ["--set", f"data.root={tmp_path / 'd'}", "--set", "data.format=cifar100-binary"]
    sets += ["--set", f"data.prepared_dir={tmp_path}/prepared"]
    proc = cli("data", "prepare", "resnet-tiny", *sets, "--json", "-")
    assert proc.returncode == 0, proc.stderr
    assert '"train_samples": 100' in proc.stdout and '"verified": false' in proc.stdout
    proc = cli("data", "prepare", "resnet-tiny", *sets, "--json", "-")
    assert '"verified": true' in proc.stdout
