"""Node-local staging: a verified copy of a prepared dataset under ``CACHE_ROOT/<manifest hash>/``.

A cluster's shared file system (CephFS, Lustre, NFS) is slow to read many times over; the node's
NVMe is fast. ``stage`` copies a dataset there once per node, keyed by the SHA-256 of its manifest,
so a changed dataset gets a new directory and an unchanged one is found again.

Layout under ``CACHE_ROOT``::

    <key>/                 the files, at the same relative paths as in the source
    <key>/.hpcpipe-staged  the completion marker, written last (its mtime: last use)
    <key>.lock             flock, exclusive: held while checking or copying (and collecting)
    <key>.use              flock, shared: held by every process reading the entry
    .<key>.tmp-<pid>       a copy in progress (removed under .lock when its stager was killed)

Every rank of a node may call ``stage`` at once: one takes ``.lock`` and copies, the others wait
for it, then find the marker and verify. A process that reads the staged copy holds a shared
lock on ``.use`` for as long as it lives (``StagedDataset.lease``), so ``collect_garbage``, which
needs both locks exclusively, never removes a dataset in use. Two files, because a reader's
shared lease must not block the next rank's exclusive check.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any, Literal

from hpcpipe.errors import DataError
from hpcpipe.fsutil import fsync_dir

MARKER = ".hpcpipe-staged"
_KEY = re.compile(r"[0-9a-f]{64}")
# A copy in progress, or left by a killed stager (and a damaged entry it had moved aside).
_PARTIAL = re.compile(r"\.([0-9a-f]{64})\.tmp-\d+(-damaged)?")
_CHUNK = 8 << 20


@dataclass(frozen=True)
class StageSource:
    """What to stage: files under ``root`` with their SHA-256, and the dataset's identity."""

    root: Path
    files: dict[str, str]  # relative POSIX path -> SHA-256 hex
    key: str  # SHA-256 of the manifest's bytes: names the cache entry


@dataclass
class StagedDataset:
    path: Path
    copied: bool  # False: a verified copy was already there
    size_bytes: int
    seconds: float
    lease: IO[bytes] | None = field(default=None, repr=False)  # shared lock while it is open

    def release(self) -> None:
        if self.lease is not None:
            self.lease.close()
            self.lease = None


def token_dataset_source(path: Path) -> StageSource:
    """A prepared token dataset (``manifest.json`` with per-file SHA-256) as a stage source."""
    from hpcpipe.data.tokens.shards import MANIFEST_FILE, SPLITS, open_dataset

    dataset = open_dataset(path)
    files = {MANIFEST_FILE: dataset.manifest_sha256}
    tokenizer = dataset.manifest["tokenizer"]
    if tokenizer.get("file"):
        files[str(tokenizer["file"])] = str(tokenizer["sha256"])
    for split in SPLITS:
        for shard in dataset.shards(split):
            files[str(shard["file"])] = str(shard["sha256"])
    return StageSource(root=Path(path), files=files, key=dataset.manifest_sha256)


def staged_tokens(dataset: Any, cache_dir: str | None, verify: Literal["full", "sizes"]) -> Any:
    """A prepared token dataset (``PreparedDataset``) as the trainer reads it: itself, or its
    verified node-local copy when ``data.cache_dir`` is set (``verify``: every hash, for the node's
    preparer; sizes, for the ranks that start after it)."""
    if cache_dir is None:
        return dataset
    from hpcpipe.data.tokens.shards import open_dataset

    return open_dataset(stage_for_reading(token_dataset_source(dataset.path), cache_dir, verify))


def image_dataset_source(root: Path, manifest_path: Path) -> StageSource:
    """An image dataset on disk, with the hash manifest hpcpipe recorded for it."""
    raw = manifest_path.read_bytes()
    files = {rel: str(entry["sha256"]) for rel, entry in json.loads(raw)["files"].items()}
    return StageSource(root=root, files=files, key=hashlib.sha256(raw).hexdigest())


def stage(
    source: StageSource, cache_root: Path, workers: int = 4, verify: Literal["full", "sizes"] = "full"
) -> StagedDataset:
    """A verified copy of ``source`` under ``cache_root``; copies only when none verifies.

    ``verify="sizes"`` trusts a marker whose files have the source's sizes: for the ranks that
    start right after their node's first rank verified every hash. The returned ``lease`` holds
    a shared lock on the entry: keep it open while reading.
    """
    _check_source(source)
    cache_root.mkdir(parents=True, exist_ok=True)
    final = cache_root / source.key
    started = time.perf_counter()
    with _open_lock(cache_root, source.key, ".lock") as copying:
        fcntl.flock(copying, fcntl.LOCK_EX)  # one copier per entry; the others wait here
        copied = not _verifies(final, source, workers, verify)
        if copied:
            _copy_verified(source, final, workers)
        else:
            (final / MARKER).touch()  # last use, for collect_garbage
        # Lease it before letting the next stager (or collect_garbage) in.
        lease = _open_lock(cache_root, source.key, ".use")
        fcntl.flock(lease, fcntl.LOCK_SH)
    size = sum((final / rel).stat().st_size for rel in source.files)
    return StagedDataset(final, copied, size, time.perf_counter() - started, lease)


_READING: list[StagedDataset] = []  # leases held for the life of this process


def stage_for_reading(
    source: StageSource, cache_root: str | Path, verify: Literal["full", "sizes"] = "sizes"
) -> Path:
    """Where a recipe reads ``source`` from: its staged copy, leased until this process exits."""
    staged = stage(source, Path(cache_root), verify=verify)
    _READING.append(staged)
    return staged.path


def collect_garbage(cache_root: Path, days: float, keep: frozenset[str] = frozenset()) -> list[str]:
    """Remove entries unused for ``days`` days; never one in ``keep`` or one whose lock is held
    (being staged or read). Partial copies left by a stager killed mid-copy go whenever their
    key's ``.lock`` is free, whatever their age. Returns the removed keys."""
    removed: list[str] = []
    if not cache_root.is_dir():
        return removed
    _collect_partial_copies(cache_root)
    cutoff = time.time() - days * 86400
    for entry in sorted(cache_root.iterdir()):
        if not (entry.is_dir() and _KEY.fullmatch(entry.name)) or entry.name in keep:
            continue
        marker = entry / MARKER
        last_used = marker.stat().st_mtime if marker.is_file() else entry.stat().st_mtime
        if last_used >= cutoff:
            continue
        with (
            _try_exclusive(cache_root, entry.name, ".lock") as idle,
            _try_exclusive(cache_root, entry.name, ".use") as unused,
        ):
            if idle and unused:
                shutil.rmtree(entry)
                removed.append(entry.name)
    return removed


def _collect_partial_copies(cache_root: Path) -> None:
    keys = {m.group(1) for p in cache_root.glob(".*.tmp-*") if (m := _PARTIAL.fullmatch(p.name))}
    for key in sorted(keys):
        with _try_exclusive(cache_root, key, ".lock") as idle:
            if idle:
                _remove_partial_copies(cache_root, key)


# -- checks ------------------------------------------------------------------------------------


def _check_source(source: StageSource) -> None:
    """Nothing may land outside the cache entry, and nothing may be read from outside the source."""
    if not _KEY.fullmatch(source.key):
        raise DataError(f"{source.root}: manifest hash {source.key!r} is not a SHA-256 hex digest")
    root = source.root.resolve()
    for rel, digest in source.files.items():
        pure = PurePosixPath(rel)
        if pure.is_absolute() or ".." in pure.parts or rel != pure.as_posix() or not rel:
            raise DataError(f"{source.root}: manifest names {rel!r}, which is not a path inside the dataset")
        if not re.fullmatch(r"[0-9a-f]{64}", str(digest)):
            raise DataError(f"{source.root}: manifest entry {rel!r} has no SHA-256")
        path = source.root / rel
        if not path.resolve().is_relative_to(root):
            raise DataError(f"{path}: leads outside {source.root} (a symlink?); refusing to stage it")
        if not path.is_file():
            raise DataError(f"{path}: listed in the manifest but missing")


def _verifies(path: Path, source: StageSource, workers: int, verify: str) -> bool:
    files = source.files
    try:
        recorded = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False  # no marker: never completed (or damaged)
    if recorded.get("files") != files:
        return False
    if verify == "sizes":
        return all(_size(path / rel) == _size(source.root / rel) for rel in files)
    digests: dict[str, str | None] = {}
    # hashlib releases the GIL: hashing runs in parallel
    _in_threads(workers, lambda rel: digests.__setitem__(rel, _sha256_or_none(path / rel)), files)
    return all(digests[rel] == want for rel, want in files.items())


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _sha256_or_none(path: Path) -> str | None:
    try:
        with path.open("rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return None


# -- copying -----------------------------------------------------------------------------------


def _copy_verified(source: StageSource, final: Path, workers: int) -> None:
    """Copy into a temporary sibling, hashing the bytes as they pass; rename when all match."""
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    damaged = final.parent / f".{final.name}.tmp-{os.getpid()}-damaged"
    _remove_partial_copies(final.parent, final.name)  # we hold .lock: no other copier is alive
    _check_free_space(source, final.parent)
    try:
        _copy_files(source, tmp, workers)
        if final.exists():
            # An entry that failed verification, which jobs on this node may still be reading:
            # renamed aside, not removed in place, so a reader opening its next file (an image)
            # finds the new copy an instant later, not a gap as long as the removal. Files they
            # hold open stay readable until closed.
            os.replace(final, damaged)
        os.replace(tmp, final)
        fsync_dir(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(damaged, ignore_errors=True)


def _copy_files(source: StageSource, tmp: Path, workers: int) -> None:
    """Every file, then the marker, into ``tmp``; a failed write (a full disk) as a DataError."""
    try:
        tmp.mkdir()
        stop = threading.Event()  # set: the other copies end at their next chunk, not their last

        def copy(item: tuple[str, str]) -> None:
            _copy_one(source.root, tmp, *item, stop)

        _in_threads(workers, copy, source.files.items(), stop)
        marker: dict[str, Any] = {"key": source.key, "source": str(source.root), "files": source.files}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    except OSError as exc:  # ENOSPC names no file: the cache root is the place to look
        where = f": {exc.filename}" if exc.filename else ""
        raise DataError(
            f"{tmp.parent}: staging {source.root} there failed ({exc.strerror or exc}{where})"
        ) from None


def _check_free_space(source: StageSource, cache_root: Path) -> None:
    """Refuse before copying when the cache's disk cannot hold the whole entry (a damaged entry
    being replaced still takes its space until the new copy is in: not counted as free)."""
    needed = sum((source.root / rel).stat().st_size for rel in source.files)
    free = shutil.disk_usage(cache_root).free
    if needed > free:
        raise DataError(
            f"{cache_root}: staging {source.root} needs {needed / 1e6:,.1f} MB, {free / 1e6:,.1f} MB "
            "are free (data.cache_dir); free space there (hpcpipe data stage --gc-days N removes "
            "unused entries)"
        )


def _remove_partial_copies(cache_root: Path, key: str) -> list[Path]:
    """The temporary copies of ``key`` that stagers killed mid-copy left behind (call with its
    ``.lock`` held: a live copier holds it)."""
    partial = sorted(cache_root.glob(f".{key}.tmp-*"))
    for path in partial:
        shutil.rmtree(path, ignore_errors=True)
    return partial


def _copy_one(root: Path, dest_root: Path, rel: str, want: str, stop: threading.Event) -> None:
    """Copy one file, checking its SHA-256 as it passes; ``stop`` set abandons it between chunks:
    a multi-GB shard must not hold a preempted stager's exit past the job's grace period."""
    dest = dest_root / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with (root / rel).open("rb") as src, dest.open("wb") as out:
        while chunk := src.read(_CHUNK):
            if stop.is_set():  # another copy failed or the stager was stopped: its error is raised
                raise DataError(f"{root / rel}: copy abandoned (staging stopped)")
            digest.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    if digest.hexdigest() != want:
        raise DataError(
            f"{root / rel}: SHA-256 does not match the manifest; the source is corrupt, "
            "refusing to stage it (prepare the dataset again)"
        )


def _in_threads(
    workers: int, work: Callable[[Any], None], items: Iterable[Any], stop: threading.Event | None = None
) -> None:
    """``work`` on every item, in up to ``workers`` threads; the first exception sets ``stop``,
    which ends the others after their current item (or sooner, where ``work`` checks it), and is
    raised once every thread has stopped.

    Not a ThreadPoolExecutor: a signal handler's exception (``data stage`` exits 75 on SIGTERM)
    can land in this thread while the executor starts a worker, which is then never joined: it
    went on copying after the caller had removed the temporary copy (left behind half-written),
    and held the exit back until it had copied every file.
    """
    todo = list(items)
    pending = iter(todo)
    take = threading.Lock()  # guards pending and busy
    stop = stop if stop is not None else threading.Event()
    errors: list[BaseException] = []
    busy = [0]  # threads that may still call work

    def run() -> None:
        with take:
            if stop.is_set():  # started after the caller gave up on it: touch nothing
                return
            busy[0] += 1
        try:
            while not stop.is_set():
                with take:
                    item = next(pending, _DONE)
                if item is _DONE:
                    return
                try:
                    work(item)
                except BaseException as exc:
                    errors.append(exc)
                    stop.set()
        finally:
            with take:
                busy[0] -= 1

    threads: list[threading.Thread] = []
    try:
        for _ in range(min(workers, len(todo))):
            threads.append(threading.Thread(target=run, name="hpcpipe-stage"))
            threads[-1].start()
        for thread in threads:
            thread.join()
    except BaseException:  # the signal's: no thread takes another item, and none outlives this
        stop.set()
        _wait_through_signals(lambda: _read(take, busy) == 0)
        raise  # the first signal's, whatever landed while waiting
    if errors:
        raise errors[0]


def _wait_through_signals(done: Callable[[], bool]) -> None:
    """Poll until ``done()``, swallowing what further signal handlers raise meanwhile (Slurm's
    --signal=USR1@N, then the preemption's SIGTERM): had one escaped, the caller would remove
    the temporary copy while the threads still wrote into it, and they would recreate it. Not
    Thread.join: on Python 3.11 a join that a signal interrupts marks the thread finished while
    it runs on, so neither is_alive() nor a second join waits for it."""
    while True:
        try:
            while not done():
                time.sleep(0.01)
            return
        except BaseException:  # a later signal's; the first is being raised
            continue


def _read(lock: threading.Lock, box: list[int]) -> int:
    with lock:
        return box[0]


_DONE = object()


# -- locks -------------------------------------------------------------------------------------


def _open_lock(cache_root: Path, key: str, suffix: str) -> IO[bytes]:
    return (cache_root / f"{key}{suffix}").open("ab")


@contextlib.contextmanager
def _try_exclusive(cache_root: Path, key: str, suffix: str) -> Iterator[bool]:
    with _open_lock(cache_root, key, suffix) as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
