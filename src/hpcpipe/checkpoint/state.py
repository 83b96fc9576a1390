"""Per-rank trainer state in a checkpoint: RNG states and the trainer's ``extra`` dict.

Exact resume needs more than weights: the step, tokens seen, the data loader position, the LR
schedule, the gradient scaler and the random streams of every rank (torch CPU and CUDA,
Python's ``random``, NumPy's global generator). The trainer collects them in one ``extra`` dict
per rank; the store writes it as ``extra/rank-NNNNN.pt`` with ``torch.save`` and reads it back
with ``torch.load(weights_only=True)``. That loader rebuilds only containers, numbers, strings
and tensors, so ``extra`` must be made of those: ``check_extra`` rejects anything else when
saving (a clear error then, rather than an unloadable checkpoint later). RNG states are
converted here to exactly such values.
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcpipe.checkpoint.manifest import CheckpointError, FileEntry, check_bytes

__all__ = [
    "capture_rng_state",
    "check_extra",
    "extra_name",
    "load_extra",
    "refusal_reason",
    "restore_rng_state",
    "serialize_extra",
]

_SCALARS = (bool, int, float, str, bytes, type(None))


def extra_name(rank: int) -> str:
    """Where rank ``rank``'s extra state lives inside a checkpoint directory."""
    return f"extra/rank-{rank:05d}.pt"


def capture_rng_state() -> dict[str, Any]:
    """Every random stream of this process, as tensors, lists and numbers."""
    version, mt_state, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch_cpu": torch.get_rng_state(),
        "python": {"version": version, "state": list(mt_state), "gauss_next": gauss_next},
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what ``capture_rng_state`` took (CUDA streams only when there are CUDA devices)."""
    torch.set_rng_state(state["torch_cpu"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    npy = state["numpy"]
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    cuda = state.get("torch_cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def check_extra(value: Any, where: str = "extra") -> None:
    """TypeError naming the key when ``value`` holds something ``weights_only`` cannot load."""
    if isinstance(value, torch.Tensor):
        if value.is_sparse or value.layout != torch.strided:
            raise TypeError(f"{where}: only dense tensors can be checkpointed")
        return
    if isinstance(value, _SCALARS):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str | int):
                raise TypeError(f"{where}: keys must be str or int, got {type(key).__name__}")
            check_extra(item, f"{where}.{key}")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            check_extra(item, f"{where}[{index}]")
        return
    raise TypeError(
        f"{where}: {type(value).__name__} cannot be checkpointed safely; use numbers, strings, "
        "lists, dicts and tensors (convert NumPy values with .tolist() or torch.from_numpy)"
    )


def serialize_extra(extra: dict[str, Any]) -> bytes:
    """The bytes of ``extra/rank-NNNNN.pt``; tensors are copied to CPU (a snapshot of now)."""
    check_extra(extra)
    cpu = _to_cpu(extra)
    buffer = io.BytesIO()
    torch.save(cpu, buffer)
    return buffer.getvalue()


def load_extra(path: Path, want: FileEntry | None = None, algorithm: str = "sha256") -> dict[str, Any]:
    """Read an extra file with ``weights_only=True``; CheckpointError naming it otherwise.

    ``want``: its manifest entry, checked on the bytes read before they are parsed
    (FileMismatch naming ``<checkpoint>/extra/rank-N.pt`` relative to the checkpoint).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    check_bytes(f"{path.parent.name}/{path.name}", data, want, algorithm)
    try:
        value = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # weights_only refusals surface as several exception types
        raise CheckpointError(f"{path}: unsafe or corrupt trainer state ({refusal_reason(exc)})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: trainer state is a {type(value).__name__}, expected a dict")
    return value


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_cpu(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_to_cpu(item) for item in value)
    return value


# The advice around the cause in torch.load(weights_only=True)'s multi-paragraph refusals.
_TORCH_ADVICE = ("Weights only load failed", "Please file an issue", "Check the documentation", "(1)", "(2)")


def refusal_reason(exc: BaseException) -> str:
    """One line for an error message: the cause in a ``torch.load`` refusal ("Unsupported global:
    GLOBAL posix.system ...", "Unsupported operand 103"), not torch's paragraphs of advice."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line for line in lines if not line.startswith(_TORCH_ADVICE)]
    reason = (causes or lines or [type(exc).__name__])[0]
    return reason.removeprefix("WeightsUnpickler error: ").split(". ")[0][:300]
