"""Tensors as raw bytes at aligned offsets: the shard files of hpcpipe's DCP checkpoints.

Why not DCP's own files: its ``FileSystemWriter`` stores every tensor as a ``torch.save`` archive
of its own, and loading unpickles each one (~0.4 ms per item) after a full extra pass to verify
the hashes; restore reached 0.36 of a raw read of the same bytes. Here a tensor is its memory,
written as is, so a reader can read each file once, sequentially, straight into the model's
tensors while it hashes (``file_reader.py``).

One file holds the items of one bucket back to back, each starting at a multiple of
``ALIGN`` bytes (zero padding between, hashed like everything else): first the non-tensor items
(DCP's planner has already pickled them), then the tensors, each as its contiguous memory in
C order and the machine's byte order (little-endian everywhere torch trains). Where each item
is and how long it is stays in DCP's metadata (``_StorageInfo(relative_path, offset, length)``);
a tensor's dtype and chunk shape are DCP's ``TensorStorageMetadata``. So DCP's planner keeps
resharding on load: a chunk written at one world size is narrowed into another's shards.
The files keep DCP's names (``__<rank>_<n>.distcp``); the manifest says which layout they hold
(``"tensor_format": "raw"``; a manifest without the field is DCP's own ``torch.save`` layout,
written before this one, which still loads). DCP's stock reader refuses these files (they are
not ``torch.save`` archives) rather than misreading them.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from torch.distributed.checkpoint.planner import SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from hpcpipe import compat

__all__ = ["ALIGN", "FILE_SUFFIX", "TENSOR_FORMAT", "split_by_size", "tensor_bytes", "write_items"]

TENSOR_FORMAT = "raw"  # the manifest's tensor_format for files in this layout
FILE_SUFFIX = ".distcp"  # DCP's own name for shard files, kept: tools and tests find shards by it
ALIGN = 64  # a cache line: every tensor starts aligned for torch.frombuffer and vector loads
_ZEROS = bytes(ALIGN)


def split_by_size(bins: int, items: list[WriteItem]) -> list[list[WriteItem]]:
    """``items`` in at most ``bins`` buckets of about equal bytes (largest tensor first into the
    lightest bucket), so that the files are written and later read and hashed in parallel."""
    tensors = sorted((i for i in items if i.type != WriteItemType.BYTE_IO), key=_size, reverse=True)
    buckets: list[list[WriteItem]] = [[] for _ in range(max(1, bins))]
    loads = [0] * len(buckets)
    for n, item in enumerate(i for i in items if i.type == WriteItemType.BYTE_IO):
        buckets[n % len(buckets)].append(item)
    for item in tensors:
        lightest = loads.index(min(loads))
        buckets[lightest].append(item)
        loads[lightest] += _size(item)
    return [bucket for bucket in buckets if bucket]


def _size(item: WriteItem) -> int:
    return item.tensor_storage_size() or 0


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of ``tensor`` as stored: contiguous, on the CPU, C order. A contiguous CPU tensor
    is not copied: the view is its own memory (the reader reads into it)."""
    flat = tensor.detach()
    if flat.device.type != "cpu":
        flat = flat.cpu()
    flat = flat.contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]  # ndarray is a buffer


def write_items(
    stream: Any, relative_path: str, items: list[WriteItem], planner: SavePlanner
) -> list[WriteResult]:
    """Write ``items`` into ``stream`` (a fresh file) in the layout above; their WriteResults."""
    results = []
    offset = 0
    ordered = [i for i in items if i.type == WriteItemType.BYTE_IO] + [
        i for i in items if i.type != WriteItemType.BYTE_IO
    ]
    for item in ordered:
        pad = -offset % ALIGN
        if pad:
            stream.write(_ZEROS[:pad])
            offset += pad
        data = planner.resolve_data(item)
        payload = data.getbuffer() if isinstance(data, io.BytesIO) else tensor_bytes(data)
        stream.write(payload)
        length = payload.nbytes
        results.append(
            WriteResult(
                index=item.index,
                size_in_bytes=length,
                storage_data=compat.dcp_storage_info(relative_path, offset, length),
            )
        )
        offset += length
    return results
