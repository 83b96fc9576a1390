"""The ``observe:`` config section: metrics files, the Prometheus exporter, GPU telemetry,
rank-imbalance detection, the profiler, and the tracking sinks that outlive the run (TensorBoard,
MLflow) (its own module: config.py holds the training side)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from hpcpipe.config.section import Section


class PrometheusConfig(Section):
    """One ``/metrics`` endpoint per rank, for a Prometheus server to scrape (never multiprocess)."""

    port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Base port: rank with local rank L serves http://HOST:(port + L)/metrics "
        "(null: no exporter). A port already taken logs one warning; training continues.",
    )
    host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="Address the endpoints bind: loopback by default; 0.0.0.0 to be scraped "
        "from other machines (in a Kubernetes pod, for instance).",
    )
    targets_dir: str | None = Field(
        None,
        description="Directory for the file-service-discovery target files, one per run and node "
        "(Prometheus globs only the last path segment, so every run shares one directory); "
        "null: <run.out_dir>/prometheus-targets.",
    )
    pushgateway: str | None = Field(
        None,
        description="Pushgateway URL (http://host:9091): rank 0 pushes an end-of-run summary "
        "there (job hpcpipe, grouped by run). Null: no push.",
    )

    @field_validator("pushgateway")
    @classmethod
    def _no_password(cls, url: str | None) -> str | None:
        # config.yaml is saved with the run and logged to TensorBoard and MLflow: no secrets in it.
        # Nor could the push use them: urllib takes user:password@ for part of the host name.
        if url is not None and urlsplit(url).password is not None:
            raise ValueError("holds a password: config.yaml is saved with the run, and the push sends none")
        return url

    @model_validator(mode="after")
    def _port_range(self) -> PrometheusConfig:
        # port + local_rank must stay a valid port for up to 64 local ranks.
        if self.port is not None and self.port > 65535 - 64:
            raise ValueError(f"port {self.port}: leave room for port + local_rank (at most {65535 - 64})")
        return self


class GpuTelemetryConfig(Section):
    """NVML sampling (nvidia-ml-py) on a background thread; costs nothing without a GPU."""

    enabled: bool = Field(True, description="Sample this rank's GPU (a no-op, said once, without one).")
    interval_s: float = Field(5.0, gt=0, description="Seconds between two samples.")
    dcgm_names: bool = Field(
        False,
        description="Also export dcgm-exporter's DCGM_FI_DEV_* names and labels, so existing "
        "DCGM dashboards show hpcpipe's GPUs.",
    )


class ImbalanceConfig(Section):
    """Straggler detection: one small all-gather of every rank's phase times, on logged steps."""

    every_steps: int = Field(
        50,
        ge=0,
        description="Check at the first logged step at least this many steps after the last "
        "check (0: never). Costs one all-gather of 12 numbers per check.",
    )
    threshold: float = Field(
        0.20,
        gt=0,
        description="Raise an `imbalance` event when (max - min) / median of the ranks' busy "
        "time (step time minus exposed communication) exceeds this.",
    )
    warmup_steps: int = Field(
        20,
        ge=0,
        description="Check only logging intervals that start after this step (compilation, "
        "allocator and cache warm-up, DDP's bucket rebuild after step 1).",
    )
    consecutive: int = Field(
        2,
        ge=1,
        description="Raise the event only when the same rank is over the threshold in this many "
        "checks in a row (1: at the first). A straggler stays slow; a descheduled process on a "
        "shared node makes one interval uneven now and then.",
    )


class ProfileConfig(Section):
    """A torch.profiler window: Chrome/Perfetto traces under ``<run_dir>/profile/``."""

    start_step: int = Field(10, ge=1, description="First step of the window (its warm-up steps come first).")
    warmup: int = Field(1, ge=0, description="Steps traced but discarded before the active ones.")
    active: int = Field(3, ge=1, description="Steps recorded.")
    ranks: list[int] | Literal["all"] = Field(
        default_factory=lambda: [0], description="Ranks that record a trace: a list, or `all`."
    )
    record_shapes: bool = Field(False, description="Record input shapes of every operator.")
    with_stack: bool = Field(False, description="Record Python stacks (larger traces, more overhead).")
    memory: bool = Field(
        False,
        description="Profile memory; on CUDA also record the allocator history and dump a "
        "snapshot (open it at pytorch.org/memory_viz), and dump one on an out-of-memory error.",
    )

    def records(self, rank: int) -> bool:
        return self.ranks == "all" or rank in self.ranks


class MlflowConfig(Section):
    """MLflow tracking from rank 0, on a background thread: training never waits on the server."""

    tracking_uri: str | None = Field(
        None,
        description="sqlite:///path/mlflow.db or http(s)://host:port (null: $MLFLOW_TRACKING_URI). "
        "No credentials here: MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN.",
    )
    experiment: str = Field("hpcpipe", min_length=1, description="MLflow experiment name.")
    queue_size: int = Field(
        20000,
        ge=100,
        description="Metric values held while the server is unreachable; past it they are dropped "
        "(one warning) and `hpcpipe track sync RUN_DIR` replays them from metrics.jsonl.",
    )
    close_timeout_s: float = Field(
        15.0, ge=0, description="At the end of training, how long to wait for queued values to send."
    )

    @field_validator("tracking_uri")
    @classmethod
    def _no_credentials(cls, uri: str | None) -> str | None:
        # config.yaml is saved in the run directory and logged as an artifact: no secrets in it.
        if uri is not None and urlsplit(uri).password is not None:
            raise ValueError(
                "holds a password: config.yaml is saved with the run; put credentials in "
                "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD instead"
            )
        return uri


class ObserveConfig(Section):
    log_every: int = Field(10, ge=1, description="Write a metrics row every N steps (and the last).")
    progress: bool = Field(True, description="Rich progress bar on rank 0 when on a terminal.")
    peak_tflops: float | None = Field(
        None, gt=0, description="Peak dense TFLOP/s per device for MFU (null: look up the GPU)."
    )
    prometheus: PrometheusConfig = Field(default_factory=PrometheusConfig)
    gpu: GpuTelemetryConfig = Field(default_factory=GpuTelemetryConfig)
    imbalance: ImbalanceConfig = Field(default_factory=ImbalanceConfig)
    profile: ProfileConfig | None = Field(None, description="A profiler window (null: no profiling).")
    tensorboard: bool = Field(
        False,
        description="TensorBoard event files under <run_dir>/tensorboard from rank 0: metrics, "
        "evaluation, hyper-parameters (the flattened config) and events as text.",
    )
    mlflow: MlflowConfig | None = Field(
        None, description="MLflow tracking (the `mlflow` extra; null: off). Rank 0 only."
    )
