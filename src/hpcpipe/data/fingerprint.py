"""A fingerprint of map-style datasets as this process builds them: what lineage records for a
recipe whose data are not prepared files (``hpcpipe.DatasetRecipe``), so a resume in a process
that built other data (an order taken from a set of strings, which varies with
``PYTHONHASHSEED``; unseeded random data) is noticed (``dataset_changed``) instead of training
on silently.

It hashes each split's length and its first and last ``EDGE`` items, read with every global
random generator seeded and then restored: a random augmentation inside ``__getitem__`` gives
the same bytes in every process, and the caller's random state is left as it was.
"""

from __future__ import annotations

import hashlib
import random
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

EDGE = 4  # items read at each end of a split


def datasets_fingerprint(splits: Sequence[Any]) -> str:
    """SHA-256 over the splits' lengths and edge items (tensors by dtype, shape and bytes)."""
    digest = hashlib.sha256()
    with _seeded():
        for dataset in splits:
            size = len(dataset)
            digest.update(f"split {size}\n".encode())
            for index in sorted({*range(min(EDGE, size)), *range(max(size - EDGE, 0), size)}):
                _feed(digest, dataset[index])
    return digest.hexdigest()


def _feed(digest: Any, item: Any) -> None:
    """An item's content: tensors and arrays by dtype, shape and bytes; containers in order;
    numbers and strings by their repr; anything else by its type alone."""
    import torch

    if isinstance(item, torch.Tensor):
        tensor = item.detach().to("cpu").contiguous()
        digest.update(f"tensor {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        if tensor.numel():  # its bytes, whatever the dtype (bfloat16 has no numpy type)
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(item, dict):
        for key in sorted(item, key=str):
            digest.update(f"key {key!r}\n".encode())
            _feed(digest, item[key])
    elif isinstance(item, list | tuple):
        digest.update(f"{type(item).__name__} {len(item)}\n".encode())
        for part in item:
            _feed(digest, part)
    elif isinstance(item, str | bytes | int | float | bool | type(None)):
        digest.update(f"{type(item).__name__} {item!r}\n".encode())
    elif callable(getattr(item, "tobytes", None)):  # a numpy array, a PIL image: their contents
        shape = getattr(item, "shape", None) or getattr(item, "size", None)
        digest.update(
            f"{type(item).__name__} {getattr(item, 'dtype', getattr(item, 'mode', ''))} {shape}\n".encode()
        )
        digest.update(item.tobytes())
    else:  # its type only: a default repr holds a memory address, another in every process
        digest.update(f"{type(item).__module__}.{type(item).__qualname__}\n".encode())


@contextmanager
def _seeded(seed: int = 0) -> Iterator[None]:
    """torch's, Python's and (when imported) numpy's global generators seeded, then restored."""
    import torch

    state = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)  # the CPU's only: torch.manual_seed reseeds CUDA too
        random.seed(seed)
        if numpy is not None:
            numpy.random.seed(seed)
        try:
            yield
        finally:
            random.setstate(state)
            if numpy is not None:
                numpy.random.set_state(numpy_state)
