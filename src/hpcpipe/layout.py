"""The run directory, written down: every file and folder a run holds, who writes it, who reads it.

A run directory is ``<run.out_dir>/<run.name>`` (``JobConfig.run_dir``). Every module that builds
a path into one goes through :class:`RunLayout`: ``RunLayout(run_dir).config``, or the bare name
(``RunLayout.CONFIG``) where only the name is needed (an artifact list, a ConfigMap key). A name
is spelled here and nowhere else, so renaming an entry, or adding one, is one edit, and this table
is the contract between the modules that write the run directory and those that read it.

Top level of ``<run_dir>/`` (name: who writes it -> who reads it)

- ``config.yaml`` (CONFIG): the job's resolved config. launch.worker (rank 0 at start),
  launch.slurm (sbatch submission), hpo.worker (a trial), chaos jobs
  -> launch.job (``hpcpipe train RUN``), cli (launch finished/collect, ckpt, track, eval),
  report.series/summary, observe.run_summary, track.sync, bench.scaling_inputs,
  checkpoint.export, sweep (plan), tracking artifacts.
- ``lineage.json`` (LINEAGE): code, data and environment of the run, plus the pipeline steps'
  records. observe.lineage (launch.worker, pipeline.engine)
  -> cli lineage, report.summary/run_tables, observe.run_summary, track.params,
  checkpoint.export, bench.throughput, tracking artifacts.
- ``metrics.jsonl`` (METRICS), ``metrics.csv`` (METRICS_CSV): one row per logged step and
  evaluation. observe.metrics.MetricsSink (train.trainer, rank 0)
  -> observe.metrics.read_metrics (report, sweep, bench, pipeline, hpo, track).
- ``events.jsonl`` (EVENTS): restarts, membership changes, stalls, checkpoints, the finish.
  observe.metrics.EventLog/append_event (trainer, launch.worker, watchdog)
  -> observe.metrics.read_events (cli launch finished, report, chaos checks).
- ``checkpoints/`` (CHECKPOINTS): the fast tier's ``step-<N>/`` directories when
  ``checkpoint.dir`` is null. checkpoint.tiers.fast_root (trainer, checkpoint.store)
  -> pipeline steps, cli ckpt, checkpoint.export (a checkpoint's run is its grandparent), chaos.
- ``export/`` (EXPORT): inference exports. ``export/<checkpoint>-<format>/`` (export_dir):
  pipeline export step, ``hpcpipe ckpt export``; ``export/adapter/`` (ADAPTER, adapter):
  recipes.lora_fc at the end of training -> track.registry, cli eval function-calling.
- ``eval.json`` (EVAL): the final held-out metrics. pipeline evaluate step
  -> report.series, track.registry, tracking artifacts.
- ``eval/``, ``eval-base/`` (FC_EVAL, FC_EVAL_BASE; fc_eval_dir): function-calling evaluation of
  the adapter, or of the base model (``eval-constrained/``, ``eval-base-constrained/`` with
  ``--constrain``: FC_EVAL_CONSTRAINED, FC_EVAL_BASE_CONSTRAINED), each holding ``eval.json`` and ``eval.md``
  (FC_EVAL_JSON, FC_EVAL_MARKDOWN). cli eval function-calling (evaluate.function_calling)
  -> cli eval compare (evaluate.compare), people.
- ``report/`` (REPORT): ``report.md`` (REPORT_MARKDOWN), ``report.html`` (REPORT_HTML), plots
  and ``series.csv``. report.run_report (pipeline report step, ``hpcpipe report``)
  -> pipeline (report outputs), track.artifacts.
- ``summary.md`` (SUMMARY): report.summary (pipeline report step) -> tracking artifacts, people.
- ``loss_curve.png`` (LOSS_CURVE): report.loss_curve (pipeline report step) -> tracking artifacts.
- ``sample.txt`` (SAMPLE): generated text. recipes.gpt at the end of training
  -> report.summary, tracking artifacts.
- ``data_report.json`` (DATA_REPORT): the prepared dataset's report, copied.
  recipes.lora_fc at the start of training -> people.
- ``lora_summary.json`` (LORA_SUMMARY): recipes.lora_fc at the end of training -> people.
- ``profile/`` (PROFILE): torch.profiler traces ``rank<R>.steps<A>-<B>.trace.json``; Nsight
  reports ``nsys/<job>.rank<R>.nsys-rep`` (with their ``nsys stats`` CSVs) and
  ``ncu/<job>.rank<R>.ncu-rep``. observe.trace, launch.nsight -> observe.verdict, observe.nsys_stats.
- ``tensorboard/`` (TENSORBOARD): event files. track.tensorboard -> TensorBoard.
- ``tracking/`` (TRACKING): ``mlflow.json`` (MLFLOW_RUN, the run's MLflow run and experiment
  ids): track.mlflow_client -> track.sync/registry, pipeline; ``registry.json`` (REGISTRY, the
  registered model version): track.registry -> pipeline register step.
- ``hang-rank<R>.txt`` (HANG_DUMP, hang_dump): stacks of a stalled rank.
  observe.watchdog -> its event's ``stack_file``, chaos checks, people.
- ``train.log`` (TRAIN_LOG): an HPO trial's output. hpo.worker -> hpo.worker (error notes), people.
- ``sweep_point.json`` (SWEEP_POINT): a finished sweep point's config hash. sweep.mark_done
  -> sweep (skips the point when run again).
- ``job.sbatch`` (SLURM_SCRIPT), ``slurm-<job>.out`` (SLURM_OUTPUT), ``slurm_job.json``
  (SLURM_JOB): a single-run Slurm submission (a job array puts them in its sweep directory).
  launch.slurm, cli launch slurm -> Slurm, launch.slurm_jobs (``hpcpipe jobs``).
- ``k8s.yaml`` (K8S_MANIFEST): the rendered manifests. cli launch k8s -> kubectl, people.
- ``helm-values.yaml`` (HELM_VALUES): the Helm chart's values. cli launch helm-values -> helm, people.
- ``pipeline.yaml`` (KFP_PIPELINE): the compiled Kubeflow pipeline. cli launch kfp -> KFP, people.
- ``k8s_job.json`` (K8S_JOB): the submitted Kubernetes job. launch.k8s_cluster
  -> cli jobs, launch.k8s_cluster.
- ``plan/`` (PLAN): ``goodput.json`` (GOODPUT_JSON) and ``goodput.png`` (GOODPUT_PLOT), the
  checkpoint-interval plan from the run's measured costs. cli plan goodput (hpcpipe.plan) -> people.

Anything else at the top of a run directory is not hpcpipe's (tests check a real run against
:meth:`RunLayout.names`). This module imports only the standard library: every room may use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import ClassVar


@dataclass(frozen=True)
class RunLayout:
    """The paths of one run directory: ``RunLayout(job.run_dir).metrics``."""

    root: Path

    # -- names at the top of the run directory -------------------------------------------------
    CONFIG: ClassVar[str] = "config.yaml"
    LINEAGE: ClassVar[str] = "lineage.json"
    METRICS: ClassVar[str] = "metrics.jsonl"
    METRICS_CSV: ClassVar[str] = "metrics.csv"
    EVENTS: ClassVar[str] = "events.jsonl"
    CHECKPOINTS: ClassVar[str] = "checkpoints"
    EXPORT: ClassVar[str] = "export"
    EVAL: ClassVar[str] = "eval.json"
    FC_EVAL: ClassVar[str] = "eval"
    FC_EVAL_BASE: ClassVar[str] = "eval-base"
    FC_EVAL_CONSTRAINED: ClassVar[str] = "eval-constrained"  # --constrain, beside the free one
    FC_EVAL_BASE_CONSTRAINED: ClassVar[str] = "eval-base-constrained"
    REPORT: ClassVar[str] = "report"
    SUMMARY: ClassVar[str] = "summary.md"
    LOSS_CURVE: ClassVar[str] = "loss_curve.png"
    SAMPLE: ClassVar[str] = "sample.txt"
    DATA_REPORT: ClassVar[str] = "data_report.json"
    LORA_SUMMARY: ClassVar[str] = "lora_summary.json"
    PROFILE: ClassVar[str] = "profile"
    TENSORBOARD: ClassVar[str] = "tensorboard"
    TRACKING: ClassVar[str] = "tracking"
    TRAIN_LOG: ClassVar[str] = "train.log"
    SWEEP_POINT: ClassVar[str] = "sweep_point.json"
    SLURM_SCRIPT: ClassVar[str] = "job.sbatch"
    SLURM_JOB: ClassVar[str] = "slurm_job.json"
    K8S_MANIFEST: ClassVar[str] = "k8s.yaml"
    HELM_VALUES: ClassVar[str] = "helm-values.yaml"
    KFP_PIPELINE: ClassVar[str] = "pipeline.yaml"
    K8S_JOB: ClassVar[str] = "k8s_job.json"
    PLAN: ClassVar[str] = "plan"
    # Computed names: str.format templates (HANG_DUMP) and Slurm filename patterns (SLURM_OUTPUT).
    HANG_DUMP: ClassVar[str] = "hang-rank{rank}.txt"
    SLURM_OUTPUT: ClassVar[str] = "slurm-%j.out"

    # -- names inside a folder of the run directory --------------------------------------------
    ADAPTER: ClassVar[str] = "adapter"  # export/adapter
    REPORT_MARKDOWN: ClassVar[str] = "report.md"  # report/report.md
    REPORT_HTML: ClassVar[str] = "report.html"  # report/report.html
    FC_EVAL_JSON: ClassVar[str] = "eval.json"  # eval/eval.json, eval-base/eval.json
    FC_EVAL_MARKDOWN: ClassVar[str] = "eval.md"  # eval/eval.md, eval-base/eval.md
    MLFLOW_RUN: ClassVar[str] = "mlflow.json"  # tracking/mlflow.json
    REGISTRY: ClassVar[str] = "registry.json"  # tracking/registry.json
    GOODPUT_JSON: ClassVar[str] = "goodput.json"  # plan/goodput.json
    GOODPUT_PLOT: ClassVar[str] = "goodput.png"  # plan/goodput.png

    # Every fixed top-level name, and glob patterns for the computed ones.
    ENTRIES: ClassVar[tuple[str, ...]] = (
        CONFIG, LINEAGE, METRICS, METRICS_CSV, EVENTS, CHECKPOINTS, EXPORT, EVAL, FC_EVAL,
        FC_EVAL_BASE, FC_EVAL_CONSTRAINED, FC_EVAL_BASE_CONSTRAINED, REPORT, SUMMARY, LOSS_CURVE,
        SAMPLE, DATA_REPORT, LORA_SUMMARY, PROFILE,
        TENSORBOARD, TRACKING, TRAIN_LOG, SWEEP_POINT, SLURM_SCRIPT, SLURM_JOB, K8S_MANIFEST, HELM_VALUES,
        KFP_PIPELINE, K8S_JOB, PLAN,
    )  # fmt: skip
    PATTERNS: ClassVar[tuple[str, ...]] = ("hang-rank*.txt", "slurm-*.out")
    # The names inside each folder, for the folders whose contents the layout names.
    NESTED: ClassVar[dict[str, tuple[str, ...]]] = {
        EXPORT: (ADAPTER,),
        REPORT: (REPORT_MARKDOWN, REPORT_HTML),
        FC_EVAL: (FC_EVAL_JSON, FC_EVAL_MARKDOWN),
        FC_EVAL_BASE: (FC_EVAL_JSON, FC_EVAL_MARKDOWN),
        FC_EVAL_CONSTRAINED: (FC_EVAL_JSON, FC_EVAL_MARKDOWN),
        FC_EVAL_BASE_CONSTRAINED: (FC_EVAL_JSON, FC_EVAL_MARKDOWN),
        TRACKING: (MLFLOW_RUN, REGISTRY),
        PLAN: (GOODPUT_JSON, GOODPUT_PLOT),
    }

    @classmethod
    def names(cls, entry: str) -> bool:
        """Whether ``entry`` (a name at the top of a run directory) is one the layout names."""
        return entry in cls.ENTRIES or any(fnmatchcase(entry, p) for p in cls.PATTERNS)

    # -- files -------------------------------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.root / self.CONFIG

    @property
    def lineage(self) -> Path:
        return self.root / self.LINEAGE

    @property
    def metrics(self) -> Path:
        return self.root / self.METRICS

    @property
    def metrics_csv(self) -> Path:
        return self.root / self.METRICS_CSV

    @property
    def events(self) -> Path:
        return self.root / self.EVENTS

    @property
    def eval(self) -> Path:
        return self.root / self.EVAL

    @property
    def summary(self) -> Path:
        return self.root / self.SUMMARY

    @property
    def loss_curve(self) -> Path:
        return self.root / self.LOSS_CURVE

    @property
    def sample(self) -> Path:
        return self.root / self.SAMPLE

    @property
    def data_report(self) -> Path:
        return self.root / self.DATA_REPORT

    @property
    def lora_summary(self) -> Path:
        return self.root / self.LORA_SUMMARY

    @property
    def train_log(self) -> Path:
        return self.root / self.TRAIN_LOG

    @property
    def sweep_point(self) -> Path:
        return self.root / self.SWEEP_POINT

    @property
    def slurm_script(self) -> Path:
        return self.root / self.SLURM_SCRIPT

    @property
    def slurm_job(self) -> Path:
        return self.root / self.SLURM_JOB

    @property
    def k8s_manifest(self) -> Path:
        return self.root / self.K8S_MANIFEST

    @property
    def helm_values(self) -> Path:
        return self.root / self.HELM_VALUES

    @property
    def kfp_pipeline(self) -> Path:
        return self.root / self.KFP_PIPELINE

    @property
    def k8s_job(self) -> Path:
        return self.root / self.K8S_JOB

    def hang_dump(self, rank: int) -> Path:
        return self.root / self.HANG_DUMP.format(rank=rank)

    # -- folders and what the layout names inside them -----------------------------------------
    @property
    def checkpoints(self) -> Path:
        return self.root / self.CHECKPOINTS

    @property
    def export(self) -> Path:
        return self.root / self.EXPORT

    @property
    def adapter(self) -> Path:
        return self.export / self.ADAPTER

    def export_dir(self, checkpoint_name: str, fmt: str) -> Path:
        """``export/<checkpoint>-<format>``: one checkpoint exported in one format."""
        return self.export / f"{checkpoint_name}-{fmt}"

    def fc_eval_dir(self, base: bool, constrained: bool = False) -> Path:
        """Function-calling evaluation of the base model (``eval-base``) or with the adapter
        (``eval``); decoded with ``--constrain``: ``eval-base-constrained``, ``eval-constrained``."""
        if constrained:
            return self.root / (self.FC_EVAL_BASE_CONSTRAINED if base else self.FC_EVAL_CONSTRAINED)
        return self.root / (self.FC_EVAL_BASE if base else self.FC_EVAL)

    @property
    def report(self) -> Path:
        return self.root / self.REPORT

    @property
    def report_markdown(self) -> Path:
        return self.report / self.REPORT_MARKDOWN

    @property
    def report_html(self) -> Path:
        return self.report / self.REPORT_HTML

    @property
    def profile(self) -> Path:
        return self.root / self.PROFILE

    @property
    def tensorboard(self) -> Path:
        return self.root / self.TENSORBOARD

    @property
    def tracking(self) -> Path:
        return self.root / self.TRACKING

    @property
    def mlflow_run(self) -> Path:
        return self.tracking / self.MLFLOW_RUN

    @property
    def registry(self) -> Path:
        return self.tracking / self.REGISTRY

    @property
    def plan(self) -> Path:
        return self.root / self.PLAN
