"""The async save's staging copy: the state's tensors into CPU buffers kept from one save to the next.

The part of an async save that blocks training is this copy (plus ``get_state_dict``). torch's
``_copy_state_dict`` copies tensor by tensor with ``Tensor.copy_``, which splits each large copy
over every intra-op (OpenMP) thread and waits for all of them: when another thread of the
process (the previous save's writer, the after-commit verifier, the memory-tier copy, a data
loader) or another process holds a core, the copy waits on the descheduled OpenMP thread. On
this project's shared 2-core machine staging 111 MB took 0.05 to 0.8 s that way (0.1 s with the
machine nearly idle), against 0.03 s for the same bytes copied as below (memory-bound there).
Here CPU tensors are copied as bytes in slices of at most ``SLICE`` bytes, taken in turn by the
calling thread and helpers of the store's own (NumPy's copy releases the GIL), so a busy core
slows the copy by its share, not by a barrier. Tensors on an accelerator, DTensors and anything
else unusual take torch's path, as before.
"""

from __future__ import annotations

import io
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch import nn

from hpcpipe import compat

__all__ = ["SLICE", "Staging", "layout"]

SLICE = 4 << 20  # bytes per copy job: small enough that two threads share any state evenly
_PLAIN = (torch.Tensor, nn.Parameter)
_SCALARS = (int, float, str, bytes, io.BytesIO, type(None))


class _Unusual(Exception):
    """The state holds something the byte copy does not handle: torch's copy then."""


class Staging:
    """A CPU copy of a state dict, its buffers reused while the state's layout stays the same."""

    def __init__(self, threads: int = 2) -> None:
        self.threads = max(1, threads)
        self._staged: dict[str, Any] | None = None
        self._layout: list[tuple[str, Any]] | None = None
        self._views: dict[int, np.ndarray] = {}  # id of a staging tensor -> its bytes
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` with every tensor replaced by its copy in the staging buffer (a new dict;
        non-tensor values shared, as torch's ``_copy_state_dict`` returns them)."""
        if self._staged is not None:
            copied = self._byte_copy(state, self._staged)
            if copied is not None:
                return copied
        shape = layout(state)  # the first save, another layout, or something unusual
        if self._staged is None or shape != self._layout:
            self._staged = compat.create_cpu_state_dict(state, pin_memory=torch.cuda.is_available())
            self._layout = shape
            self._views = {}
            copied = self._byte_copy(state, self._staged)
            if copied is not None:
                return copied
        return compat.copy_state_dict(state, self._staged)

    def _byte_copy(self, state: dict[str, Any], staged: dict[str, Any]) -> dict[str, Any] | None:
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        try:
            copied = _mirror(state, staged, pairs)
        except _Unusual:
            return None
        self._copy(pairs)
        assert isinstance(copied, dict)
        return copied

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def _copy(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """The bytes of every pair, in slices of at most ``SLICE`` bytes taken in turn by this
        thread and ``threads - 1`` helpers: whoever is running takes the next slice, so a
        helper kept off its core delays the copy by one slice at most."""
        jobs: list[tuple[np.ndarray, np.ndarray]] = []
        for source, target in pairs:
            src = _bytes(source)
            dst = self._views.get(id(target))
            if dst is None:  # the staging buffer's tensors live as long as it: viewed once
                dst = self._views[id(target)] = _bytes(target)
            jobs.extend(
                (dst[start : start + SLICE], src[start : start + SLICE])
                for start in range(0, src.size, SLICE)
            )
        taken = itertools.count()  # next() on it is atomic under the GIL

        def drain() -> None:
            while (index := next(taken)) < len(jobs):
                np.copyto(*jobs[index])

        helpers = min(self.threads - 1, len(jobs) - 1)
        if helpers <= 0:
            drain()
            return
        pool = self._executor()
        running = [pool.submit(drain) for _ in range(helpers)]
        drain()
        for future in running:
            future.result()

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads - 1, "hpcpipe-ckpt-stage")
            return self._pool


def _bytes(tensor: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor, as a flat NumPy view of its own memory."""
    return tensor.detach().reshape(-1).view(torch.uint8).numpy()


def _mirror(value: Any, staged: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """``value`` rebuilt with ``staged``'s tensors (the copies to make appended to ``pairs``), as
    torch's ``_copy_state_dict`` rebuilds it; _Unusual for anything it would treat otherwise."""
    if isinstance(value, torch.Tensor):
        if not (_plain_cpu(value) and _plain_cpu(staged)):
            raise _Unusual
        if staged.dtype != value.dtype or staged.shape != value.shape:
            raise _Unusual
        pairs.append((value, staged))
        return staged
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, dict):
        if not isinstance(staged, dict) or staged.keys() != value.keys():
            raise _Unusual
        return {key: _mirror(item, staged[key], pairs) for key, item in value.items()}
    if isinstance(value, list | tuple):
        if not isinstance(staged, list | tuple) or len(staged) != len(value):
            raise _Unusual
        items = [_mirror(item, other, pairs) for item, other in zip(value, staged, strict=True)]
        return tuple(items) if isinstance(value, tuple) else items
    raise _Unusual


def _plain_cpu(tensor: Any) -> bool:
    return (
        type(tensor) in _PLAIN
        and tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and tensor.is_contiguous()
        and not tensor.is_conj()
        and not tensor.is_neg()
    )


def layout(state: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Keys, shapes and dtypes of every tensor in a nested state dict (the staging buffer's shape)."""
    if isinstance(state, torch.Tensor):
        return [(prefix, (tuple(state.shape), state.dtype, type(state).__name__))]
    if isinstance(state, dict):
        return [item for key in state for item in layout(state[key], f"{prefix}.{key}")]
    if isinstance(state, list | tuple):
        return [item for i, value in enumerate(state) for item in layout(value, f"{prefix}[{i}]")]
    return []
