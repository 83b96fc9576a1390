"""Prepare a dataset: corpus -> tokenizer -> flat token shards (.bin) + manifest.json.

A prepared dataset lives in ``<data.prepared_dir>/<fingerprint[:16]>``; the fingerprint hashes
the input files and the config fields that shape the output, so preparing the same inputs again
finds the directory, verifies every shard's SHA-256 against the manifest, and reuses it.

Crash safety: everything is written into a temporary directory next to the final one and moved
into place with one ``os.replace`` at the end. A directory named by a fingerprint therefore always
holds a complete dataset; an interrupted run leaves only a ``.tmp-*`` directory behind.

Shard format: a headerless little-endian array of token ids (``uint16`` while the vocabulary
fits, else ``uint32``); each document's tokens are followed by the EOS id. The manifest's
``sha256`` of ``manifest.json`` itself (``PreparedDataset.manifest_sha256``) names the exact data
a run trained on (lineage).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from hpcpipe.config import DataConfig
from hpcpipe.data.tokens.corpus import (
    FORMAT_VERSION,
    CorpusScan,
    Document,
    FingerprintBuilder,
    SplitPlan,
    config_identity,
    iter_documents,
    plan_splits,
    scan_corpus,
)
from hpcpipe.data.tokens.text_formats import Render
from hpcpipe.data.tokens.tokenizer import (
    BPE_FILE,
    BPETokenizer,
    PretrainedTokenizer,
    Tokenizer,
    tokenizer_from_spec,
    train_tokenizer,
)
from hpcpipe.errors import DataError
from hpcpipe.fsutil import fsync_dir

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "hpcpipe.tokens"
SPLITS = ("train", "val")
_ENCODE_BATCH_BYTES = 1 << 20  # text per encode_batch call (parallel in Rust; ~12 progress ticks per 12 MB)
_HASH_CHUNK = 4 << 20


@dataclass(frozen=True)
class PreparedDataset:
    """A prepared dataset directory and its parsed manifest."""

    path: Path
    manifest: dict[str, Any]
    reused: bool
    manifest_sha256: str  # SHA-256 of manifest.json's bytes: the dataset's identity in lineage

    @property
    def fingerprint(self) -> str:
        return str(self.manifest["fingerprint"])

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["tokenizer"]["vocab_size"])

    @property
    def eos_id(self) -> int:
        return int(self.manifest["tokenizer"]["eos_id"])

    @property
    def tokenizer_kind(self) -> str:
        return str(self.manifest["tokenizer"]["kind"])

    @cached_property
    def dtype(self) -> np.dtype[Any]:
        """Token dtype of the shards; shards are little-endian whatever the host."""
        return np.dtype(self.manifest["dtype"]).newbyteorder("<")

    def shards(self, split: str) -> list[dict[str, Any]]:
        """The manifest's shard entries (``file``, ``tokens``, ``sha256``) of one split."""
        if split not in self.manifest["splits"]:
            raise DataError(f"{self.path}: no split {split!r} (splits: {', '.join(self.manifest['splits'])})")
        return list(self.manifest["splits"][split]["shards"])

    def shard_paths(self, split: str) -> list[Path]:
        return [self.path / shard["file"] for shard in self.shards(split)]

    def tokens(self, split: str) -> int:
        return sum(int(shard["tokens"]) for shard in self.shards(split))

    def documents(self, split: str) -> int:
        return int(self.manifest["splits"][split]["documents"])


# ---------------------------------------------------------------------------------------------
# Reading and verifying


def open_dataset(path: Path | str, reused: bool = True) -> PreparedDataset:
    """Read a prepared dataset's manifest (no shard hashing: see ``verify_dataset``)."""
    path = Path(path)
    manifest_path = path / MANIFEST_FILE
    try:
        raw = manifest_path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: not a prepared dataset (no {MANIFEST_FILE})") from None
    except OSError as exc:
        raise DataError(f"{manifest_path}: cannot read ({exc.strerror})") from None
    try:
        manifest = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DataError(f"{manifest_path}: not valid JSON") from None
    _check_manifest(manifest, manifest_path)
    return PreparedDataset(path, manifest, reused, hashlib.sha256(raw).hexdigest())


def _check_manifest(manifest: Any, where: Path) -> None:
    """Enough structure that readers can index the manifest without KeyErrors."""
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise DataError(f"{where}: not an hpcpipe dataset manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DataError(
            f"{where}: format version {manifest.get('format_version')} is not {FORMAT_VERSION}; "
            "run `hpcpipe data prepare` again"
        )
    try:
        np.dtype(manifest["dtype"])
        tokenizer = manifest["tokenizer"]
        files = [tokenizer["file"] or BPE_FILE]
        _require_count(tokenizer, ("vocab_size", "eos_id"), "tokenizer", where)
        for split in SPLITS:
            entry = manifest["splits"][split]
            _require_count(entry, ("documents",), f"splits.{split}", where)
            for i, shard in enumerate(entry["shards"]):
                _require_count(shard, ("tokens",), f"splits.{split}.shards[{i}]", where)
                if not isinstance(shard["sha256"], str):
                    raise DataError(f"{where}: splits.{split}.shards[{i}].sha256 is not a string")
                files.append(str(shard["file"]))
    except (KeyError, TypeError) as exc:
        raise DataError(f"{where}: incomplete manifest (missing {exc})") from None
    for name in files:
        if Path(name).name != name or name in {"", ".", ".."}:
            raise DataError(f"{where}: file entry {name!r} is not a plain file name")


def _require_count(entry: dict[str, Any], keys: tuple[str, ...], section: str, where: Path) -> None:
    """Each key holds a non-negative int (readers do arithmetic on them; bool is not a count)."""
    for key in keys:
        value = entry[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise DataError(f"{where}: {section}.{key} is {value!r}, not a non-negative integer")


def verify_tokenizer_file(dataset: PreparedDataset) -> None:
    """The tokenizer file (if the kind has one) exists and matches the manifest's SHA-256."""
    spec = dataset.manifest["tokenizer"]
    if spec.get("file"):
        _verify_file(dataset.path / spec["file"], spec["sha256"], "tokenizer file")


def verify_dataset(path: Path | str) -> PreparedDataset:
    """Check every file against the manifest; ``DataError`` names the first bad one."""
    dataset = open_dataset(path)
    verify_tokenizer_file(dataset)
    itemsize = dataset.dtype.itemsize
    for split in SPLITS:
        for shard in dataset.shards(split):
            shard_path = dataset.path / shard["file"]
            expected = int(shard["tokens"]) * itemsize
            if shard_path.is_file() and shard_path.stat().st_size != expected:
                size = shard_path.stat().st_size
                raise DataError(
                    f"{shard_path}: shard is {size} bytes, the manifest says {expected} (truncated?)"
                )
            _verify_file(shard_path, shard["sha256"], "shard")
    return dataset


def _verify_file(path: Path, sha256: str, what: str) -> None:
    if not path.is_file():
        raise DataError(f"{path}: {what} missing")
    if _sha256_file(path) != sha256:
        raise DataError(f"{path}: {what} corrupted (SHA-256 does not match {MANIFEST_FILE})")


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Preparing


def prepare_dataset(
    cfg: DataConfig,
    progress: bool = False,
    tokenizer: PretrainedTokenizer | None = None,
    tokenizer_identity: str | None = None,
    render: Render | None = None,
) -> PreparedDataset:
    """The prepared dataset for ``cfg``: reused when a verified one exists, else built. A given
    ``tokenizer`` (a model's own; ``tokenizer_identity`` names it, its vocabulary and chat template
    hashed) replaces ``data.tokenizer``'s; ``render`` renders ``data.format: chat``'s conversations."""
    with Stages(progress) as stages:
        with stages.stage("scanning corpus"):
            scan = scan_corpus(cfg, tokenizer_identity if tokenizer else None, render)
        final = Path(cfg.prepared_dir) / scan.fingerprint[:16]
        existing = _reusable(final, scan.fingerprint)
        if existing is not None:
            return existing
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
        try:
            _build(cfg, scan, tmp, stages, tokenizer, render)
            return _commit(tmp, final, scan.fingerprint)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _reusable(path: Path, fingerprint: str) -> PreparedDataset | None:
    """The dataset at ``path`` if it is complete, verified and for this fingerprint."""
    if not (path / MANIFEST_FILE).is_file():
        return None
    try:
        dataset = verify_dataset(path)
    except DataError:
        return None  # damaged: rebuilt and replaced by the caller
    return dataset if dataset.fingerprint == fingerprint else None


def _build(
    cfg: DataConfig,
    scan: CorpusScan,
    out: Path,
    stages: Stages,
    given: PretrainedTokenizer | None = None,
    render: Render | None = None,
) -> None:
    """Write tokenizer, shards and manifest for ``scan``'s corpus into ``out``."""
    plan = plan_splits(scan.keys, scan.sizes, cfg.val_fraction)
    tokenizer: Tokenizer
    if given is None:
        with stages.stage("training tokenizer"):
            train_texts = (doc.text for split, doc in _routed(cfg, plan, render=render) if split == "train")
            tokenizer = train_tokenizer(cfg.tokenizer, train_texts, cfg.vocab_size, length=scan.documents)
    else:
        tokenizer = given
    tokenizer_entry = _save_tokenizer(tokenizer, out)
    dtype = np.dtype("<u2" if tokenizer.vocab_size <= 1 << 16 else "<u4")
    writers = {split: _ShardWriter(out, split, dtype, cfg.shard_tokens) for split in SPLITS}
    documents = dict.fromkeys(SPLITS, 0)
    check = FingerprintBuilder(cfg, scan.tokenizer)
    with stages.stage("tokenizing", total=scan.bytes) as advance:
        for batch in _batches(_routed(cfg, plan, on_file=check, render=render)):
            for split, tokens in _encode(tokenizer, batch, dtype).items():
                writers[split].write(tokens)
            for split, _doc in batch:
                documents[split] += 1
            advance(sum(len(doc.text.encode("utf-8")) for _split, doc in batch))
    if check.hexdigest() != scan.fingerprint:
        raise DataError(f"data.sources {cfg.sources}: the corpus changed while it was being prepared")
    splits = {
        split: {
            "documents": documents[split],
            "tokens": writers[split].tokens,
            "shards": writers[split].finish(),
        }
        for split in SPLITS
    }
    manifest = _manifest(cfg, scan, tokenizer_entry, dtype, splits)
    _write_synced(out / MANIFEST_FILE, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())


def _routed(
    cfg: DataConfig, plan: SplitPlan, on_file: FingerprintBuilder | None = None, render: Render | None = None
) -> Iterator[tuple[str, Document]]:
    for doc in iter_documents(cfg, on_file=on_file, render=render):
        yield from plan.route(doc)


def _batches(routed: Iterator[tuple[str, Document]]) -> Iterator[list[tuple[str, Document]]]:
    """Documents grouped into batches of about ``_ENCODE_BATCH_BYTES`` characters."""
    batch: list[tuple[str, Document]] = []
    size = 0
    for item in routed:
        batch.append(item)
        size += len(item[1].text)
        if size >= _ENCODE_BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _encode(
    tokenizer: Tokenizer, batch: list[tuple[str, Document]], dtype: np.dtype[Any]
) -> dict[str, np.ndarray]:
    """Per split, the batch's token ids with EOS after each document, as one flat array."""
    encoded = tokenizer.encode_batch([doc.text for _split, doc in batch])
    per_split: dict[str, list[int]] = {}
    for (split, _doc), ids in zip(batch, encoded, strict=True):
        out = per_split.setdefault(split, [])
        out.extend(ids)
        out.append(tokenizer.eos_id)
    return {split: np.asarray(ids, dtype=dtype) for split, ids in per_split.items()}


def _save_tokenizer(tokenizer: Tokenizer, out: Path) -> dict[str, Any]:
    """Save the tokenizer's file (BPE only) and return the manifest's tokenizer entry."""
    entry: dict[str, Any] = {
        "kind": tokenizer.kind,
        "name": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "eos_id": tokenizer.eos_id,
        "file": None,
        "sha256": None,
    }
    if isinstance(tokenizer, BPETokenizer | PretrainedTokenizer):
        tokenizer.save(out / BPE_FILE)
        entry.update(file=BPE_FILE, sha256=_sha256_file(out / BPE_FILE))
    return entry


def _manifest(
    cfg: DataConfig,
    scan: CorpusScan,
    tokenizer: dict[str, Any],
    dtype: np.dtype[Any],
    splits: dict[str, Any],
) -> dict[str, Any]:
    # No timestamps or paths: the same inputs give byte-identical manifests, hence the same hash.
    return {
        "format": MANIFEST_FORMAT,
        "format_version": FORMAT_VERSION,
        "fingerprint": scan.fingerprint,
        "dtype": dtype.name,
        "tokenizer": tokenizer,
        "corpus": {
            "files": scan.files,
            "skipped_files": scan.skipped_files,
            "documents": scan.documents,
            "bytes": scan.bytes,
        },
        "splits": splits,
        "data_config": _identity_config(cfg, scan.tokenizer),
    }


def _identity_config(cfg: DataConfig, tokenizer: str | None) -> dict[str, Any]:
    """The data config fields the fingerprint covers (``config_identity``, and the sources its
    file keys come from), nothing else: the manifest's SHA-256 is the dataset's identity in lineage
    and its staging key, so where it was prepared or is cached (prepared_dir, cache_dir) and how a
    run loads it (num_workers, the image and function-calling fields) must not change it.

    A manifest written before this recorded the whole config; it is never rewritten (``_reusable``
    reads it as it is), so runs that recorded its SHA-256 resume on it without a dataset_changed.
    """
    identity = json.loads(config_identity(cfg, tokenizer))
    identity.pop("format_version")  # the manifest's own field
    return {"format": cfg.format, "sources": list(cfg.sources), **identity}


def _commit(tmp: Path, final: Path, fingerprint: str) -> PreparedDataset:
    """Move the finished ``tmp`` into place; a damaged old directory is replaced, and a verified
    one finished meanwhile by a concurrent prepare wins."""
    if final.exists():
        existing = _reusable(final, fingerprint)
        if existing is not None:
            return existing
        stale = final.with_name(f".stale-{final.name}-{os.getpid()}")
        os.replace(final, stale)
        os.replace(tmp, final)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        try:
            os.replace(tmp, final)
        except OSError:
            existing = _reusable(final, fingerprint)
            if existing is None:
                raise
            return existing
    fsync_dir(final.parent)
    return open_dataset(final, reused=False)


class _ShardWriter:
    """Append-only writer of one split's shards, at most ``shard_tokens`` tokens each."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype[Any], shard_tokens: int) -> None:
        self._directory, self._split, self._dtype = directory, split, dtype
        self._shard_tokens = shard_tokens
        self._shards: list[dict[str, Any]] = []
        self._fh: Any = None
        self._digest = hashlib.sha256()
        self._count = 0
        self.tokens = 0

    def write(self, tokens: np.ndarray) -> None:
        tokens = np.ascontiguousarray(tokens, dtype=self._dtype)
        pos = 0
        while pos < len(tokens):
            if self._fh is None:
                self._open()
            take = min(len(tokens) - pos, self._shard_tokens - self._count)
            chunk = tokens[pos : pos + take].tobytes()
            self._fh.write(chunk)
            self._digest.update(chunk)
            self._count += take
            self.tokens += take
            pos += take
            if self._count == self._shard_tokens:
                self._close()

    def finish(self) -> list[dict[str, Any]]:
        """Close the open shard; the manifest entries of every shard written."""
        if self._fh is not None:
            self._close()
        return self._shards

    def _open(self) -> None:
        name = f"{self._split}-{len(self._shards):05d}.bin"
        self._fh = (self._directory / name).open("wb")
        self._shards.append({"file": name, "tokens": 0, "sha256": ""})
        self._digest, self._count = hashlib.sha256(), 0

    def _close(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        self._shards[-1].update(tokens=self._count, sha256=self._digest.hexdigest())


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


class Stages(AbstractContextManager["Stages"]):
    """A rich progress display of prepare's stages on stderr, or nothing when disabled."""

    def __init__(self, enabled: bool) -> None:
        self._progress = (
            Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            if enabled
            else None
        )

    def __enter__(self) -> Stages:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    @contextmanager
    def stage(self, description: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
        """A task line for the ``with`` block; the yielded function advances it by n units."""
        progress = self._progress
        if progress is None:
            yield lambda n: None
            return
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)
        progress.update(task, total=total or 1, completed=total or 1)


def load_tokenizer(dataset_dir: Path | str) -> Tokenizer:
    """The tokenizer of a prepared dataset, as its manifest says (its file hash checked)."""
    dataset = open_dataset(Path(dataset_dir))
    verify_tokenizer_file(dataset)
    return tokenizer_from_spec(dataset.manifest["tokenizer"], dataset.path)
