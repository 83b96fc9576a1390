"""Read one checkpoint file once: large sequential reads, hashed as they arrive, tensors landed in place.

A restore used to read every byte twice (verify the manifest's hashes, then DCP's load) and
unpickle one ``torch.save`` archive per tensor. Here each file is read front to back exactly
once. Every byte read is hashed (padding and items this rank does not need included: the hash
is the whole file's, as in the manifest), and each tensor that maps one-to-one onto a
destination tensor (same dtype and shape, contiguous: the common case of resuming at the same
world size) lands at once: read straight into its memory on the CPU, or through that one item's
host buffer on an accelerator. Everything else (a chunk to be resharded, tensors in DCP's own
``torch.save`` layout, pickled non-tensor items) is read into a buffer and handed to DCP's
planner only after the whole file verified. ``read_spans`` is the reading itself, for callers
that know where each item lands without DCP's planner (``same_layout.py``).

What may be touched before a file verified: the bytes of destination tensors, never anything
that is parsed. A file that fails raises ``FileMismatch`` naming it; the store then restores an
older checkpoint, which overwrites every tensor again (DCP loads the whole state dict). With
``checkpoint.scratch_if_none_verify`` the store verifies before loading instead, because there
is no older state to overwrite a half-loaded model with.

Threads: ``hashlib``/``blake3`` and file reads release the GIL, so the store reads a rank's
files in parallel (one per writer thread of the save), and within a file a second thread hashes
each chunk while the next one is read.
"""

from __future__ import annotations

import contextlib
import io
import os
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlanner, ReadItem

from hpcpipe.checkpoint.manifest import (
    CheckpointError,
    FileEntry,
    FileMismatch,
    Hasher,
    Problem,
    entry_problem,
    new_hasher,
)
from hpcpipe.checkpoint.raw_format import tensor_bytes

__all__ = ["Deferred", "Span", "chunk_of", "lands_in_place", "read_file", "read_spans"]

CHUNK = 4 << 20  # per read: small enough that hashing one overlaps reading the next
_AHEAD = 8  # chunks read ahead of the hashing thread at most


@dataclass
class Deferred:
    """Bytes read into a buffer, to give to the planner once their file verified."""

    requests: list[ReadItem]
    data: bytearray
    raw: bool  # a raw-layout chunk (its memory) rather than a torch.save archive

    def apply(
        self, planner: LoadPlanner, chunk: Callable[[MetadataIndex], tuple[torch.dtype, torch.Size]]
    ) -> None:
        first = self.requests[0]
        if first.type == LoadItemType.BYTE_IO:
            planner.load_bytes(first, io.BytesIO(self.data))
            return
        stored = self._tensor(first.storage_index, chunk)
        for request in self.requests:
            target = planner.resolve_tensor(request).detach()
            target.copy_(_narrow(stored, request.storage_offsets, request.lengths))
            planner.commit_tensor(request, target)

    def _tensor(self, index: MetadataIndex, chunk: Callable[[MetadataIndex], Any]) -> torch.Tensor:
        if not self.raw:
            return torch.load(io.BytesIO(self.data), map_location="cpu", weights_only=True)
        dtype, sizes = chunk(index)
        if len(self.data) == 0:
            return torch.empty(sizes, dtype=dtype)
        return torch.frombuffer(self.data, dtype=dtype).view(sizes)


@dataclass
class Span:
    """One stored item of a file: where it lies, and where it lands. ``target``: a destination
    tensor the item is exactly (dtype, element count), filled at once (its own memory when it is
    a contiguous CPU tensor, else through a buffer); None: read into a buffer, given back.
    ``requests``: DCP's reads of this item (the planner path)."""

    offset: int
    length: int
    target: torch.Tensor | None = None
    requests: list[ReadItem] = field(default_factory=list)


def read_file(
    path: Path,
    name: str,
    requests: list[ReadItem],
    locate: Callable[[MetadataIndex], tuple[int, int]],
    planner: LoadPlanner,
    metadata: Metadata,
    expected: FileEntry | None,
    algorithm: str,
    raw: bool,
) -> list[Deferred]:
    """Read ``path`` (``name`` in the manifest) once for DCP's planner; land what can be landed; verify.

    ``locate(storage_index)`` gives an item's (offset, length) in the file; ``raw``: the file
    is in ``raw_format.py``'s layout, else DCP's ``torch.save`` one. Returns what must be
    applied after the caller has the whole picture (``Deferred.apply``); FileMismatch when the
    file is shorter or longer than, or hashes differently from, ``expected``.
    """
    spans = _spans(requests, locate)
    if raw:
        for span in spans:
            span.target = _direct_target(span, planner, metadata)
    buffers = read_spans(path, name, spans, expected, algorithm)
    return [
        Deferred(span.requests, buffer, raw)
        for span, buffer in zip(spans, buffers, strict=True)
        if buffer is not None
    ]


def read_spans(
    path: Path, name: str, spans: list[Span], expected: FileEntry | None, algorithm: str
) -> list[bytearray | None]:
    """Read ``path`` front to back once, hashing every byte, landing each span (by offset, not
    overlapping); per span, its buffer when it has no target, else None. FileMismatch when the
    file is shorter or longer than, or hashes differently from, ``expected`` (None: unchecked)."""
    hasher = _HashBehind(new_hasher(algorithm)) if expected is not None else None
    buffers: list[bytearray | None] = []
    with _finishing(hasher), path.open("rb", buffering=0) as handle:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        position = 0
        for span in spans:
            if span.offset < position:
                raise _mismatch(path, name, "overlapping items in the checkpoint metadata")
            _skip(handle, span.offset - position, hasher, path, name)
            buffers.append(_land(handle, span, hasher, path, name))
            position = span.offset + span.length
        if hasher is not None:
            position += _skip(handle, None, hasher, path, name)
    if expected is not None and hasher is not None:
        _check(path, name, expected, position, hasher.hexdigest(), algorithm)
    return buffers


def _land(handle: Any, span: Span, hasher: _HashBehind | None, path: Path, name: str) -> bytearray | None:
    target = span.target
    if target is not None and lands_in_place(target, span.length):
        _fill(handle, tensor_bytes(target), hasher, path, name)  # its own memory
        return None
    buffer = bytearray(span.length)  # fresh: the hashing thread may still read the last one
    _fill(handle, memoryview(buffer), hasher, path, name)
    if target is None:
        return buffer
    if span.length:  # on an accelerator, or not contiguous: through this item's buffer, at once
        target.copy_(torch.frombuffer(buffer, dtype=target.dtype).view(target.shape))
    return None


def lands_in_place(target: torch.Tensor, length: int) -> bool:
    """Whether ``length`` stored bytes can be read straight into ``target``'s own memory."""
    return (
        target.device.type == "cpu"
        and target.layout == torch.strided
        and target.is_contiguous()
        and not target.is_conj()
        and not target.is_neg()
        and target.numel() > 0
        and target.numel() * target.element_size() == length
    )


class _HashBehind:
    """A hasher fed in order from the reading thread and run in a thread of its own, so the
    next read (waiting on the disk, or copying from the page cache) overlaps this hashing.
    The views must stay unchanged until hashed: tensors' own memory and fresh buffers do."""

    def __init__(self, hasher: Hasher) -> None:
        self._hasher = hasher
        self._views: queue.Queue[memoryview | None] = queue.Queue(maxsize=_AHEAD)
        self._thread = threading.Thread(target=self._run, name="hpcpipe-ckpt-hash", daemon=True)
        self._digest: str | None = None
        self._error: Exception | None = None
        self._thread.start()

    def update(self, view: memoryview) -> None:
        if self._error is not None:
            raise self._error
        self._views.put(view)

    def hexdigest(self) -> str:
        self.finish()
        if self._error is not None:
            raise self._error
        assert self._digest is not None
        return self._digest

    def finish(self) -> None:
        if self._thread.is_alive():
            self._views.put(None)
            self._thread.join()

    def _run(self) -> None:
        # On an error keep taking views (the reader must never block on a full queue), then stop.
        while (view := self._views.get()) is not None:
            if self._error is None:
                try:
                    self._hasher.update(view)
                except Exception as exc:
                    self._error = exc
        if self._error is None:
            self._digest = self._hasher.hexdigest()


@contextlib.contextmanager
def _finishing(hasher: _HashBehind | None) -> Iterator[None]:
    """Stop the hashing thread however reading ends (a short file raises mid-way)."""
    try:
        yield
    finally:
        if hasher is not None:
            hasher.finish()


def _spans(requests: list[ReadItem], locate: Callable[[MetadataIndex], tuple[int, int]]) -> list[Span]:
    spans: dict[tuple[int, int], Span] = {}
    for request in requests:
        offset, length = locate(request.storage_index)
        spans.setdefault((offset, length), Span(offset, length)).requests.append(request)
    return sorted(spans.values(), key=lambda span: span.offset)


def _direct_target(span: Span, planner: LoadPlanner, metadata: Metadata) -> torch.Tensor | None:
    """The destination tensor when the stored chunk is exactly it (same dtype, shape, contiguous);
    its bytes may be written before the file verified (module doc). Else None: deferred."""
    if len(span.requests) != 1 or span.requests[0].type == LoadItemType.BYTE_IO:
        return None
    request = span.requests[0]
    dtype, sizes = chunk_of(metadata, request.storage_index)
    if any(request.storage_offsets) or tuple(request.lengths) != tuple(sizes):
        return None
    target = planner.resolve_tensor(request).detach()
    fits = (
        target.dtype == dtype
        and target.is_contiguous()
        and target.numel() * target.element_size() == span.length
        and target.numel() > 0
    )
    return target if fits else None


def chunk_of(metadata: Metadata, index: MetadataIndex) -> tuple[torch.dtype, torch.Size]:
    """dtype and shape of the stored chunk ``index`` names, from DCP's metadata."""
    entry = metadata.state_dict_metadata.get(index.fqn)
    if not isinstance(entry, TensorStorageMetadata):
        raise CheckpointError(f"checkpoint metadata has no tensor {index.fqn!r}")
    chunks = entry.chunks
    if index.index is not None and index.index < len(chunks) and chunks[index.index].offsets == index.offset:
        return entry.properties.dtype, chunks[index.index].sizes
    for chunk in chunks:
        if chunk.offsets == index.offset:
            return entry.properties.dtype, chunk.sizes
    raise CheckpointError(f"checkpoint metadata has no chunk of {index.fqn!r} at {tuple(index.offset or ())}")


def _fill(handle: Any, view: memoryview, hasher: _HashBehind | None, path: Path, name: str) -> None:
    """Read exactly ``len(view)`` bytes into ``view`` (hashing them), in CHUNK-sized reads."""
    done, total = 0, len(view)
    while done < total:
        part = view[done : min(total, done + CHUNK)]
        got = handle.readinto(part)
        if not got:
            raise _mismatch(path, name, "wrong size", "more bytes", f"{handle.tell()} bytes")
        if hasher is not None:
            hasher.update(part[:got])
        done += got


def _skip(handle: Any, count: int | None, hasher: _HashBehind | None, path: Path, name: str) -> int:
    """Move ``count`` bytes on (to the end when None), hashing them when hashing; bytes passed."""
    if hasher is None:
        if count:
            handle.seek(count, os.SEEK_CUR)
        return count or 0
    passed = 0
    while count is None or passed < count:
        want = CHUNK if count is None else min(CHUNK, count - passed)
        if want == 0:
            break
        scratch = bytearray(want)  # a fresh buffer each time: the hashing thread may still read the last
        got = handle.readinto(scratch)
        if not got:
            if count is None:
                break
            raise _mismatch(path, name, "wrong size", "more bytes", f"{handle.tell()} bytes")
        hasher.update(memoryview(scratch)[:got])
        passed += got
    return passed


def _check(path: Path, name: str, expected: FileEntry, size: int, digest: str, algorithm: str) -> None:
    problem = entry_problem(name, expected, FileEntry(digest, size), algorithm)
    if problem is not None:
        raise FileMismatch(f"{path}: {problem}", problem)


def _mismatch(
    path: Path, name: str, reason: str, expected: str | None = None, actual: str | None = None
) -> FileMismatch:
    problem = Problem(name, reason, expected, actual)
    return FileMismatch(f"{path}: {problem}", problem)


def _narrow(tensor: torch.Tensor, offsets: torch.Size, lengths: torch.Size) -> torch.Tensor:
    for dim, (offset, length) in enumerate(zip(offsets, lengths, strict=True)):
        tensor = tensor.narrow(dim, offset, length)
    return tensor
