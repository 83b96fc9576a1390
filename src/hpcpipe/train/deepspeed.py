"""DeepSpeed ZeRO as a parallel strategy: the engine around hpcpipe's model and optimizer.

The trainer builds the model and its torch optimizer as for every strategy, then hands both to
``deepspeed.initialize`` here (parallelism applied outside the model code). The engine then
owns what ZeRO shards: parameters (stage 3), gradients (2+), optimizer state (1+), and the
update (``engine.step``). The loop's seams for it are in ``parallel.py`` (gradient-sync
boundary, the optimizer step, unwrapping) and ``precision.py`` (backward through the engine).

DeepSpeed is imported here only (``pip install 'hpcpipe[deepspeed]'``). Every private DeepSpeed
attribute hpcpipe touches is in the "private seams" section at the bottom, feature-detected.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path
from typing import Any

import pydantic
import torch
import torch.distributed as dist
from torch import nn

from hpcpipe.checkpoint.deepspeed_io import safe_torch_load
from hpcpipe.config import JobConfig
from hpcpipe.errors import ConfigError
from hpcpipe.train.deepspeed_config import DeepSpeedSettings, deepspeed_settings
from hpcpipe.train.distributed import DistContext

log = logging.getLogger("hpcpipe.train")

# Host bytes per parameter of what ZeRO-Offload keeps in host memory (the whole model, split
# over the ranks): fp32 master weights + Adam's two moments + fp32 gradients; parameters: fp32.
OFFLOADED_OPTIMIZER_BYTES = 16
OFFLOADED_PARAM_BYTES = 4


def is_engine(model: nn.Module) -> bool:
    """A DeepSpeed engine (without importing DeepSpeed where it was never used)."""
    return any(cls.__name__ == "DeepSpeedEngine" for cls in type(model).__mro__)


def import_deepspeed(device: torch.device) -> Any:
    """``deepspeed``, on the accelerator this rank uses; ConfigError when it is not installed."""
    if device.type == "cpu":
        # DeepSpeed picks CUDA whenever torch was built with it; this rank computes on the CPU.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        # Its op builders import torch's extension tools, which warn once per rank that there is
        # no CUDA runtime: true, and nothing to act on here.
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    try:
        import deepspeed
    except ImportError as exc:
        raise ConfigError(
            f"parallel.strategy=deepspeed needs DeepSpeed ({exc}): pip install 'hpcpipe[deepspeed]'"
        ) from None
    ds_log = logging.getLogger("DeepSpeed")
    ds_log.setLevel(logging.WARNING)  # its INFO lines would flood each rank's log
    if _not_our_choice not in ds_log.filters:
        ds_log.addFilter(_not_our_choice)
    _skip_inference_shm_op()
    return deepspeed


def _not_our_choice(record: logging.LogRecord) -> bool:
    """Drop DeepSpeed's warning about a torch optimizer under ZeRO: hpcpipe chooses it on purpose."""
    return "untested optimizer" not in record.getMessage()


def deepspeed_engine(
    model: nn.Module, optimizer: torch.optim.Optimizer, job: JobConfig, ctx: DistContext, accum: int
) -> tuple[nn.Module, torch.optim.Optimizer, DeepSpeedSettings]:
    """``deepspeed.initialize`` on the job's settings: (engine, its optimizer, the settings)."""
    settings = deepspeed_settings(job, ctx.world_size, accum)
    check_offload_memory(settings, model, ctx.world_size, ctx.local_world_size)
    deepspeed = import_deepspeed(ctx.device)
    try:
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=settings.config, dist_init_required=False
        )
    except pydantic.ValidationError as exc:  # DeepSpeed's config models refuse unknown keys
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error.get("loc", ())) or "?"
        raise ConfigError(
            f"parallel.deepspeed_config: DeepSpeed's {exc.title} refuses {where}: {error.get('msg')}"
        ) from None
    except Exception as exc:  # its other config checks: DeepSpeedConfigError, asserts (exit 1, restarts)
        if not _a_config_refusal(exc):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"parallel.deepspeed_config: DeepSpeed refuses it: {first}") from None
    _load_checkpoints_safely(engine)
    if ctx.is_main:
        for note in settings.notes:
            log.warning("%s", note)
    return engine, ds_optimizer, settings


def check_offload_memory(
    settings: DeepSpeedSettings, model: nn.Module, world_size: int, local_ranks: int
) -> None:
    """ConfigError when this node cannot hold what ZeRO-Offload would put in its host memory."""
    per_param = OFFLOADED_OPTIMIZER_BYTES * settings.offloads_optimizer
    per_param += OFFLOADED_PARAM_BYTES * settings.offloads_params
    if not per_param:
        return
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    params = sum(p.numel() for p in model.parameters())
    need = OFFLOADED_OPTIMIZER_BYTES * settings.offloads_optimizer * trainable
    need += OFFLOADED_PARAM_BYTES * settings.offloads_params * params
    need_here = need * local_ranks / world_size  # this node's ranks' partitions
    available = _lowest_over_ranks(_host_available_bytes())
    if available is not None and need_here > available:
        what = (
            "parallel.offload_optimizer=cpu" if settings.offloads_optimizer else "parallel.offload_params=cpu"
        )
        raise ConfigError(
            f"{what}: this node's {local_ranks} rank(s) would keep {need_here / 2**30:.1f} GiB in host "
            "memory "
            f"({trainable:,} trainable of {params:,} parameters), only {available / 2**30:.1f} GiB is "
            "available; use more nodes, a lower offload or none"
        )


def _lowest_over_ranks(value: int | None) -> int | None:
    """The smallest reading of any rank, on every rank: they must all refuse, or none (a rank
    refusing alone would leave the others waiting in ``deepspeed.initialize``'s broadcast)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    readings: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(readings, value)
    known = [reading for reading in readings if reading is not None]
    return min(known) if known else None


def _host_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# -- private seams: DeepSpeed internals hpcpipe relies on, each feature-detected ---------------


def _skip_inference_shm_op() -> None:
    """Do not build DeepSpeed's shared-memory all-reduce op on CPU.

    Its communication backend compiles a C++ op at start-up (~28 s once per machine, a compiler
    required) that only ``inference_all_reduce`` uses; training collectives go through
    torch.distributed (gloo) either way.
    """
    try:
        ds_torch_comm = importlib.import_module("deepspeed.comm.torch")
    except ImportError:
        return
    if os.environ.get("DS_ACCELERATOR") == "cpu" and hasattr(ds_torch_comm, "build_shm_op"):
        setattr(ds_torch_comm, "build_shm_op", lambda: None)  # noqa: B010  (a module attribute)


def _load_checkpoints_safely(engine: Any) -> None:
    """Make the engine read checkpoint files with ``torch.load(weights_only=True)``.

    DeepSpeed's own checkpoint engine unpickles with ``weights_only=False``; hpcpipe's store
    has verified each file's hash before a load, and this keeps a file written elsewhere from
    running code even so. A file that needs any other global is refused (CheckpointError).
    """
    current = getattr(engine, "checkpoint_engine", None)
    if current is None or not callable(getattr(current, "load", None)):
        raise RuntimeError(
            "this DeepSpeed version has no engine.checkpoint_engine.load; update hpcpipe's seam"
        )

    def load(path: str, map_location: Any = None) -> Any:
        return safe_torch_load(Path(path), map_location)

    current.load = load


def _a_config_refusal(exc: BaseException) -> bool:
    """DeepSpeed's refusal of its config (``DeepSpeedConfigError``, or an assert in its config
    parser), not a failure of the run."""
    if type(exc).__name__ == "DeepSpeedConfigError":
        return True
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = tb.tb_frame.f_code.co_filename.replace("\\", "/") if tb is not None else ""
    in_its_parser = "deepspeed/runtime/" in where and where.rsplit("/", 1)[-1] in (
        "config.py",
        "config_utils.py",
    )
    return isinstance(exc, AssertionError | ValueError) and in_its_parser
