"""Our adapters around ``torch.distributed.checkpoint`` (DCP) storage: safe reading, hashed writing.

Reading. ``SafeFileSystemReader`` reads each file once, verifying it against the manifest as
it goes (``file_reader.py``); it reads the raw layout and DCP's own ``torch.save`` layout of
older checkpoints (the manifest says which). Stock DCP ``FileSystemReader.read_metadata`` calls
``pickle.load`` on ``.metadata`` and ``DefaultLoadPlanner.load_bytes`` calls
``torch.load(weights_only=False)`` on every non-tensor item: a crafted checkpoint would run code
on load. ``SafeFileSystemReader`` unpickles the metadata with an allow-list (DCP's metadata
dataclasses, ``torch.Size``, dtypes, layouts, paths, nothing else), only after its hash
matched, and ``SafeLoadPlanner`` loads bytes with ``weights_only=True``, only after their
file's hash matched; ``torch.save``-layout tensors load with ``weights_only=True``. Without a
manifest (``hpcpipe ckpt`` tools reading a directory's metadata) the allow-lists are the wall.

Writing. ``HashedFileSystemWriter`` is DCP's ``FileSystemWriter`` (its planning and
``.metadata``) writing tensors as raw bytes (``raw_format.py``), one file per writer thread,
and hashing while it writes, so the manifest costs no second pass over the data (hashlib
releases the GIL: two writer threads hash on two cores). It also writes this rank's
trainer state (``extra/rank-NNNNN.pt``, already serialised) inside DCP's write phase, so a
failure there (a full disk) is reported to every rank by DCP's own error gathering instead of
leaving the other ranks waiting in a collective.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import pickle
import threading
import warnings
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, TypeVar

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from hpcpipe import compat
from hpcpipe.checkpoint.file_reader import chunk_of, read_file
from hpcpipe.checkpoint.manifest import (
    CheckpointError,
    FileEntry,
    FileMismatch,
    Manifest,
    Problem,
    check_bytes,
    new_hasher,
    read_manifest,
)
from hpcpipe.checkpoint.raw_format import FILE_SUFFIX, TENSOR_FORMAT, split_by_size, write_items
from hpcpipe.checkpoint.state import refusal_reason

# dcp.save/load warn on every single-process call (store without a process group, export):
# that is our deliberate mode, not a mistake.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def _not_a_refusal(record: logging.LogRecord) -> bool:
    return not (record.exc_info and isinstance(record.exc_info[1], CheckpointError))


# dcp.load logs each failed metadata read, traceback included, on the root logger before failing
# with "metadata is None"; our callers re-raise the reader's refusal as the one line the user
# sees, so the logged copies (a traceback for bad input) are dropped.
logging.getLogger().addFilter(_not_a_refusal)
log = logging.getLogger("hpcpipe.checkpoint")

__all__ = [
    "HashedFileSystemWriter",
    "SafeFileSystemReader",
    "SafeLoadPlanner",
    "load_item_bytes",
    "safe_load_metadata",
]

T = TypeVar("T")

_DCP_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "TensorProperties",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "MetadataIndex",
        "StorageMeta",
    },
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset"},
}  # and DCP's private globals (compat.dcp_metadata_globals)


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only the globals DCP metadata is made of; anything else is an error, not a call."""

    def __init__(self, stream: IO[bytes], private: frozenset[tuple[str, str]]) -> None:
        super().__init__(stream)
        self.private = private

    def find_class(self, module: str, name: str) -> Any:
        if name in _DCP_METADATA_CLASSES.get(module, ()) or (module, name) in self.private:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: not a DCP metadata type")


def safe_load_metadata(stream: IO[bytes], origin: str) -> Metadata:
    """Unpickle DCP ``.metadata`` with the allow-list; CheckpointError naming ``origin`` otherwise
    (TorchAPIError where this torch lacks one of DCP's private globals)."""
    private = compat.dcp_metadata_globals()
    try:
        metadata = _MetadataUnpickler(stream, private).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(f"{origin}: unsafe or corrupt DCP metadata ({exc})") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{origin}: not DCP metadata (found {type(metadata).__name__})")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with the metadata unpickled through the allow-list, reading each file once.

    ``manifest``: verify every file read against it while reading (``file_reader.py``); without
    one (tools that verified the directory first) files are read unchecked. ``sources``: other
    directories holding copies of the same files, tried first (the memory tier); a copy whose
    size or hash differs from the manifest is passed over for the next source, and listed in
    ``rejected``. ``refused`` keeps a refusal (or a TorchAPIError): torch 2.11's ``dcp.load``
    swallows exceptions from ``read_metadata`` and fails later with "metadata is None", so the
    caller re-raises this.
    """

    refused: CheckpointError | compat.TorchAPIError | None = None

    def __init__(
        self, path: Path, manifest: Manifest | None = None, sources: Sequence[Path] = (), threads: int = 2
    ) -> None:
        super().__init__(path)
        self.manifest = manifest
        self.sources = [Path(s) for s in sources] + [Path(path)]
        self.threads = threads
        self.rejected: list[tuple[Path, Problem]] = []  # (copy passed over, why)
        self.read_from: dict[str, Path] = {}  # file -> the directory it was read from
        self._metadata: Metadata | None = None
        self._verified: dict[str, bytes] = {}  # read and hash-checked once per restore, asked for more
        self._planner_lock = threading.Lock()

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self.refused is not None:  # DCP retries with per-rank metadata: refused all the same
            raise self.refused
        try:
            name = Path(compat.dcp_metadata_path(self, kwargs.get("rank"))).name
            data = self._read_whole(name)
            metadata = safe_load_metadata(
                io.BytesIO(data), str(self.read_from.get(name, self.sources[-1]) / name)
            )
        except (CheckpointError, compat.TorchAPIError) as exc:  # kept: dcp.load would swallow it
            self.refused = exc
            raise
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id  # type: ignore[union-attr]
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._metadata = metadata

    def read_data(self, plan: Any, planner: Any) -> Any:
        if isinstance(planner, SafeLoadPlanner):  # so that its refusals name the file
            planner.files = {
                index: Path(self.path) / info.relative_path for index, info in self.storage_data.items()
            }
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        workers = max(1, min(self.threads, len(per_file)))
        with ThreadPoolExecutor(workers, "hpcpipe-ckpt-read") as pool:
            futures = [pool.submit(self._read_file, name, items, planner) for name, items in per_file.items()]
            for future in futures:
                future.result()
        done: torch.futures.Future[None] = torch.futures.Future()
        done.set_result(None)
        return done

    def _read_file(self, name: str, items: list[ReadItem], planner: Any) -> None:
        """Read ``name`` from its first good source, then hand its buffered items to the planner
        (at once, so a rank holds at most the files in flight, not its whole checkpoint)."""
        metadata = self._metadata
        assert metadata is not None
        deferred = self.read_verified(
            name,
            lambda path: read_file(
                path,
                name,
                items,
                self._locate,
                planner,
                metadata,
                self._expected(name),
                self._algorithm(),
                self._raw(),
            ),
        )
        with self._planner_lock:  # the planner's bookkeeping is not thread-safe
            for item in deferred:
                item.apply(planner, lambda index: chunk_of(metadata, index))

    def read_verified(self, name: str, read: Callable[[Path], T]) -> T:
        """``read(path)`` of file ``name`` from its first good source (a copy whose read raises
        FileMismatch or OSError is passed over for the next; the checkpoint's own is the last);
        ``read`` verifies what it reads against ``expected(name)``. FileMismatch naming the file
        when the checkpoint's own fails, or the manifest does not list it."""
        if self.manifest is not None and name not in self.manifest.files:
            problem = Problem(name, "named by .metadata but not listed in the manifest")
            raise FileMismatch(f"{self.sources[-1] / name}: {problem}", problem)
        for source in self._sources_of(name):
            try:
                result = read(source / name)
            except FileMismatch as exc:
                if source == self.sources[-1]:
                    raise
                self._reject(source, exc.problem)
                continue
            except OSError as exc:
                problem = Problem(name, f"unreadable ({exc.strerror or exc})")
                if source == self.sources[-1]:
                    raise FileMismatch(f"{source / name}: {problem}", problem) from None
                self._reject(source, problem)  # a memory copy that went away: read the disk's
                continue
            self.read_from[name] = source
            return result
        raise AssertionError("unreachable: the checkpoint directory is the last source")

    def _read_whole(self, name: str) -> bytes:
        """``.metadata``, read and verified from the checkpoint itself, never a memory copy: every
        rank then reads the same bytes and reaches the same verdict (``dcp.load`` handles a
        refusal here differently across torch versions). Kept: a restore asks for it several times
        (the optimizer state it holds, the same-layout plan, DCP's own load)."""
        if name in self._verified:
            return self._verified[name]
        source = self.sources[-1]
        try:
            data = (source / name).read_bytes()
        except OSError as exc:
            problem = Problem(
                name, "missing" if isinstance(exc, FileNotFoundError) else f"unreadable ({exc})"
            )
            raise FileMismatch(f"{source / name}: {problem}", problem) from None
        try:
            check_bytes(name, data, self._expected(name), self._algorithm())
        except FileMismatch as exc:
            raise FileMismatch(f"{source / name}: {exc.problem}", exc.problem) from None
        self.read_from[name] = source
        self._verified[name] = data
        return data

    def _sources_of(self, name: str) -> list[Path]:
        """The directories to read ``name`` from, in order: copies of the right size, then the checkpoint."""
        expected = self._expected(name)
        if expected is None:
            return [self.sources[-1]]
        found = [s for s in self.sources[:-1] if _size_or_none(s / name) == expected.size]
        return [*found, self.sources[-1]]

    def _reject(self, source: Path, problem: Problem) -> None:
        log.warning("checkpoint copy %s passed over: %s; reading the checkpoint's own file", source, problem)
        self.rejected.append((source, problem))

    def expected(self, name: str) -> FileEntry | None:
        """The manifest's entry for ``name``; None without a manifest (read unchecked)."""
        return self._expected(name)

    @property
    def algorithm(self) -> str:
        return self._algorithm()

    def _expected(self, name: str) -> FileEntry | None:
        return self.manifest.files.get(name) if self.manifest is not None else None

    def _raw(self) -> bool:
        return self.manifest is not None and self.manifest.tensor_format == TENSOR_FORMAT

    def _algorithm(self) -> str:
        return self.manifest.hash if self.manifest is not None else "sha256"

    def _locate(self, index: Any) -> tuple[int, int]:
        info = self.storage_data[index]
        return info.offset, info.length


def _size_or_none(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor items load with ``weights_only=True``."""

    files: dict[Any, Path] | None = None  # storage index -> .distcp file (SafeFileSystemReader sets it)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        where = (self.files or {}).get(read_item.storage_index, "checkpoint")
        obj = load_item_bytes(value, where, fqn)
        if self.flatten_state_dict:
            compat.dcp_set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def load_item_bytes(value: io.BytesIO, where: Any, fqn: str) -> Any:
    """A non-tensor checkpoint item (``torch.save`` bytes) loaded with ``weights_only=True``;
    CheckpointError naming ``where`` (its file) and ``fqn`` when it holds anything else."""
    try:
        return torch.load(value, weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = refusal_reason(exc)
        raise CheckpointError(f"{where}: item {fqn!r}: refusing unsafe content ({reason})") from None


# ---------------------------------------------------------------------------------------------
# Writing


WRITEBACK_BYTES = 16 << 20


class _HashingStream:
    """A write-only file that hashes every byte it writes and names its path in OSErrors."""

    def __init__(self, raw: IO[bytes], path: Path, algorithm: str = "sha256") -> None:
        self._raw = raw
        self._path = path
        self._hash = new_hasher(algorithm)
        self.size = 0
        self._written_back = 0  # bytes handed to the kernel's writeback so far

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._hash.update(view)
        self.size += view.nbytes
        try:
            written = self._raw.write(view)
            if self.size - self._written_back >= WRITEBACK_BYTES:
                self._start_writeback()
            return written
        except OSError as exc:
            raise _with_path(exc, self._path) from None

    def _start_writeback(self) -> None:
        """Start the disk write of what is written so far, so the final fsync waits for little.

        ``POSIX_FADV_DONTNEED`` on dirty pages starts their writeback without waiting (Linux);
        the disk then writes while this thread serialises and hashes the next items.
        """
        self._raw.flush()
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._raw.fileno(), self._written_back, 0, os.POSIX_FADV_DONTNEED)
        self._written_back = self.size

    def entry(self) -> FileEntry:
        return FileEntry(digest=self._hash.hexdigest(), size=self.size)

    def tell(self) -> int:
        return self._raw.tell()

    def flush(self) -> None:
        try:
            self._raw.flush()
        except OSError as exc:
            raise _with_path(exc, self._path) from None

    def fileno(self) -> int:
        return self._raw.fileno()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.flush()


def _with_path(exc: OSError, path: Path) -> OSError:
    """The same error, naming the file: a bare ENOSPC from write() does not say where."""
    if exc.filename is not None:
        return exc
    return OSError(exc.errno or errno.EIO, exc.strerror or str(exc), str(path))


def _os_error_in(exc: BaseException) -> OSError | None:
    """The OSError behind ``exc``: torch.save's zip writer turns a failed write into a
    RuntimeError ("unexpected pos") raised while handling the OSError."""
    seen: BaseException | None = exc
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:
        if isinstance(seen, OSError):
            return seen
        visited.add(id(seen))
        seen = seen.__cause__ or seen.__context__
    return None


class _HashingFileSystem(FileSystem):
    """DCP's local file system, recording (digest, size) of every file opened for writing."""

    def __init__(self, algorithm: str) -> None:
        super().__init__()
        self.algorithm = algorithm
        self.entries: dict[Path, FileEntry] = {}
        self.errors: list[BaseException] = []
        self.threads: set[threading.Thread] = set()  # every thread that wrote a file
        self.owner: threading.Thread | None = None  # the thread running the save (write_data, finish)
        self._lock = threading.Lock()  # DCP writes files from several threads

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        path = Path(path)
        with self._lock:
            self.threads.add(threading.current_thread())
        try:
            with path.open(mode) as raw:
                hashing = _HashingStream(raw, path, self.algorithm)
                yield hashing  # type: ignore[misc]  # duck-typed: DCP only writes, tells, flushes
                entry = hashing.entry()
        except BaseException as exc:
            # DCP's extra writer threads drop their exceptions (the thread just ends, and its
            # items go missing from the metadata); keep them so write_data can raise them.
            io_error = _os_error_in(exc) if isinstance(exc, Exception) else None
            with self._lock:
                self.errors.append(_with_path(io_error, path) if io_error else exc)
            if io_error is None or threading.current_thread() is self.owner:
                raise
            # An I/O failure (a full disk) in one of DCP's extra writer threads: end this file
            # quietly. Raised, it escapes the thread and Python prints its traceback;
            # write_data raises it instead, in the thread that called it.
            return
        with self._lock:
            self.entries[path] = entry

    def join_other_writers(self, timeout_s: float = 60.0) -> None:
        """Wait for DCP's extra writer threads: when the calling thread's write failed, DCP
        returns without joining them, and removing the directory under them would crash them."""
        with self._lock:
            others = [t for t in self.threads if t is not threading.current_thread()]
        for thread in others:
            thread.join(timeout_s)

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)
        with self._lock:
            entry = self.entries.pop(Path(path), None)
            if entry is not None:
                self.entries[Path(new_path)] = entry


class HashedFileSystemWriter(FileSystemWriter):
    """DCP ``FileSystemWriter`` (fsync on) that hashes while writing and writes ``extra`` bytes.

    ``digests()`` after the save: {path relative to the checkpoint: FileEntry} of every file
    this rank wrote (its shards, its extra file, and ``.metadata`` on the coordinator).
    """

    def __init__(
        self, path: Path, extra_name: str, extra_bytes: bytes, thread_count: int, algorithm: str = "sha256"
    ) -> None:
        super().__init__(path, thread_count=thread_count, sync_files=True)
        self.hashing_fs = _HashingFileSystem(algorithm)
        self.fs = self.hashing_fs
        self._root = Path(path)
        self._extra_name = extra_name
        self._extra_bytes = extra_bytes

    def write_data(self, plan: Any, planner: Any) -> Any:
        """The shard files (``raw_format.py``), one per writer thread, and the extra file beside
        them (its fsync overlaps theirs).

        An error in any writer thread fails the save (DCP's own writer threads drop theirs).
        """
        fs = self.fs
        assert isinstance(fs, _HashingFileSystem)
        fs.owner = threading.current_thread()  # its own errors (.metadata too) raise at once
        buckets = split_by_size(self.thread_count, plan.items)
        names = [f"{compat.dcp_file_prefix(plan)}{n}{FILE_SUFFIX}" for n in range(len(buckets))]
        with ThreadPoolExecutor(len(buckets) + 1, "hpcpipe-ckpt-write") as pool:
            extra = pool.submit(self._write_extra)
            futures = [
                pool.submit(self._write_file, n, b, planner) for n, b in zip(names, buckets, strict=True)
            ]
            results = [r for future in futures for r in future.result()]
            extra.result()
        if fs.errors:
            raise fs.errors[0]
        if len(results) != len(plan.items):
            raise RuntimeError(f"{self._root}: wrote {len(results)} of {len(plan.items)} checkpoint items")
        done: torch.futures.Future[list[Any]] = torch.futures.Future()
        done.set_result(results)
        return done

    def _write_file(self, name: str, items: list[Any], planner: Any) -> list[Any]:
        path = self._root / name
        results: list[Any] = []  # stays empty when an I/O error ends the file (fs.errors has it)
        with self.fs.create_stream(path, "wb") as stream:
            results = write_items(stream, name, items, planner)
            stream.flush()
            try:
                os.fsync(stream.fileno())
            except OSError as exc:
                raise _with_path(exc, path) from None
        return results

    def _write_extra(self) -> None:
        target = self._root / self._extra_name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _with_path(exc, target.parent) from None
        with self.fs.create_stream(target, "wb") as stream:
            stream.write(self._extra_bytes)
            stream.flush()
            try:
                os.fsync(stream.fileno())
            except OSError as exc:
                raise _with_path(exc, target) from None

    def digests(self) -> dict[str, FileEntry]:
        fs = self.fs
        assert isinstance(fs, _HashingFileSystem)
        return {path.relative_to(self._root).as_posix(): e for path, e in fs.entries.items()}


def load_state_safely(ckpt: Path, state: dict[str, Any], misfit: str) -> None:
    """Load ``state`` in place from one checkpoint on one process, through the safe reader.

    A checkpoint that does not fit ``state`` raises CheckpointError "<ckpt>: <misfit> (<cause>)";
    one whose files differ from its manifest, FileMismatch naming the file.
    """
    import torch.distributed.checkpoint as dcp

    reader = SafeFileSystemReader(ckpt, read_manifest(ckpt))
    try:
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        if not _is_dcp_error(exc):
            raise
        raise CheckpointError(f"{ckpt}: {misfit} ({_first_line(exc)})") from None


def _is_dcp_error(exc: BaseException) -> bool:
    from torch.distributed.checkpoint.api import CheckpointException

    return isinstance(exc, CheckpointException | RuntimeError)


def _first_line(exc: BaseException) -> str:
    failures = getattr(exc, "failures", None)
    inner = failures[min(failures)][0] if isinstance(failures, dict) and failures else exc
    if isinstance(inner, CheckpointError):
        raise inner
    lines = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {lines[0] if lines else ''}"
