"""DeepSpeed's own checkpoint format inside hpcpipe's verified store.

A checkpoint saved under ``parallel.strategy=deepspeed`` is a normal store directory (manifest,
atomic commit, verification, fallback, tiers, retention) whose model and optimizer state is
DeepSpeed's, written by ``engine.save_checkpoint``::

    step-00000040/
      manifest.json                         hashes of every file below (manifest.engine="deepspeed")
      extra/rank-NNNNN.pt                   hpcpipe's trainer state, as for DCP
      deepspeed/latest                      "global_step40": DeepSpeed's own pointer
      deepspeed/zero_to_fp32.py             DeepSpeed's consolidation script, as it writes it
      deepspeed/global_step40/zero_pp_rank_R_mp_rank_00_{model,optim}_states.pt   rank R's shards

So ``python step-00000040/deepspeed/zero_to_fp32.py step-00000040/deepspeed OUT`` consolidates it
with DeepSpeed's own tool, and ``hpcpipe ckpt export`` does the same through
``consolidated_state_dict``.

**No pickles run.** DeepSpeed reads these files with ``torch.load(weights_only=False)``.
hpcpipe's resume reads them through ``safe_torch_load`` instead (``weights_only=True`` with a
short allow-list of DeepSpeed's plain types), and export reads every file that way before
DeepSpeed's consolidation touches it.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpcpipe.checkpoint.manifest import CheckpointError, FileEntry, hash_file
from hpcpipe.checkpoint.state import refusal_reason

DIR = "deepspeed"
ENGINE = "deepspeed"  # Manifest.engine of these checkpoints


def tag(step: int) -> str:
    """DeepSpeed's tag for a step (its own convention, which its tools expect)."""
    return f"global_step{step}"


def owner_rank(relative: str) -> int:
    """Which rank wrote (and hashes) a file: a ZeRO shard's rank, rank 0 for the rest."""
    name = relative.rsplit("/", 1)[-1]
    if "zero_pp_rank_" in name:
        return int(name.split("zero_pp_rank_", 1)[1].split("_", 1)[0])
    return 0


def save_engine(
    engine: Any, tmp: Path, step: int, rank: int, algorithm: str, trainable_only: bool
) -> dict[str, FileEntry]:
    """``engine.save_checkpoint`` into ``tmp/deepspeed`` (collective), then fsync and hash the
    files this rank owns: {path relative to ``tmp``: entry}."""
    try:
        ok = engine.save_checkpoint(str(tmp / DIR), tag=tag(step), exclude_frozen_parameters=trainable_only)
    except BaseException:
        # DeepSpeed's save ends in a barrier on the default group, where the other ranks now wait
        # once they wrote their files: join it, so that every rank reaches the store's agreement
        # on the outcome instead of waiting there until the collective timeout.
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        raise
    if ok is False:
        raise OSError(f"DeepSpeed did not save {tmp / DIR}")
    entries: dict[str, FileEntry] = {}
    for path in sorted((tmp / DIR).rglob("*")):
        relative = path.relative_to(tmp).as_posix()
        if path.is_file() and owner_rank(relative) == rank:
            _fsync(path)
            entries[relative] = hash_file(path, algorithm)
    return entries


def write_extra(tmp: Path, name: str, data: bytes, algorithm: str) -> FileEntry:
    """This rank's trainer state (``state.serialize_extra``'s bytes) written durably; its entry."""
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return hash_file(path, algorithm)


def check_resumable(path: Path, saved_engine: str, saved_world: int, engine: str, world_size: int) -> None:
    """CheckpointError unless this run (``engine``, ``world_size``) can resume ``path``: DeepSpeed
    state loads only into DeepSpeed at the world size that wrote it, DCP state only into DCP."""
    if saved_engine != engine:
        strategy = {ENGINE: "deepspeed"}.get(engine, "ddp/fsdp/single")
        written = "DeepSpeed" if saved_engine == ENGINE else "DCP (ddp/fsdp/single)"
        raise CheckpointError(
            f"{path}: written by {written}, this run uses parallel.strategy={strategy}; resume it with "
            "the strategy that wrote it, or start elsewhere from `hpcpipe ckpt export`'s weights"
        )
    if engine == ENGINE and saved_world != world_size:
        raise CheckpointError(
            f"{path}: DeepSpeed ZeRO state of {saved_world} ranks cannot load into {world_size}; "
            f"resume with {saved_world} ranks"
        )


def load_engine(engine: Any, ckpt: Path, step: int, trainable_only: bool) -> None:
    """Load weights and optimizer state into ``engine`` (collective; the files were verified)."""
    try:
        path, _ = engine.load_checkpoint(
            str(ckpt / DIR),
            tag=tag(step),
            load_module_strict=not trainable_only,
            load_optimizer_states=True,
            load_lr_scheduler_states=False,
        )
    except CheckpointError:
        raise
    except (RuntimeError, KeyError, ValueError, AssertionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{ckpt}: does not load into this DeepSpeed engine ({first[:300]})") from None
    if path is None:
        raise CheckpointError(f"{ckpt / DIR}: DeepSpeed found no checkpoint with tag {tag(step)}")


def safe_torch_load(path: Path, map_location: Any = None) -> Any:
    """``torch.load(weights_only=True)`` allowing DeepSpeed's plain types; CheckpointError otherwise."""
    try:
        with torch.serialization.safe_globals(_allowed_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except Exception as exc:  # weights_only refusals surface as several exception types
        raise CheckpointError(f"{path}: unsafe or corrupt DeepSpeed state ({refusal_reason(exc)})") from None


def consolidated_state_dict(ckpt: Path, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """The full fp32 weights of a verified DeepSpeed checkpoint, on CPU, under the module's names.

    Only the manifest's step directory is read (never a path from the ``latest`` file), and every
    file there is first read with ``safe_torch_load`` (a refusal raises); then DeepSpeed's own
    ``zero_to_fp32`` consolidation gathers the shards, whatever world size wrote them. ZeRO stage
    0 in fp32 keeps no optimizer partitions: its weights are the rank-0 model file's ``module``.
    """
    from hpcpipe.checkpoint.manifest import read_manifest

    try:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except ImportError as exc:
        raise CheckpointError(f"{ckpt}: a DeepSpeed checkpoint needs DeepSpeed to consolidate ({exc}): "
                              "pip install 'hpcpipe[deepspeed]'") from None  # fmt: skip
    step_tag = tag(read_manifest(ckpt).step)
    root = ckpt / DIR
    step_dir = root / step_tag
    if not step_dir.is_dir():
        raise CheckpointError(
            f"{ckpt}: no {DIR}/{step_tag}/ directory (not a DeepSpeed checkpoint of its step)"
        )
    files = sorted(step_dir.glob("*.pt"))
    has_partitions = any(path.name.endswith("_optim_states.pt") for path in files)
    module: Any = None
    for path in files:  # one at a time: an optimizer partition can be most of a node's memory
        value = safe_torch_load(path, "cpu")
        if not has_partitions and isinstance(value, dict) and isinstance(value.get("module"), dict):
            module = value["module"]
        del value
    if not has_partitions:
        if module is None:
            raise CheckpointError(f"{step_dir}: no optimizer partitions and no module weights")
        return {
            n: t.detach().to("cpu", torch.float32) for n, t in module.items() if isinstance(t, torch.Tensor)
        }
    quiet = io.StringIO()  # its progress bar and summary print to the terminal of an export
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        state = get_fp32_state_dict_from_zero_checkpoint(
            str(root), tag=step_tag, exclude_frozen_parameters=trainable_only
        )
    return {name: tensor.detach().to("cpu", torch.float32) for name, tensor in state.items()}


def load_consolidated_into(
    ckpt: Path, tensors: dict[str, torch.Tensor], misfit: str, trainable_only: bool
) -> None:
    """Copy a DeepSpeed checkpoint's consolidated weights into ``tensors`` (module names) in place;
    CheckpointError "<ckpt>: <misfit> (...)" when a name is missing or a shape differs."""
    full = consolidated_state_dict(ckpt, trainable_only)
    for name, tensor in tensors.items():
        value = full.get(name)
        if value is None:
            raise CheckpointError(f"{ckpt}: {misfit} ({name} is not in the checkpoint)")
        if value.shape != tensor.shape:
            shapes = f"{tuple(value.shape)} saved, {tuple(tensor.shape)} expected"
            raise CheckpointError(f"{ckpt}: {misfit} ({name}: {shapes})")
        with torch.no_grad():
            tensor.copy_(value)


def is_deepspeed_checkpoint(ckpt: Path) -> bool:
    from hpcpipe.checkpoint.manifest import read_manifest

    return read_manifest(ckpt).engine == ENGINE


def _allowed_globals() -> list[Any]:
    """The non-plain types DeepSpeed's files hold, each a container of plain attributes: the ZeRO
    stage enum, the loss scaler's state (pickled in fp32 and bf16 runs too) and ZeRO-1/2's and the
    bf16 optimizer's ``fragment_address`` (where each parameter's slice lies in a flat partition)."""
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:
        return []
    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
