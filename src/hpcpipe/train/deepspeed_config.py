"""The DeepSpeed config of a job: hpcpipe's settings merged into the user's ``ds_config.json``.

Rules (each override is named in the notes the trainer logs once):

- Batch sizes come from the job (``train.micro_batch_size``, the accumulation it implies, the
  global batch). A different value in the file is an error naming both; ``"auto"`` (the Hugging
  Face convention) or an absent key takes the job's.
- ``train.*`` settings always win: precision (``bf16``/``fp16`` sections, ``torch_autocast`` off:
  hpcpipe autocasts itself), ``gradient_clipping``.
  The file's ``optimizer`` and ``scheduler`` sections are dropped: hpcpipe's optimizer and
  learning-rate schedule drive every step (DeepSpeed refuses a client optimizer beside them).
- ``parallel.zero_stage`` / ``offload_optimizer`` / ``offload_params`` win when the job sets them
  (not null); null takes the file's value, else ZeRO-3 without offload.
- Everything else in the file (bucket sizes, prefetch, ``stage3_*`` knobs, ...) is kept as is.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from hpcpipe.config import JobConfig
from hpcpipe.errors import ConfigError

DEFAULT_STAGE = 3
QUIET_STEPS = 2**31 - 1  # steps_per_print: hpcpipe writes its own metrics rows


@dataclass
class DeepSpeedSettings:
    config: dict[str, Any]
    notes: list[str] = field(default_factory=list)  # what hpcpipe changed in the user's file, and why

    @property
    def stage(self) -> int:
        return int(self.config["zero_optimization"]["stage"])

    @property
    def offloads_optimizer(self) -> bool:
        return _offload_device(self.config["zero_optimization"], "offload_optimizer") == "cpu"

    @property
    def offloads_params(self) -> bool:
        return _offload_device(self.config["zero_optimization"], "offload_param") == "cpu"


def deepspeed_settings(job: JobConfig, world_size: int, accum: int) -> DeepSpeedSettings:
    """The config ``deepspeed.initialize`` gets for this job at ``world_size`` ranks."""
    source, user = _user_config(job)
    settings = DeepSpeedSettings(copy.deepcopy(user))
    _batch_sizes(settings, job, world_size, accum, source)
    _drop_sections(settings)
    _precision(settings, job.train.precision)
    _set(settings, "gradient_clipping", job.train.grad_clip, "train.grad_clip")
    _zero(settings, job)
    cfg = settings.config
    cfg.setdefault("steps_per_print", QUIET_STEPS)
    cfg.setdefault("wall_clock_breakdown", False)
    # hpcpipe hands DeepSpeed a plain torch optimizer (train.optimizer), offloaded or not: no
    # compiled DeepSpeedCPUAdam, and the same update rule as under DDP/FSDP2.
    for key, value in (("zero_allow_untested_optimizer", True), ("zero_force_ds_cpu_optimizer", False)):
        _set(settings, key, value, "train.optimizer")
    return settings


def _user_config(job: JobConfig) -> tuple[str, dict[str, Any]]:
    given = job.parallel.deepspeed_config  # a file's contents were inlined when the job was loaded
    return "parallel.deepspeed_config", dict(given) if isinstance(given, dict) else {}


def _batch_sizes(
    settings: DeepSpeedSettings, job: JobConfig, world_size: int, accum: int, source: str
) -> None:
    ours = {
        "train_micro_batch_size_per_gpu": job.train.micro_batch_size,
        "gradient_accumulation_steps": accum,
        "train_batch_size": job.train.micro_batch_size * accum * world_size,
    }
    for key, value in ours.items():
        theirs = settings.config.get(key, "auto")
        if theirs not in ("auto", value):
            raise ConfigError(
                f"parallel.deepspeed_config: {key}={theirs} in {source} differs from the job's {value} "
                f"(train.micro_batch_size={job.train.micro_batch_size}, train.global_batch_size="
                f'{job.train.global_batch_size}, {world_size} ranks); make them agree or set it to "auto"'
            )
        settings.config[key] = value


def _drop_sections(settings: DeepSpeedSettings) -> None:
    for key in ("optimizer", "scheduler"):
        if settings.config.pop(key, None) is not None:
            settings.notes.append(
                f"deepspeed_config: '{key}' ignored (train.optimizer and train.schedule drive every step)"
            )


def _precision(settings: DeepSpeedSettings, precision: str) -> None:
    autocast = settings.config.get("torch_autocast")
    if isinstance(autocast, dict) and autocast.get("enabled"):  # a run of fp32 trained under bf16 autocast
        settings.notes.append(
            f"deepspeed_config: torch_autocast.enabled overridden by train.precision={precision} "
            "(hpcpipe's own autocast)"
        )
        settings.config["torch_autocast"] = {**autocast, "enabled": False}
    for section, name in (("bf16", "bf16"), ("fp16", "fp16")):
        want = precision == name
        block = settings.config.get(section)
        block = dict(block) if isinstance(block, dict) else {}
        had = block.get("enabled", "auto")  # absent: nothing to override
        if had != "auto" and bool(had) != want:
            settings.notes.append(
                f"deepspeed_config: {section}.enabled={had} overridden by train.precision={precision}"
            )
        block["enabled"] = want
        settings.config[section] = block


def _set(settings: DeepSpeedSettings, key: str, value: Any, ours: str) -> None:
    theirs = settings.config.get(key, "auto")
    if theirs not in ("auto", value):
        settings.notes.append(f"deepspeed_config: {key}={theirs} overridden by {ours}={value}")
    settings.config[key] = value


def _zero(settings: DeepSpeedSettings, job: JobConfig) -> None:
    par = job.parallel
    zero = settings.config.get("zero_optimization")
    if isinstance(zero, bool):  # DeepSpeed's legacy form: false is stage 0, true stage 1 (it ran ZeRO-3)
        zero = {"stage": int(zero)}
    elif zero is not None and not isinstance(zero, dict):
        raise ConfigError(f"parallel.deepspeed_config: zero_optimization={zero!r} is not a mapping")
    zero = dict(zero or {})
    stage = zero.get("stage", DEFAULT_STAGE)
    if par.zero_stage is not None:
        if "stage" in zero and zero["stage"] != par.zero_stage:
            settings.notes.append(
                f"deepspeed_config: zero_optimization.stage={stage} overridden by parallel.zero_stage"
            )
        stage = par.zero_stage
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"parallel.deepspeed_config: zero_optimization.stage={stage!r} is not 0, 1, 2 or 3")
    zero["stage"] = stage
    for key in ("offload_optimizer", "offload_param"):
        _offload_device(zero, key)  # a block that is not a mapping fails here, named
    for ours, theirs_key in (
        (par.offload_optimizer, "offload_optimizer"),
        (par.offload_params, "offload_param"),
    ):
        if ours is None:
            continue
        current = _offload_device(zero, theirs_key)
        if theirs_key in zero and current != ours:
            settings.notes.append(
                f"deepspeed_config: zero_optimization.{theirs_key}.device={current} overridden by parallel"
            )
        zero[theirs_key] = {**(zero.get(theirs_key) or {}), "device": ours}
    if _offload_device(zero, "offload_param") == "cpu" and stage != 3:
        raise ConfigError("parallel.offload_params needs ZeRO stage 3 (only ZeRO-3 partitions parameters)")
    settings.config["zero_optimization"] = zero


def _offload_device(zero: dict[str, Any], key: str) -> str:
    block = zero.get(key)
    if block is None:
        return "none"
    if not isinstance(block, dict):
        raise ConfigError(
            f"parallel.deepspeed_config: zero_optimization.{key} must be a mapping such as "
            f'{{"device": "cpu"}}, not {block!r}'
        )
    return str(block.get("device", "none"))
