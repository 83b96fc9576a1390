"""The ``observe:`` config section: metrics files, the Prometheus exporter, GPU telemetry,
rank-imbalance detection, the profiler, the tracking sinks that outlive the run (TensorBoard,
MLflow) and OpenTelemetry traces (its own module: config.py holds the training side)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator

from hpcpipe.config.section import Section, one_line
from hpcpipe.errors import hide_credentials


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
        min_length=1,
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
        "check (0: never). Costs one all-gather of 9 numbers per rank per check.",
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


def _tool_words(words: list[str]) -> list[str]:
    # Profiler options reach a command line (argv, never a shell) and the sbatch script's comments.
    for word in words:
        one_line(word)
    return words


class NsysConfig(Section):
    """``nsys profile`` around the workers of ``observe.profile.ranks`` (``observe.profile.tool:
    nsys``): one report per profiled rank."""

    executable: str = Field(
        "nsys", min_length=1, description="The Nsight Systems CLI: a name on the PATH or a path."
    )
    trace: list[str] = Field(
        default_factory=lambda: ["cuda", "nvtx", "osrt"],
        min_length=1,
        description="`nsys profile --trace`: CUDA API and kernels, NVTX ranges (hpcpipe's phases, and "
        "NCCL's own ranges: its collectives on the CPU timeline) and OS runtime calls; NCCL's "
        "kernels come with `cuda`. Add cudnn, cublas, python-gil, ucx... as needed.",
    )
    sample: Literal["process-tree", "none"] = Field(
        "none",
        description="CPU sampling (`--sample`, with `--cpuctxsw`): off by default, it makes reports "
        "large and adds overhead; `process-tree` for Python/host hot spots.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="More `nsys profile` options, one word each (e.g. --cuda-memory-usage=true).",
    )

    _one_line = field_validator("executable")(one_line)
    _words = field_validator("trace", "extra_args")(_tool_words)


class NcuConfig(Section):
    """``ncu`` around each worker (``observe.profile.tool: ncu``): kernel metrics for a bounded
    number of launches inside the window."""

    executable: str = Field(
        "ncu", min_length=1, description="The Nsight Compute CLI: a name on the PATH or a path."
    )
    set: str = Field(
        "full",
        min_length=1,
        description="`ncu --set`: the section set measured per kernel (basic, detailed, full, roofline, ...; "
        "`ncu --list-sets`). `full` has the roofline (FLOPs against bandwidth) and occupancy.",
    )
    launch_count: int = Field(
        20,
        ge=1,
        description="`--launch-count`: kernels profiled per rank (each is replayed once per metric pass).",
    )
    launch_skip: int = Field(0, ge=0, description="`--launch-skip`: kernels inside the window skipped first.")
    kernel_name: str | None = Field(
        "regex:^(?!nccl)",
        description="`--kernel-name` filter (null: every kernel). The default skips NCCL kernels: ncu "
        "replays each profiled kernel, and a collective replayed on one rank waits for peers that "
        "do not replay it.",
    )
    extra_args: list[str] = Field(default_factory=list, description="More `ncu` options, one word each.")

    _one_line = field_validator("executable", "set", "kernel_name")(one_line)
    _words = field_validator("extra_args")(_tool_words)


class ProfileConfig(Section):
    """A profiler window over chosen steps: torch.profiler traces under ``<run_dir>/profile/``, or
    each rank's worker under Nsight Systems / Nsight Compute (``tool``), limited to the window's
    steps through the CUDA profiler API."""

    tool: Literal["torch", "nsys", "ncu"] = Field(
        "torch",
        description="torch: torch.profiler Chrome traces, rank<R>.steps<A>-<B>.trace.json. nsys / ncu: "
        "the workers of `ranks` start under `nsys profile` / `ncu` (the others run plain) and capture "
        "runs from start_step for `active` steps (cudaProfilerStart/Stop); one report per profiled "
        "rank in <run_dir>/profile/nsys|ncu/, named <job>.rank<R> (job: $SLURM_JOB_ID, else run.name).",
    )
    start_step: int = Field(10, ge=1, description="First step of the window (its warm-up steps come first).")
    warmup: int = Field(
        1,
        ge=0,
        description="Steps traced but discarded before the active ones, at most start_step "
        "(tool torch only).",
    )
    active: int = Field(3, ge=1, description="Steps recorded.")
    ranks: list[int] | Literal["all"] = Field(
        default_factory=lambda: [0],
        description="Ranks that record a trace (tool nsys/ncu: the only workers started under the "
        "tool): a list, or `all` for every rank.",
    )
    record_shapes: bool = Field(False, description="Record input shapes of every operator.")
    with_stack: bool = Field(False, description="Record Python stacks (larger traces, more overhead).")
    memory: bool = Field(
        False,
        description="Profile memory; on CUDA also record the allocator history and dump a "
        "snapshot (open it at pytorch.org/memory_viz), and dump one on an out-of-memory error.",
    )

    nsys: NsysConfig = Field(default_factory=NsysConfig)
    ncu: NcuConfig = Field(default_factory=NcuConfig)

    def records(self, rank: int) -> bool:
        return self.ranks == "all" or rank in self.ranks

    @field_validator("warmup")
    @classmethod
    def _warmup_fits(cls, warmup: int, info: ValidationInfo) -> int:
        # torch.profiler's warm-up steps run before start_step: more of them than steps before it
        # would start the trace before step 0, which its schedule refuses mid-training. nsys and
        # ncu capture no warm-up.
        start = info.data.get("start_step")  # absent when start_step itself was refused
        if info.data.get("tool") == "torch" and start is not None and warmup > start:
            raise ValueError(f"more warm-up steps than start_step ({start}): at most {start}, or start later")
        return warmup

    @model_validator(mode="after")
    def _torch_options(self) -> ProfileConfig:
        # These shape a torch.profiler trace; under nsys/ncu they would silently do nothing.
        if self.tool != "torch":
            for key in ("record_shapes", "with_stack", "memory"):
                if getattr(self, key):
                    raise ValueError(f"{key} applies to tool torch only (tool is {self.tool})")
        return self


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
    def _a_tracking_uri(cls, uri: str | None) -> str | None:
        """Secrets stay out; a scheme is left to MLflow, whose plugins add stores (arn:aws:sagemaker,
        azureml://): one it has no store for is named in one line when the run first uses it."""
        if uri is None:
            return None
        parts = urlsplit(uri)
        scheme = parts.scheme.lower()
        _no_credentials(uri, database=scheme.partition("+")[0] in DATABASE_SCHEMES)
        if scheme in ("http", "https"):
            if not parts.hostname:
                raise ValueError(f"no host: give {scheme}://host:port")
            try:
                parts.port  # noqa: B018 - raises on a port that is not a number in range
            except ValueError as exc:
                raise ValueError(f"bad port: {exc}") from None
        return uri


# SQLAlchemy stores (postgresql+psycopg2: the engine, then its driver): a user name in the URI is
# how they are told who to connect as (MLFLOW_TRACKING_USERNAME is for http servers only).
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


def _no_credentials(uri: str, database: bool) -> None:
    """config.yaml is saved in the run directory, logged as an MLflow param and uploaded: a
    password, a secret in the query, and for a server any user part (a token stands in for the
    user) stay out."""
    parts = urlsplit(uri)
    secrets = [k for k, _ in parse_qsl(parts.query) if hide_credentials(f"{k}=x") != f"{k}=x"]
    if secrets:
        where = f"a secret ({secrets[0]}=)"
    elif parts.password is not None:
        where = "a password (user:password@)"
    elif parts.username is not None and not database:
        where = "a user part (user@ or user:password@)"
    else:
        return
    instead = (
        "the whole URI in $MLFLOW_TRACKING_URI with observe.mlflow.tracking_uri null, or the "
        "database driver's own password file (PostgreSQL: ~/.pgpass)"
        if database
        else "credentials in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or "
        "MLFLOW_TRACKING_TOKEN, or the whole URI in $MLFLOW_TRACKING_URI with "
        "observe.mlflow.tracking_uri null"
    )
    raise ValueError(f"holds {where}: config.yaml is saved with the run; put {instead}")


OTLP_TRACES_PATH = "/v1/traces"


class OtelConfig(Section):
    """OpenTelemetry spans of the pipeline, training steps and checkpoints, sent over OTLP (the
    ``otel`` extra). Headers (an API key, basic auth) come only from the standard
    OTEL_EXPORTER_OTLP_HEADERS environment variable, never from this file."""

    endpoint: str | None = Field(
        None,
        description="Collector URL, http:// or https:// (null: no tracing, nothing imported). "
        "http/protobuf: the base URL (http://collector:4318), /v1/traces is added unless the "
        "path already ends with it; grpc: http://collector:4317 (http: plaintext, https: TLS).",
    )
    protocol: Literal["http/protobuf", "grpc"] = Field(
        "http/protobuf", description="OTLP transport, as OTEL_EXPORTER_OTLP_PROTOCOL names it."
    )
    sample_every_steps: int = Field(
        10,
        ge=1,
        description="Trace every Nth training step (its phases and the regions after it); "
        "pipeline steps and checkpoint save/verify/restore are always traced.",
    )
    queue_size: int = Field(
        2048,
        ge=16,
        description="Spans held for the background exporter; past it the oldest are dropped "
        "(counted, reported at the end of training). Training never waits on the exporter.",
    )
    export_timeout_s: float = Field(
        5.0,
        gt=0,
        description="Seconds one export may take (with its retries), and the most the end of "
        "training waits for queued spans to go out.",
    )
    service_name: str = Field("hpcpipe", min_length=1, description="The spans' service.name.")

    @field_validator("endpoint")
    @classmethod
    def _a_collector_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not a collector URL: give http(s)://host:port (OTLP/HTTP 4318, gRPC 4317)")
        if parts.username is not None or parts.password is not None:
            # config.yaml is saved with the run and logged as an artifact: no secrets in it.
            raise ValueError("holds credentials: put them in OTEL_EXPORTER_OTLP_HEADERS instead")
        if parts.query or parts.fragment:
            raise ValueError("a collector URL takes no query or fragment")
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number in range
        except ValueError as exc:
            raise ValueError(f"bad port: {exc}") from None
        return url

    @model_validator(mode="after")
    def _grpc_has_no_path(self) -> OtelConfig:
        if self.protocol == "grpc" and self.endpoint and urlsplit(self.endpoint).path not in ("", "/"):
            raise ValueError("endpoint: a gRPC collector URL has no path (http://collector:4317)")
        return self

    @property
    def traces_url(self) -> str | None:
        """Where spans go: OTLP/HTTP's signal URL (``/v1/traces`` added to a base URL), or the
        gRPC endpoint as given."""
        if self.endpoint is None or self.protocol == "grpc":
            return self.endpoint
        parts = urlsplit(self.endpoint)
        path = parts.path.rstrip("/")
        if not path.endswith(OTLP_TRACES_PATH):
            path += OTLP_TRACES_PATH
        return parts._replace(path=path).geturl()


class ObserveConfig(Section):
    """What a run reports while it runs: metrics, progress, MFU, Prometheus, GPU telemetry,
    straggler detection, profiling, TensorBoard, MLflow and OpenTelemetry."""

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
    otel: OtelConfig = Field(
        default_factory=OtelConfig,
        description="OpenTelemetry traces (the `otel` extra): off while otel.endpoint is null.",
    )
