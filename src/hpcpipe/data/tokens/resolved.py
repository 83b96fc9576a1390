"""A prepared dataset found again without reading the corpus: for the ranks that start right after
their node's preparer.

``prepare_dataset`` reads and hashes every source file (the fingerprint) and every shard. On a
node, the agent and then local rank 0 prepare; the other ranks start a moment later and need the
same answer. Reading a large corpus once per rank (eight times per node, each start and restart)
costs minutes and sets the ranks apart at their first collective. So the preparer records, under
``data.prepared_dir/.resolved/``, which dataset it resolved, keyed by the corpus's metadata taken
*before* its scan: every source file's key, size, modification time and inode, with the config
fields that change the output (``corpus.config_identity``). A later rank lists the same files
(metadata only), and when the key has a record it opens the named dataset, checks that the
manifest's hash is the recorded one and that every shard has its manifest size, and uses it;
anything else (no record, a file changed, a shard missing or truncated) falls back to the full
preparation.

A file written in the last two seconds makes no record: its modification time could stay the
same through a second write of the same size in that tick (as git treats a "racy" index entry).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from pathlib import Path

from hpcpipe.config import DataConfig
from hpcpipe.data.tokens.corpus import config_identity, iter_source_files
from hpcpipe.data.tokens.shards import SPLITS, PreparedDataset, open_dataset, prepare_dataset
from hpcpipe.data.tokens.text_formats import Render
from hpcpipe.data.tokens.tokenizer import PretrainedTokenizer
from hpcpipe.errors import DataError

RECORDS = ".resolved"
RACY_NS = 2_000_000_000  # a file modified this recently makes no record
_DATASET_NAME = re.compile(r"[0-9a-f]{16}")  # prepare_dataset's directory names (fingerprint[:16])


def corpus_stat_key(cfg: DataConfig, tokenizer: str | None = None) -> str | None:
    """SHA-256 of the config identity and every source file's metadata; None when a file was
    modified within ``RACY_NS`` (or vanished while listed)."""
    digest = hashlib.sha256(config_identity(cfg, tokenizer).encode())
    now = time.time_ns()
    for src in iter_source_files(cfg):
        try:
            st = src.path.stat()
        except OSError:
            return None
        if now - st.st_mtime_ns < RACY_NS:
            return None
        digest.update(f"{src.key}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    return digest.hexdigest()


def record_resolved(cfg: DataConfig, key: str | None, dataset: PreparedDataset) -> None:
    """Remember that ``key`` (taken before the scan that found ``dataset``) resolves to it."""
    if key is None or dataset.path.parent.resolve() != Path(cfg.prepared_dir).resolve():
        return
    folder = Path(cfg.prepared_dir) / RECORDS
    record = {"dataset": dataset.path.name, "manifest_sha256": dataset.manifest_sha256}
    tmp = folder / f".{key}.{os.getpid()}.tmp"
    try:
        folder.mkdir(exist_ok=True)
        tmp.write_text(json.dumps(record) + "\n")
        os.replace(tmp, folder / f"{key}.json")
    except OSError:  # a read-only or full prepared_dir: no record, the other ranks prepare in full
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def open_resolved(cfg: DataConfig, tokenizer: str | None = None) -> PreparedDataset | None:
    """The dataset a preparer recorded for the corpus as it is now, shard sizes checked; None
    when there is none to trust (the caller then prepares in full)."""
    key = corpus_stat_key(cfg, tokenizer)
    if key is None:
        return None
    try:
        record = json.loads((Path(cfg.prepared_dir) / RECORDS / f"{key}.json").read_text())
        name, manifest_sha256 = str(record["dataset"]), str(record["manifest_sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not _DATASET_NAME.fullmatch(name):  # a name, never a path out of prepared_dir
        return None
    try:
        dataset = open_dataset(Path(cfg.prepared_dir) / name)
    except DataError:
        return None
    if dataset.manifest_sha256 != manifest_sha256 or not _shard_sizes_match(dataset):
        return None
    return dataset


def _shard_sizes_match(dataset: PreparedDataset) -> bool:
    itemsize = dataset.dtype.itemsize
    for split in SPLITS:
        for shard in dataset.shards(split):
            try:
                size = (dataset.path / shard["file"]).stat().st_size
            except OSError:
                return False
            if size != int(shard["tokens"]) * itemsize:
                return False
    return True


def prepared(
    cfg: DataConfig,
    progress: bool = False,
    tokenizer: PretrainedTokenizer | None = None,
    tokenizer_identity: str | None = None,
    render: Render | None = None,
    quick: bool = False,
) -> PreparedDataset:
    """``prepare_dataset``'s answer, recorded for the ranks after; with ``quick``, the recorded
    answer when the corpus's metadata still match it (``open_resolved``)."""
    identity = tokenizer_identity if tokenizer else None  # as scan_corpus keys a given tokenizer
    if quick and (found := open_resolved(cfg, identity)) is not None:
        return found
    key = corpus_stat_key(cfg, identity)  # before the scan: a change during it is seen next time
    dataset = prepare_dataset(cfg, progress, tokenizer, tokenizer_identity, render)
    record_resolved(cfg, key, dataset)
    return dataset
