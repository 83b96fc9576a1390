"""The thresholds file of `hpcpipe accept`: what to measure and the figure each row must reach.

A file is a shipped name (``cpu``, ``h100-8x-ib``: ``accept/thresholds/<name>.yaml``) or a path.
Every section is optional; a section that is present sets at least one threshold and becomes rows
of the report, and a row that cannot be measured fails (so a thresholds file never passes by
skipping what it asks for).
Unknown keys are errors, as in job configs, so a misspelt threshold cannot be silently ignored.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hpcpipe.bench.bus import COLLECTIVES, dtype_name, parse_size
from hpcpipe.bench.scaling import batch_sizes
from hpcpipe.config import load_config
from hpcpipe.errors import UserError
from hpcpipe.yamlfile import read_yaml_file


class _Section(BaseModel):
    # inf and nan compare as "> 0": `timeout_s: .inf` and `min_time_s: .inf` reached the
    # benchmarks and ended in an OverflowError; a figure or a limit is a finite number.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ConnectivityThresholds(_Section):
    min_world_size: int | None = Field(
        None, ge=1, description="Ranks that must answer (null: every rank launched)."
    )
    max_rtt_ms: float | None = Field(
        None, gt=0, description="Largest point-to-point round trip from rank 0 to any rank."
    )


class CollectiveThresholds(_Section):
    dtype: str = Field("float32", description="Element type of the buffers.")
    warmup: int = Field(5, ge=0, description="Untimed calls per size.")
    iters: int = Field(20, ge=1, description="Timed calls per size.")
    busbw_gbps: dict[str, dict[str, float]] = Field(
        description="collective -> {size: minimum bus bandwidth in GB/s}, e.g. all_reduce: {1G: 350}."
    )

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:  # at load, not as "--dtype: ..." from the benchmark
        return dtype_name(value)

    @field_validator("busbw_gbps")
    @classmethod
    def _known_collectives_and_sizes(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        if not value:  # no row would judge the section: a crashed benchmark passed
            raise ValueError("name at least one collective and its sizes, e.g. all_reduce: {1G: 350}")
        for name, sizes in value.items():
            if name not in COLLECTIVES:
                raise ValueError(f"unknown collective {name!r} (known: {', '.join(COLLECTIVES)})")
            if not sizes:
                raise ValueError(f"{name}: give at least one size and its minimum, e.g. {{1G: 350}}")
            for size, minimum in sizes.items():
                try:
                    parse_size(str(size), flag=f"size {size!r} of {name}")
                except UserError as exc:
                    raise ValueError(str(exc)) from None
                if not minimum > 0:  # a floor of 0 or less passes a link that moves nothing
                    raise ValueError(f"{name} {size}: the minimum bus bandwidth must be > 0 (got {minimum})")
        return value


class ComputeThresholds(_Section):
    matmul_tflops: dict[Literal["fp32", "tf32", "bf16", "fp16"], float] = Field(
        default_factory=dict, description="dtype -> minimum matmul TFLOP/s on every device."
    )

    @field_validator("matmul_tflops")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        for dtype, minimum in value.items():
            if not minimum > 0:
                raise ValueError(f"{dtype}: the minimum TFLOP/s must be > 0 (got {minimum})")
        return value

    memory_bandwidth_gbps: float | None = Field(None, gt=0, description="Device memory copy, read + write.")
    host_to_device_gbps: float | None = Field(None, gt=0, description="Pinned host -> device copy.")
    device_to_host_gbps: float | None = Field(None, gt=0, description="Device -> pinned host copy.")
    min_time_s: float = Field(0.3, gt=0, description="Timed seconds per figure.")

    @model_validator(mode="after")
    def _some_threshold(self) -> ComputeThresholds:
        figures = (self.memory_bandwidth_gbps, self.host_to_device_gbps, self.device_to_host_gbps)
        if not self.matmul_tflops and all(f is None for f in figures):  # no row: a crash passed
            raise ValueError(
                "sets no threshold: give matmul_tflops, memory_bandwidth_gbps, host_to_device_gbps "
                "or device_to_host_gbps"
            )
        return self


class TrainingRun(_Section):
    preset: str = Field(description="Preset name or job YAML path.")
    set: list[str] = Field(default_factory=list, description="--set overrides for the job.")
    steps: int = Field(10, ge=1, description="Measured optimizer steps per run.")
    warmup: int = Field(3, ge=0, description="Steps dropped before measuring.")


class ThroughputThresholds(TrainingRun):
    nproc: int | None = Field(None, ge=1, description="Ranks (null: the suite's nproc).")
    repeats: int = Field(1, ge=1, description="Runs; the median is compared.")
    min_per_s_per_device: float = Field(gt=0, description="Tokens (or samples) per second per device.")
    min_mfu: float | None = Field(
        None, gt=0, le=1, description="Model FLOPs utilisation (needs a known peak)."
    )


class ScalingThresholds(TrainingRun):
    nproc: list[int] = Field(description="World sizes, e.g. [1, 2, 4, 8]; the smallest is the baseline.")
    mode: Literal["strong", "weak"] = Field(
        "weak", description="Fixed global (strong) or per-rank (weak) batch."
    )
    min_efficiency: float = Field(gt=0, le=1.5, description="Minimum efficiency at every larger world size.")

    @field_validator("nproc")
    @classmethod
    def _a_baseline_and_more(cls, value: list[int]) -> list[int]:
        if any(n < 1 for n in value) or len(set(value)) < 2:  # one size makes no row: nothing judged
            raise ValueError(
                f"give two or more world sizes of 1 or more, the smallest the baseline (got {value})"
            )
        return value


class Thresholds(_Section):
    name: str = Field(description="Short name shown in reports.")
    description: str = Field("", description="What hardware the figures are for, and where they come from.")
    nproc: int = Field(1, ge=1, description="Ranks started locally when not under torchrun or srun.")
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    timeout_s: float = Field(600.0, gt=0, description="Process-group timeout for the benchmarks.")
    connectivity: ConnectivityThresholds | None = None
    collectives: CollectiveThresholds | None = None
    compute: ComputeThresholds | None = None
    throughput: ThroughputThresholds | None = None
    scaling: ScalingThresholds | None = None


def shipped_names() -> list[str]:
    root = resources.files(__package__).joinpath("thresholds")
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def thresholds_path(source: str) -> Path:
    """A shipped name or a path -> the file; UserError naming --thresholds when there is none."""
    path = Path(source)
    if path.suffix not in {".yaml", ".yml"} and "/" not in source:
        path = Path(str(resources.files(__package__).joinpath("thresholds", f"{source}.yaml")))
        if not path.is_file():
            raise UserError(
                f"--thresholds: no shipped thresholds {source!r} (shipped: {', '.join(shipped_names())})"
            )
    if not path.is_file():
        raise UserError(f"--thresholds: file not found: {path}")
    return path


def load_thresholds(source: str) -> Thresholds:
    """Read and validate a thresholds file, including the presets its training sections name."""
    path = thresholds_path(source)
    raw = read_yaml_file(path, "thresholds file")
    if not isinstance(raw, dict):
        raise UserError(f"{path}: the top level must be a mapping")
    try:
        thresholds = Thresholds.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "thresholds"
        raise UserError(f"{path}: {where}: {err['msg']}") from None
    for key, section in (("throughput", thresholds.throughput), ("scaling", thresholds.scaling)):
        if section is None:
            continue
        try:  # a bad preset, or world sizes its batch cannot be split over: now, not after the benchmarks
            cfg = load_config(section.preset, section.set)
            if isinstance(section, ScalingThresholds):
                for n in section.nproc:
                    batch_sizes(cfg, section.mode, n, where="nproc")
        except UserError as exc:
            raise UserError(f"{path}: {key}: {exc}") from None
    return thresholds
