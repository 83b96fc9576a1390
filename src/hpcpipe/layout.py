"""The directories hpcpipe writes, written down: every file and folder, who writes it, who reads it.

A run directory (:class:`RunLayout`), the report folder of ``hpcpipe report`` (:class:`ReportLayout`),
an HPO study directory (:class:`StudyLayout`), a chaos results directory (:class:`ChaosLayout`) and
a sweep directory (:class:`SweepLayout`). Each is a frozen dataclass over the directory's root:
a ClassVar per name, and per path an ``Entry`` (``config = Entry(CONFIG)``, a path below the root)
or a method (a computed name).

Run directory
-------------

A run directory is ``<run.out_dir>/<run.name>`` (``JobConfig.run_dir``). Every module that builds
a path into one goes through :class:`RunLayout`: ``RunLayout(run_dir).config``, or the bare name
(``RunLayout.CONFIG``) where only the name is needed (an artifact list, a ConfigMap key). A name
is spelled here and nowhere else, so renaming an entry, or adding one, is one edit, and these
tables are the contract between the modules that write a directory and those that read it.

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
  evaluation, each with its ``step`` and, in metrics.jsonl, the Unix ``time`` it was logged (an
  evaluation row from before they had one takes the training row's before it in ``track sync``).
  observe.metrics.MetricsSink (train.trainer, rank 0)
  -> observe.metrics.read_metrics (report, sweep, bench, pipeline, hpo, track).
- ``events.jsonl`` (EVENTS): restarts, membership changes, stalls, checkpoints, the finish.
  observe.metrics.EventLog/append_event (trainer, launch.worker, watchdog)
  -> observe.metrics.read_events (cli launch finished, report, chaos checks).
- ``checkpoints/`` (CHECKPOINTS): the fast tier's ``step-<N>/`` directories when
  ``checkpoint.dir`` is null. checkpoint.tiers.fast_root (trainer, checkpoint.store)
  -> pipeline steps, cli ckpt, checkpoint.export (a checkpoint's run is its grandparent), chaos.
- ``export/`` (EXPORT): inference exports. ``export/<checkpoint>-<format>/`` (export_dir):
  pipeline export step, ``hpcpipe ckpt export``; ``export/adapter/`` (ADAPTER, adapter):
  recipes.lora_fc at the end of training, staged and recorded as an export (``.hpcpipe-export``
  with its ``step``: checkpoint.export_record) -> track.registry, cli eval function-calling. Beside
  PEFT's own files, the adapter folder holds ``call_threshold.json`` (CALL_THRESHOLD,
  call_threshold: the call threshold chosen on near misses; evaluate.calibrate, from
  recipes.lora_fc -> cli eval function-calling) and ``decline.json`` (DECLINE, decline: the rule
  that withdraws unsure calls; evaluate.decline, from cli eval decline -> cli eval decline and
  function-calling). Both are read from any adapter folder, a run's or one given by path.
- ``eval.json`` (EVAL): the final held-out metrics. pipeline evaluate step
  -> report.series, track.registry, tracking artifacts.
- ``eval/``, ``eval-base/`` (FC_EVAL, FC_EVAL_BASE; fc_eval_dir): function-calling evaluation of
  the adapter, or of the base model (``eval-constrained/``, ``eval-base-constrained/`` with
  ``--constrain``: FC_EVAL_CONSTRAINED, FC_EVAL_BASE_CONSTRAINED), each holding ``eval.json`` and ``eval.md``
  (FC_EVAL_JSON, FC_EVAL_MARKDOWN); those of BFCL's dev split. ``--split test`` writes
  ``eval-test/``, ``eval-base-test/``, ``eval-test-constrained/``, ``eval-base-test-constrained/``
  (FC_EVAL_TEST, FC_EVAL_BASE_TEST, FC_EVAL_TEST_CONSTRAINED, FC_EVAL_BASE_TEST_CONSTRAINED) and
  ``--split all`` the same with ``all`` (FC_EVAL_ALL, FC_EVAL_BASE_ALL, FC_EVAL_ALL_CONSTRAINED,
  FC_EVAL_BASE_ALL_CONSTRAINED). cli eval function-calling (evaluate.function_calling)
  -> cli eval compare (evaluate.compare), cli eval decline, people.
- ``report/`` (REPORT): the report folder (:class:`ReportLayout`). report.run_report (pipeline
  report step, ``hpcpipe report``) -> pipeline (report outputs), track.artifacts.
- ``summary.md`` (SUMMARY): report.summary (pipeline report step) -> tracking artifacts, people.
- ``loss_curve.png`` (LOSS_CURVE): report.loss_curve (pipeline report step) -> tracking artifacts.
- ``sample.txt`` (SAMPLE): generated text. recipes.gpt at the end of training
  -> report.summary, tracking artifacts.
- ``data_report.json`` (DATA_REPORT): the prepared dataset's report, copied.
  recipes.lora_fc at the start of training -> people.
- ``lora_summary.json`` (LORA_SUMMARY): recipes.lora_fc at the end of training -> people.
- ``oom_restart_split.json`` (OOM_RESTART_SPLIT): train.oom_restart, by the rank that ran out of memory where
  the ranks could not agree in-process -> the agent's restart (every rank), which removes it.
- ``profile/`` (PROFILE): torch.profiler traces ``rank<R>.steps<A>-<B>.trace.json``; Nsight
  reports ``nsys/<job>.rank<R>.nsys-rep`` (with their ``nsys stats`` CSVs) and
  ``ncu/<job>.rank<R>.ncu-rep``. observe.trace, launch.nsight -> observe.verdict, observe.nsys_stats.
- ``tensorboard/`` (TENSORBOARD): event files. track.tensorboard -> TensorBoard.
- ``tracking/`` (TRACKING): ``mlflow.json`` (MLFLOW_RUN, the run's MLflow run and experiment
  ids on each tracking server it reached): track.mlflow_client -> track.sync/registry, pipeline;
  ``registry.json`` (REGISTRY, the registered model version): track.registry -> pipeline
  register step.
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
:meth:`RunLayout.names`).

Report folder
-------------
What ``hpcpipe report DIR...`` writes (``ReportLayout(out)``): ``DIR/report/`` for one run, sweep
or study directory (each layout's REPORT), ``./report/`` for several, or ``--out``. Written by
report.run_report (report.plots_run for the run plots, report.study for the study plots).

- ``report.md`` (MARKDOWN), ``report.html`` (HTML): the report, the HTML one self-contained.
  -> people, pipeline report step (its output digest), track.artifacts.
- ``series.csv`` (SERIES): the tidy rows every plot is drawn from. report.series
  -> report.plots_run.plot_from_csv, track.artifacts, people.
- Run plots (RUN_PLOTS): ``loss.png`` (PLOT_LOSS), ``val_loss.png`` (PLOT_VAL_LOSS, several runs),
  ``throughput.png`` (PLOT_THROUGHPUT), ``mfu.png`` (PLOT_MFU), ``memory.png`` (PLOT_MEMORY),
  ``phases.png`` (PLOT_PHASES). -> the report, track.artifacts.
- A sweep's or scaling study's part (STUDY_PLOTS): ``study.md`` (STUDY_MARKDOWN),
  ``scaling_throughput.png`` (PLOT_SCALING_THROUGHPUT), ``scaling_efficiency.png``
  (PLOT_SCALING_EFFICIENCY), ``weak_time_per_epoch.png`` (PLOT_WEAK_EPOCH_TIME),
  ``sweep_throughput.png`` (PLOT_SWEEP_THROUGHPUT). report.study -> the report, people. With
  several studies, each study's part goes in a folder named after its directory.

HPO study directory
-------------------
``hpo.dir``, by default ``<run.out_dir>/hpo-<study>`` (``StudyLayout(plan.study_dir)``):

- ``study.json`` (RECORD): the study's name, its storage (never a password) and metric.
  hpo.study.write_record (hpo run, hpo launch) -> hpo.study.load_plan (every ``hpcpipe hpo``
  command given the directory, hpo worker), report.hpo_study (a study is recognised by it).
- ``base.yaml`` (BASE): the job every trial starts from. hpo.study.write_record
  -> hpo.study.load_plan.
- ``study.db`` (SQLITE): the study's storage when ``hpo.storage`` is unset; ``journal.log``
  (JOURNAL): when it is ``journal``. Optuna, opened by hpo.study -> the same.
- ``trials/`` (TRIALS): ``trial-<NNNN>/`` (TRIAL, trial_dir), one ordinary run directory per trial
  (a retry resumes in its original's). hpo.worker -> hpo results (run_dir column), report
  (the trials' runs compared), people.
- ``trials.csv`` (TRIALS_CSV): one row per trial. hpo.results.write_trials_csv (hpo run, hpo
  status) -> report.hpo_study, spreadsheets.
- ``plots/`` (PLOTS): Optuna's plots, ``<plot>.png`` (PLOT, plot). hpo.plots (hpo run, hpo plots)
  -> report.hpo_study.
- ``hpo.sbatch`` (SLURM_SCRIPT), ``slurm-<array>_<task>.out`` (SLURM_OUTPUT): the workers' job
  array. hpo.slurm (hpo launch slurm) -> Slurm, people.
- ``report/`` (REPORT): ``hpcpipe report STUDY_DIR`` (the report folder above).

Chaos results directory
-----------------------
The ``--out`` of ``hpcpipe chaos run`` (``ChaosLayout(out)``):

- ``run.json`` (RUN): what was run (scenario file, seed, planned trials, versions). chaos.runner
  -> chaos.runner (``--resume`` checks it), chaos.report.
- ``trials.jsonl`` (TRIALS): one row per finished trial, with the command that replays it.
  chaos.runner -> chaos.runner (``--resume`` skips them), chaos.report.
- ``shared/`` (SHARED): what the trials of a run reuse (prepared data, reference runs, checkpoint
  bytes). chaos.runner (creates it), chaos.jobs/saving/security -> the same.
- ``<scenario>/trial-<NNNN>/`` (TRIAL, trial_dir): a trial's working directory, removed when the
  trial recovered (unless ``--keep``); ``harness-error.txt`` (HARNESS_ERROR) in it when the
  harness itself failed the trial. chaos.runner and the chaos kinds -> people (the post-mortem).
- ``chaos.json`` (REPORT_JSON), ``chaos.md`` (REPORT_MARKDOWN), ``chaos-ttr.png`` (TTR_PLOT):
  the aggregated report. chaos.report (chaos run, chaos report) -> cli chaos, people.

Sweep directory
---------------
The ``--out`` of ``hpcpipe sweep``, or of ``hpcpipe launch slurm --grid`` (``SweepLayout(out)``):

- ``<job name>-<point>/``: each point's run directory (``sweep.point_slug``), holding
  ``sweep_point.json`` once finished. sweep (hpcpipe sweep), the array's tasks
  -> sweep (skip or collect), report (the points compared).
- ``sweep.csv`` (CSV): one row per point. sweep.run_sweep, sweep.collect_plan (hpcpipe sweep,
  launch slurm --grid, launch collect) -> report.study, ``hpcpipe scaling-law fit``, people.
- ``sweep_plan.json`` (PLAN): the points of a job array. sweep.write_plan (launch slurm --grid)
  -> sweep.collect_plan (``hpcpipe launch collect``).
- ``job.sbatch`` (SLURM_SCRIPT), ``slurm-<array>_<task>.out`` (SLURM_OUTPUT), ``slurm_job.json``
  (SLURM_JOB): the job array. launch.slurm, cli launch slurm -> Slurm, launch.slurm_jobs
  (``hpcpipe jobs``).
- ``report/`` (REPORT): ``hpcpipe report SWEEP_DIR`` (the report folder above).

This module imports only the standard library: every room may use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import ClassVar, overload


class Entry:
    """A path of a layout, one of its names below its root: ``config = Entry(CONFIG)`` makes
    ``RunLayout(run).config`` the path ``run / "config.yaml"``."""

    def __init__(self, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, layout: None, owner: type) -> Entry: ...
    @overload
    def __get__(self, layout: Layout, owner: type) -> Path: ...
    def __get__(self, layout: Layout | None, owner: type) -> Path | Entry:
        return self if layout is None else layout.root / self.name


@dataclass(frozen=True)
class Layout:
    """What every layout shares: its root, and which names it knows at the top of it."""

    root: Path

    # Every fixed top-level name; glob patterns for the computed ones; the names inside a folder,
    # for the folders whose contents the layout names; str.format templates of computed names.
    ENTRIES: ClassVar[tuple[str, ...]] = ()
    PATTERNS: ClassVar[tuple[str, ...]] = ()
    NESTED: ClassVar[dict[str, tuple[str, ...]]] = {}
    TEMPLATES: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def names(cls, entry: str) -> bool:
        """Whether ``entry`` (a name at the top of the directory) is one the layout names."""
        return entry in cls.ENTRIES or any(fnmatchcase(entry, p) for p in cls.PATTERNS)


@dataclass(frozen=True)
class ReportLayout(Layout):
    """The folder ``hpcpipe report`` writes: ``ReportLayout(out).series``."""

    MARKDOWN: ClassVar[str] = "report.md"
    HTML: ClassVar[str] = "report.html"
    SERIES: ClassVar[str] = "series.csv"
    PLOT_LOSS: ClassVar[str] = "loss.png"
    PLOT_VAL_LOSS: ClassVar[str] = "val_loss.png"  # several runs: validation loss overlaid
    PLOT_THROUGHPUT: ClassVar[str] = "throughput.png"
    PLOT_MFU: ClassVar[str] = "mfu.png"
    PLOT_MEMORY: ClassVar[str] = "memory.png"
    PLOT_PHASES: ClassVar[str] = "phases.png"
    STUDY_MARKDOWN: ClassVar[str] = "study.md"
    PLOT_SCALING_THROUGHPUT: ClassVar[str] = "scaling_throughput.png"
    PLOT_SCALING_EFFICIENCY: ClassVar[str] = "scaling_efficiency.png"
    PLOT_WEAK_EPOCH_TIME: ClassVar[str] = "weak_time_per_epoch.png"
    PLOT_SWEEP_THROUGHPUT: ClassVar[str] = "sweep_throughput.png"

    RUN_PLOTS: ClassVar[tuple[str, ...]] = (
        PLOT_LOSS, PLOT_VAL_LOSS, PLOT_THROUGHPUT, PLOT_MFU, PLOT_MEMORY, PLOT_PHASES,
    )  # fmt: skip
    STUDY_PLOTS: ClassVar[tuple[str, ...]] = (
        PLOT_SCALING_THROUGHPUT, PLOT_SCALING_EFFICIENCY, PLOT_WEAK_EPOCH_TIME, PLOT_SWEEP_THROUGHPUT,
    )  # fmt: skip
    ENTRIES: ClassVar[tuple[str, ...]] = (MARKDOWN, HTML, SERIES, *RUN_PLOTS, STUDY_MARKDOWN, *STUDY_PLOTS)

    markdown = Entry(MARKDOWN)
    html = Entry(HTML)
    series = Entry(SERIES)
    study_markdown = Entry(STUDY_MARKDOWN)


@dataclass(frozen=True)
class RunLayout(Layout):
    """The paths of one run directory: ``RunLayout(job.run_dir).metrics``."""

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
    FC_EVAL_TEST: ClassVar[str] = "eval-test"  # --split test, beside dev's
    FC_EVAL_BASE_TEST: ClassVar[str] = "eval-base-test"
    FC_EVAL_TEST_CONSTRAINED: ClassVar[str] = "eval-test-constrained"
    FC_EVAL_BASE_TEST_CONSTRAINED: ClassVar[str] = "eval-base-test-constrained"
    FC_EVAL_ALL: ClassVar[str] = "eval-all"  # --split all
    FC_EVAL_BASE_ALL: ClassVar[str] = "eval-base-all"
    FC_EVAL_ALL_CONSTRAINED: ClassVar[str] = "eval-all-constrained"
    FC_EVAL_BASE_ALL_CONSTRAINED: ClassVar[str] = "eval-base-all-constrained"
    REPORT: ClassVar[str] = "report"  # laid out by ReportLayout
    SUMMARY: ClassVar[str] = "summary.md"
    LOSS_CURVE: ClassVar[str] = "loss_curve.png"
    SAMPLE: ClassVar[str] = "sample.txt"
    DATA_REPORT: ClassVar[str] = "data_report.json"
    LORA_SUMMARY: ClassVar[str] = "lora_summary.json"
    OOM_RESTART_SPLIT: ClassVar[str] = "oom_restart_split.json"
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
    CALL_THRESHOLD: ClassVar[str] = "call_threshold.json"  # export/adapter/call_threshold.json
    DECLINE: ClassVar[str] = "decline.json"  # export/adapter/decline.json
    FC_EVAL_JSON: ClassVar[str] = "eval.json"  # eval/eval.json, eval-base/eval.json
    FC_EVAL_MARKDOWN: ClassVar[str] = "eval.md"  # eval/eval.md, eval-base/eval.md
    MLFLOW_RUN: ClassVar[str] = "mlflow.json"  # tracking/mlflow.json
    REGISTRY: ClassVar[str] = "registry.json"  # tracking/registry.json
    GOODPUT_JSON: ClassVar[str] = "goodput.json"  # plan/goodput.json
    GOODPUT_PLOT: ClassVar[str] = "goodput.png"  # plan/goodput.png

    # A split's evaluation folders: (adapter, base) free, then (adapter, base) with --constrain.
    FC_EVAL_SPLITS: ClassVar[dict[str, tuple[str, str, str, str]]] = {
        "dev": (FC_EVAL, FC_EVAL_BASE, FC_EVAL_CONSTRAINED, FC_EVAL_BASE_CONSTRAINED),
        "test": (FC_EVAL_TEST, FC_EVAL_BASE_TEST, FC_EVAL_TEST_CONSTRAINED, FC_EVAL_BASE_TEST_CONSTRAINED),
        "all": (FC_EVAL_ALL, FC_EVAL_BASE_ALL, FC_EVAL_ALL_CONSTRAINED, FC_EVAL_BASE_ALL_CONSTRAINED),
    }

    ENTRIES: ClassVar[tuple[str, ...]] = (
        CONFIG, LINEAGE, METRICS, METRICS_CSV, EVENTS, CHECKPOINTS, EXPORT, EVAL, FC_EVAL,
        FC_EVAL_BASE, FC_EVAL_CONSTRAINED, FC_EVAL_BASE_CONSTRAINED, FC_EVAL_TEST, FC_EVAL_BASE_TEST,
        FC_EVAL_TEST_CONSTRAINED, FC_EVAL_BASE_TEST_CONSTRAINED, FC_EVAL_ALL, FC_EVAL_BASE_ALL,
        FC_EVAL_ALL_CONSTRAINED, FC_EVAL_BASE_ALL_CONSTRAINED, REPORT, SUMMARY, LOSS_CURVE,
        SAMPLE, DATA_REPORT, LORA_SUMMARY, OOM_RESTART_SPLIT, PROFILE,
        TENSORBOARD, TRACKING, TRAIN_LOG, SWEEP_POINT, SLURM_SCRIPT, SLURM_JOB, K8S_MANIFEST, HELM_VALUES,
        KFP_PIPELINE, K8S_JOB, PLAN,
    )  # fmt: skip
    PATTERNS: ClassVar[tuple[str, ...]] = ("hang-rank*.txt", "slurm-*.out")
    TEMPLATES: ClassVar[tuple[str, ...]] = (HANG_DUMP, SLURM_OUTPUT)
    NESTED: ClassVar[dict[str, tuple[str, ...]]] = {
        EXPORT: (ADAPTER,),
        f"{EXPORT}/{ADAPTER}": (CALL_THRESHOLD, DECLINE),
        REPORT: ReportLayout.ENTRIES,
        **dict.fromkeys(sum(FC_EVAL_SPLITS.values(), ()), (FC_EVAL_JSON, FC_EVAL_MARKDOWN)),
        TRACKING: (MLFLOW_RUN, REGISTRY),
        PLAN: (GOODPUT_JSON, GOODPUT_PLOT),
    }

    # -- files -------------------------------------------------------------------------------------
    config = Entry(CONFIG)
    lineage = Entry(LINEAGE)
    metrics = Entry(METRICS)
    metrics_csv = Entry(METRICS_CSV)
    events = Entry(EVENTS)
    eval = Entry(EVAL)
    summary = Entry(SUMMARY)
    loss_curve = Entry(LOSS_CURVE)
    sample = Entry(SAMPLE)
    data_report = Entry(DATA_REPORT)
    lora_summary = Entry(LORA_SUMMARY)
    oom_restart_split = Entry(OOM_RESTART_SPLIT)
    train_log = Entry(TRAIN_LOG)
    sweep_point = Entry(SWEEP_POINT)
    slurm_script = Entry(SLURM_SCRIPT)
    slurm_job = Entry(SLURM_JOB)

    @property
    def k8s_manifest(self) -> Path:
        return self.root / self.K8S_MANIFEST

    helm_values = Entry(HELM_VALUES)
    kfp_pipeline = Entry(KFP_PIPELINE)

    @property
    def k8s_job(self) -> Path:
        return self.root / self.K8S_JOB

    def hang_dump(self, rank: int) -> Path:
        return self.root / self.HANG_DUMP.format(rank=rank)

    # -- folders and what the layout names inside them -----------------------------------------
    checkpoints = Entry(CHECKPOINTS)
    export = Entry(EXPORT)

    @property
    def adapter(self) -> Path:
        return self.export / self.ADAPTER

    @property
    def call_threshold(self) -> Path:
        return self.adapter / self.CALL_THRESHOLD

    @property
    def decline(self) -> Path:
        return self.adapter / self.DECLINE

    def export_dir(self, checkpoint_name: str, fmt: str) -> Path:
        """``export/<checkpoint>-<format>``: one checkpoint exported in one format."""
        return self.export / f"{checkpoint_name}-{fmt}"

    def fc_eval_dir(self, base: bool, constrained: bool = False, split: str = "dev") -> Path:
        """Function-calling evaluation of the base model (``eval-base``) or with the adapter
        (``eval``); decoded with ``--constrain``: ``eval-base-constrained``, ``eval-constrained``;
        on BFCL's ``split`` other than dev: its name after ``eval[-base]`` (``eval-test-constrained``)."""
        return self.root / self.FC_EVAL_SPLITS[split][2 * constrained + base]

    report = Entry(REPORT)

    @property
    def report_markdown(self) -> Path:
        return ReportLayout(self.report).markdown

    @property
    def report_html(self) -> Path:
        return ReportLayout(self.report).html

    profile = Entry(PROFILE)
    tensorboard = Entry(TENSORBOARD)
    tracking = Entry(TRACKING)

    @property
    def mlflow_run(self) -> Path:
        return self.tracking / self.MLFLOW_RUN

    @property
    def registry(self) -> Path:
        return self.tracking / self.REGISTRY

    plan = Entry(PLAN)


@dataclass(frozen=True)
class StudyLayout(Layout):
    """The paths of one HPO study directory: ``StudyLayout(plan.study_dir).record``."""

    RECORD: ClassVar[str] = "study.json"
    BASE: ClassVar[str] = "base.yaml"
    SQLITE: ClassVar[str] = "study.db"
    JOURNAL: ClassVar[str] = "journal.log"
    TRIALS: ClassVar[str] = "trials"
    TRIALS_CSV: ClassVar[str] = "trials.csv"
    PLOTS: ClassVar[str] = "plots"
    SLURM_SCRIPT: ClassVar[str] = "hpo.sbatch"
    REPORT: ClassVar[str] = RunLayout.REPORT
    # Computed names: a trial's run directory in trials/, a plot in plots/, a Slurm array's output.
    TRIAL: ClassVar[str] = "trial-{number:04d}"
    PLOT: ClassVar[str] = "{name}.png"
    SLURM_OUTPUT: ClassVar[str] = "slurm-%A_%a.out"

    ENTRIES: ClassVar[tuple[str, ...]] = (
        RECORD, BASE, SQLITE, JOURNAL, TRIALS, TRIALS_CSV, PLOTS, SLURM_SCRIPT, REPORT,
    )  # fmt: skip
    PATTERNS: ClassVar[tuple[str, ...]] = ("slurm-*_*.out",)
    TEMPLATES: ClassVar[tuple[str, ...]] = (TRIAL, PLOT, SLURM_OUTPUT)

    record = Entry(RECORD)
    base = Entry(BASE)
    sqlite = Entry(SQLITE)
    journal = Entry(JOURNAL)
    trials = Entry(TRIALS)

    def trial_dir(self, number: int) -> Path:
        return self.trials / self.TRIAL.format(number=number)

    trials_csv = Entry(TRIALS_CSV)
    plots = Entry(PLOTS)

    def plot(self, name: str) -> Path:
        """``plots/<name>.png``: one of Optuna's plots (``plot_<name>``)."""
        return self.plots / self.PLOT.format(name=name)

    slurm_script = Entry(SLURM_SCRIPT)
    slurm_output = Entry(SLURM_OUTPUT)


@dataclass(frozen=True)
class ChaosLayout(Layout):
    """The paths of one chaos results directory: ``ChaosLayout(plan.out).trials``."""

    RUN: ClassVar[str] = "run.json"
    TRIALS: ClassVar[str] = "trials.jsonl"
    SHARED: ClassVar[str] = "shared"
    REPORT_JSON: ClassVar[str] = "chaos.json"
    REPORT_MARKDOWN: ClassVar[str] = "chaos.md"
    TTR_PLOT: ClassVar[str] = "chaos-ttr.png"
    HARNESS_ERROR: ClassVar[str] = "harness-error.txt"  # <scenario>/trial-<NNNN>/harness-error.txt
    # Computed name: a trial's working directory, in a folder named after its scenario.
    TRIAL: ClassVar[str] = "trial-{trial:04d}"

    ENTRIES: ClassVar[tuple[str, ...]] = (RUN, TRIALS, SHARED, REPORT_JSON, REPORT_MARKDOWN, TTR_PLOT)
    TEMPLATES: ClassVar[tuple[str, ...]] = (TRIAL,)
    NESTED: ClassVar[dict[str, tuple[str, ...]]] = {TRIAL: (HARNESS_ERROR,)}  # in <scenario>/

    run = Entry(RUN)
    trials = Entry(TRIALS)
    shared = Entry(SHARED)

    def trial_dir(self, scenario: str, trial: int) -> Path:
        return self.root / scenario / self.TRIAL.format(trial=trial)

    def harness_error(self, scenario: str, trial: int) -> Path:
        return self.trial_dir(scenario, trial) / self.HARNESS_ERROR

    report_json = Entry(REPORT_JSON)
    report_markdown = Entry(REPORT_MARKDOWN)
    ttr_plot = Entry(TTR_PLOT)


@dataclass(frozen=True)
class SweepLayout(Layout):
    """The paths of one sweep directory: ``SweepLayout(out_dir).csv``."""

    CSV: ClassVar[str] = "sweep.csv"
    PLAN: ClassVar[str] = "sweep_plan.json"
    SLURM_SCRIPT: ClassVar[str] = RunLayout.SLURM_SCRIPT
    SLURM_JOB: ClassVar[str] = RunLayout.SLURM_JOB
    REPORT: ClassVar[str] = RunLayout.REPORT
    # Computed name: a job array's output, one file per task.
    SLURM_OUTPUT: ClassVar[str] = "slurm-%A_%a.out"

    ENTRIES: ClassVar[tuple[str, ...]] = (CSV, PLAN, SLURM_SCRIPT, SLURM_JOB, REPORT)
    PATTERNS: ClassVar[tuple[str, ...]] = ("slurm-*_*.out",)
    TEMPLATES: ClassVar[tuple[str, ...]] = (SLURM_OUTPUT,)

    csv = Entry(CSV)
    plan = Entry(PLAN)
    slurm_script = Entry(SLURM_SCRIPT)
    slurm_job = Entry(SLURM_JOB)
    slurm_output = Entry(SLURM_OUTPUT)
