"""Corpus: the documents named by ``data.sources``, their fingerprint, and the train/val split.

Everything here is deterministic: files are visited in sorted order, document keys are stable
strings derived from the source as written in the config, and the split is a hash of the key. That
is what lets ``prepare`` name a dataset by the hash of its inputs and reuse it on the next run.

Rules for files (the same for every source kind, so the output never depends on luck):

* a file found by walking a directory or matching a glob is *skipped* when it is not UTF-8 text
  (it contains a NUL byte or does not decode); a file named explicitly is a ``DataError`` instead;
* ``.jsonl`` files hold one JSON object per line, the text in ``data.text_field``; blank lines are
  ignored; each record is a document keyed ``<file key>#<line>``;
* ``data.format: parquet`` reads ``data.text_field``'s column of ``.parquet`` files, ``chat`` the
  conversations of ``.jsonl`` files rendered by the recipe's chat template (``text_formats.py``),
  one document per row or line, keyed ``<file key>#<row>``;
* a file named explicitly that holds no text at all is a ``DataError`` naming it;
* a file reached twice (a directory and a glob inside it) is read once, under its first key.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcpipe.config import DataConfig
from hpcpipe.data.tokens.text_formats import Render, chat_texts, parquet_texts
from hpcpipe.errors import DataError

STDLIB_SOURCE = "@stdlib"
# Bumped whenever the prepared output for the same inputs would change (split rule, shard format).
FORMAT_VERSION = 1
# Directories never walked: installed third-party packages and byte-code caches.
_PRUNED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


@dataclass(frozen=True, slots=True)
class Document:
    """One training document: ``key`` is stable across runs (path, or ``path#line`` for JSONL)."""

    key: str
    text: str


@dataclass(frozen=True, slots=True)
class SourceFile:
    """A file to read: where it is, its stable key, and whether an explicit source named it."""

    path: Path
    key: str
    explicit: bool

    @property
    def is_jsonl(self) -> bool:
        return self.path.suffix.lower() == ".jsonl"


@dataclass(frozen=True)
class CorpusScan:
    """What one pass over the corpus learned: the fingerprint and every document key in order."""

    fingerprint: str
    keys: list[str]
    sizes: list[int]  # UTF-8 bytes of each document, parallel to keys
    files: int
    skipped_files: int
    bytes: int
    tokenizer: str | None = None  # the identity of a given (pre-trained) tokenizer

    @property
    def documents(self) -> int:
        return len(self.keys)


def stdlib_dir() -> Path:
    """The source directory of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


# ---------------------------------------------------------------------------------------------
# Sources -> files


def iter_source_files(cfg: DataConfig) -> Iterator[SourceFile]:
    """Every input file of ``cfg.sources`` in deterministic order, each file once."""
    seen: set[Path] = set()
    for source in cfg.sources:
        for src_file in _files_of_source(source, _extensions(cfg)):
            resolved = src_file.path.resolve()
            if resolved not in seen:
                seen.add(resolved)
                yield src_file


def _extensions(cfg: DataConfig) -> list[str]:
    """The suffixes taken from a directory: Parquet and chat files have theirs."""
    return {"parquet": [".parquet"], "chat": [".jsonl"]}.get(cfg.format, cfg.extensions)


def _files_of_source(source: str, extensions: list[str]) -> Iterator[SourceFile]:
    if source == STDLIB_SOURCE:
        yield from _walk(stdlib_dir(), STDLIB_SOURCE, extensions)
        return
    label = os.path.normpath(source)
    path = Path(source)
    if path.is_dir():
        yield from _walk(path, label, extensions)
    elif path.is_file():
        yield SourceFile(path, label, explicit=True)
    elif glob.has_magic(source):
        matches = sorted(glob.glob(source, recursive=True))
        if not matches:
            raise DataError(f"data.sources: the glob {source!r} matches no file")
        for match in matches:
            if Path(match).is_dir():
                yield from _walk(Path(match), os.path.normpath(match), extensions)
            elif Path(match).is_file():
                yield SourceFile(Path(match), os.path.normpath(match), explicit=False)
    else:
        raise DataError(f"data.sources: {source!r} does not exist")


def _walk(root: Path, label: str, extensions: list[str]) -> Iterator[SourceFile]:
    """Files under ``root`` with a wanted suffix, sorted by relative path; pruned dirs skipped."""
    wanted = {ext.lower() for ext in extensions}
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _PRUNED_DIRS]
        rel_dir = Path(dirpath).relative_to(root)
        found.extend((rel_dir / name).as_posix() for name in filenames if Path(name).suffix.lower() in wanted)
    for rel in sorted(found):
        path = root / rel
        if path.is_file():
            yield SourceFile(path, f"{label}/{rel}", explicit=False)


# ---------------------------------------------------------------------------------------------
# Files -> documents


def iter_documents(
    cfg: DataConfig,
    on_file: Callable[[SourceFile, bytes | None], None] | None = None,
    render: Render | None = None,
) -> Iterator[Document]:
    """The corpus as documents, in order, stopping after ``cfg.max_bytes`` UTF-8 bytes of text.

    ``on_file(file, raw)`` sees every file read, with ``raw=None`` for a skipped (non-text) file;
    the fingerprint is built from it so it covers exactly the files that fed the output.
    ``render`` turns a conversation into text (``data.format: chat``).
    """
    remaining = cfg.max_bytes
    for src in iter_source_files(cfg):
        raw = _read_bytes(src.path)
        docs = _file_documents(cfg, src, raw, render)
        if on_file is not None:
            on_file(src, raw if docs is not None else None)
        if docs is None:
            continue
        empty = True
        for doc in docs:
            if not doc.text:
                continue
            empty = False
            if remaining is None:
                yield doc
                continue
            kept, remaining = _within_budget(doc, remaining)
            if kept.text:
                yield kept
            if remaining == 0:
                return
        if empty and src.explicit:
            raise DataError(f"{src.path}: holds no text (data.sources names it)")


def _file_documents(
    cfg: DataConfig, src: SourceFile, raw: bytes, render: Render | None
) -> Iterator[Document] | None:
    """One file's documents as ``cfg.format`` reads them; None for a skipped (non-text) file."""
    if cfg.format == "parquet":
        rows = parquet_texts(src.path, cfg.text_field)
        return (Document(f"{src.key}#{row}", text) for row, text in rows)
    if cfg.format == "chat":
        lines = chat_texts(src.path, cfg.messages_field, render)
        return (Document(f"{src.key}#{line}", text) for line, text in lines)
    text = _decode(src, raw)
    if text is None:
        return None
    return _jsonl_documents(src, text, cfg.text_field) if src.is_jsonl else iter([Document(src.key, text)])


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None


def _decode(src: SourceFile, raw: bytes) -> str | None:
    """UTF-8 text (a leading BOM dropped), or None for a walked file that is not text."""
    try:
        if b"\x00" in raw:
            raise UnicodeDecodeError("utf-8", raw, 0, 1, "contains NUL bytes")
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        if src.explicit:
            raise DataError(f"{src.path}: not UTF-8 text") from None
        return None


def _jsonl_documents(src: SourceFile, text: str, text_field: str) -> Iterator[Document]:
    # split on "\n" only: str.splitlines() would also break at U+2028 etc., legal inside JSON strings
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{src.path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise DataError(f"{where}: not valid JSON") from None
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        if text_field not in record:
            raise DataError(f"{where}: no {text_field!r} field (data.text_field)")
        value = record[text_field]
        if not isinstance(value, str):
            raise DataError(f"{where}: field {text_field!r} is not a string")
        if not _is_text(value):  # as an explicit source that is not UTF-8: an error naming it
            raise DataError(
                f"{where}: field {text_field!r} holds a lone surrogate escape (\\ud800-\\udfff), not text"
            )
        yield Document(f"{src.key}#{lineno}", value)


def _is_text(value: str) -> bool:
    """Whether ``value`` encodes as UTF-8: JSON's "\\ud800" escape decodes to a lone surrogate."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _within_budget(doc: Document, remaining: int) -> tuple[Document, int]:
    """The document cut to ``remaining`` UTF-8 bytes (never splitting a character)."""
    data = doc.text.encode("utf-8")
    if len(data) <= remaining:
        return doc, remaining - len(data)
    return Document(doc.key, data[:remaining].decode("utf-8", errors="ignore")), 0


# ---------------------------------------------------------------------------------------------
# Fingerprint


class FingerprintBuilder:
    """An ``on_file`` hook for ``iter_documents`` hashing every file read, for the fingerprint.

    SHA-256 over the data config fields that change the prepared output, then each file read
    (key, size, content hash) in order: equal fingerprints mean equal prepared datasets.
    """

    def __init__(self, cfg: DataConfig, tokenizer: str | None = None) -> None:
        self._digest = hashlib.sha256(config_identity(cfg, tokenizer).encode())
        self.files = 0
        self.skipped_files = 0

    def __call__(self, src: SourceFile, raw: bytes | None) -> None:
        if raw is None:
            self.skipped_files += 1
            return
        self.files += 1
        content = hashlib.sha256(raw).hexdigest()
        self._digest.update(f"{src.key}\0{len(raw)}\0{content}\n".encode())

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def scan_corpus(cfg: DataConfig, tokenizer: str | None = None, render: Render | None = None) -> CorpusScan:
    """One pass over the corpus: fingerprint and document keys; a ``DataError`` if it is empty.
    ``tokenizer`` identifies a given (pre-trained) tokenizer; the corpus is its text then."""
    fingerprint = FingerprintBuilder(cfg, tokenizer)
    keys: list[str] = []
    sizes: list[int] = []
    for doc in iter_documents(cfg, on_file=fingerprint, render=render):
        keys.append(doc.key)
        sizes.append(len(doc.text.encode("utf-8")))
    if not keys:
        raise DataError(f"data.sources {cfg.sources}: no text found (extensions {cfg.extensions})")
    files, skipped = fingerprint.files, fingerprint.skipped_files
    return CorpusScan(fingerprint.hexdigest(), keys, sizes, files, skipped, sum(sizes), tokenizer)


def corpus_fingerprint(cfg: DataConfig) -> str:
    """SHA-256 naming the prepared dataset for these inputs (see ``scan_corpus``)."""
    return scan_corpus(cfg).fingerprint


def config_identity(cfg: DataConfig, tokenizer: str | None = None) -> str:
    """The config fields that change the prepared output, as canonical JSON (a pre-trained
    tokenizer by its identity, ``tokenizer``; the keys of the plain-text format unchanged, so
    datasets prepared before formats and tokenizers could vary keep their names)."""
    identity: dict[str, object] = {
        "format_version": FORMAT_VERSION,
        "tokenizer": cfg.tokenizer,
        # The raw-bytes tokenizer ignores vocab_size: changing it must not force a re-prepare.
        "vocab_size": cfg.vocab_size if cfg.tokenizer == "bpe" else None,
        "val_fraction": cfg.val_fraction,
        "max_bytes": cfg.max_bytes,
        "extensions": sorted({ext.lower() for ext in cfg.extensions}),
        "text_field": cfg.text_field,
        "shard_tokens": cfg.shard_tokens,
    }
    if cfg.format != "tokens":
        identity |= {"format": cfg.format, "extensions": None}
    if cfg.format == "chat":
        identity |= {"messages_field": cfg.messages_field, "text_field": None}
    if tokenizer is not None:
        identity |= {"tokenizer": f"pretrained:{tokenizer}", "vocab_size": None}
    return json.dumps(identity, sort_keys=True, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# Train / validation split


@dataclass(frozen=True)
class SplitPlan:
    """Which documents go to validation; built from all keys, so neither split is empty.

    With a single document there is nothing to choose: that document (``cut_key``) is cut at a
    line break near ``1 - val_fraction`` of its length, the head for training, the tail for val.
    """

    val_keys: frozenset[str]
    val_fraction: float
    cut_key: str | None = None

    def route(self, doc: Document) -> Iterator[tuple[str, Document]]:
        """``("train" | "val", document)`` pairs for one document (two when it is cut)."""
        if doc.key == self.cut_key:
            head, tail = _cut(doc.text, self.val_fraction)
            yield "train", Document(f"{doc.key}@train", head)
            yield "val", Document(f"{doc.key}@val", tail)
        else:
            yield ("val" if doc.key in self.val_keys else "train"), doc


def plan_splits(keys: Sequence[str], sizes: Sequence[int], val_fraction: float) -> SplitPlan:
    """Hold out about ``val_fraction`` of the corpus *bytes* for validation, whole documents only.

    Documents are taken in the order of a hash of their key (so which ones is fixed by the keys,
    not by luck or file order) while they fit in the byte budget. Counting bytes rather than
    documents keeps the validation set near its intended size when file sizes vary a lot. At
    least one document goes to each split.
    """
    if len(keys) != len(sizes):
        raise ValueError("keys and sizes must have the same length")
    if not keys:
        raise DataError("the corpus has no documents")
    if len(keys) == 1:
        return SplitPlan(frozenset(), val_fraction, cut_key=keys[0])
    budget = val_fraction * sum(sizes)
    val: list[str] = []
    used = 0
    for _score, key, size in sorted(zip(map(_key_score, keys), keys, sizes, strict=True)):
        if used + size <= budget:
            val.append(key)
            used += size
    if not val:
        val = [min(zip(sizes, map(_key_score, keys), keys, strict=True))[2]]
    return SplitPlan(frozenset(val), val_fraction)


def _key_score(key: str) -> float:
    """A uniform number in [0, 1) fixed by the key: the same document always lands in one split."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0**64


def _cut(text: str, val_fraction: float) -> tuple[str, str]:
    if len(text) < 2:
        raise DataError("the corpus is a single document too short to split into train and val")
    at = max(1, min(len(text) - 1, round(len(text) * (1.0 - val_fraction))))
    newline = text.find("\n", at)
    if 0 < newline < len(text) - 1:
        at = newline + 1
    return text[:at], text[at:]
