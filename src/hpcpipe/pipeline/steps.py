"""The seven steps of ``hpcpipe run``: plain functions that read and write the run directory.

Each has a ``run`` (does the work, or raises NotApplicable) and an ``outputs`` (hashes of what it
left on disk, cheap enough to check on every run). ``STEPS`` is the DAG, in order.
"""

from __future__ import annotations

import json
from pathlib import Path

from hpcpipe.config.job import TRAINING_KEYS, WAITING_KEYS
from hpcpipe.layout import RunLayout
from hpcpipe.pipeline.engine import DONE, NotApplicable, Step, StepContext, file_sha256, tree_sha256

# -- prepare: the dataset (tokens, images, conversations), keyed by its inputs' hash ---------------


def prepare(ctx: StepContext) -> None:
    from hpcpipe.launch.job import prepare_inputs

    prepare_inputs(ctx.job)


def prepare_outputs(ctx: StepContext) -> dict[str, str]:
    from hpcpipe.recipes import build_recipe

    digest = build_recipe(ctx.job).dataset_hash()
    return {"dataset": digest} if digest else {}


# -- stage: a verified copy on the node-local cache (data.cache_dir) -----------------------------


def stage(ctx: StepContext) -> None:
    from hpcpipe.data.stage import stage as stage_dataset
    from hpcpipe.launch.job import stage_source

    if ctx.job.data.cache_dir is None:
        raise NotApplicable("data.cache_dir is null: the data are read where they are")
    if ctx.on == "k8s":
        raise NotApplicable("each training pod stages its own node's disk (its stage init step)")
    source = stage_source(ctx.job)
    if source is None:
        raise NotApplicable(f"run.recipe {ctx.job.run.recipe}: its data have no file manifest to stage by")
    staged = stage_dataset(source, Path(ctx.job.data.cache_dir))
    staged.release()
    ctx.say(f"     staged {staged.path} ({staged.size_bytes / 1e6:.1f} MB, copied: {staged.copied})")


def stage_outputs(ctx: StepContext) -> dict[str, str]:
    from hpcpipe.launch.job import stage_source

    source = None if ctx.job.data.cache_dir is None else stage_source(ctx.job)
    if source is None:
        return {}
    key = source.key  # the dataset manifest's hash names the cache entry
    return {"staged": key} if (Path(str(ctx.job.data.cache_dir)) / key).is_dir() else {}


# -- train: the workers (resumes from the newest verified checkpoint) -----------------------------


def train(ctx: StepContext) -> None:
    from hpcpipe.launch.job import run_job

    _nothing_left_to_train_with_new_settings(ctx)
    if ctx.on == "k8s":
        from hpcpipe.launch.k8s_train import train_on_k8s

        train_on_k8s(ctx.job, ctx.api, ctx.say)
    else:
        run_job(ctx.job, max_restarts=ctx.max_restarts)


def _nothing_left_to_train_with_new_settings(ctx: StepContext) -> None:
    """A training key or the dataset changed after the run trained to its last step: resumed, it
    would train nothing, and the lineage would record the new settings (or data) for a model
    trained with the old, which evaluate and export would then skip as unchanged."""
    from hpcpipe.launch.finished import finished_at, refuse_new_settings
    from hpcpipe.observe.lineage import read_lineage

    records = read_lineage(ctx.run_dir).get("steps") or {}
    record = records.get("train") or {}
    reached = finished_at(ctx.job)
    if record.get("status") != DONE or reached is None:
        return
    # prepare has just run: its record holds the dataset this invocation would train on
    trained_on = ((record.get("inputs") or {}).get("upstream") or {}).get("prepare")
    new_data = trained_on != (records.get("prepare") or {}).get("outputs")
    before = (record.get("inputs") or {}).get("config") or {}
    refuse_new_settings(ctx.job, before, reached, ["a new dataset from prepare"] if new_data else [])


def newest_checkpoint(ctx: StepContext) -> Path | None:
    """The run's final checkpoint, the one a resume would load: the newest committed of either
    tier (only the fast tier's: with it lost, export found nothing and the lineage no checkpoint)."""
    from hpcpipe.checkpoint.resume_choice import newest_committed, resume_tiers
    from hpcpipe.checkpoint.tiers import fast_root

    fast = fast_root(ctx.job.checkpoint.dir, ctx.run_dir)
    newest = newest_committed(resume_tiers(ctx.job.checkpoint, fast))
    return newest[1] if newest else None


def train_outputs(ctx: StepContext) -> dict[str, str]:
    ckpt = newest_checkpoint(ctx)
    found = {"metrics": file_sha256(RunLayout(ctx.run_dir).metrics)}
    if ckpt is not None:
        from hpcpipe.checkpoint.manifest import MANIFEST_NAME

        found["checkpoint"] = f"{ckpt.name}:{file_sha256(ckpt / MANIFEST_NAME)}"
    return {k: v for k, v in found.items() if v}


# -- evaluate: the held-out metrics of the final model -------------------------------------------


def evaluate(ctx: StepContext) -> None:
    """``eval.json``: the trainer's evaluation at the final step (the held-out split)."""
    from hpcpipe.observe.metrics import read_metrics

    evals = [r for r in read_metrics(ctx.run_dir) if "val_loss" in r]
    if not evals:
        raise NotApplicable("no evaluation rows in metrics.jsonl (train.eval_every, train.eval_batches)")
    last = evals[-1]
    metrics = {k: v for k, v in last.items() if k not in ("step", "time") and isinstance(v, int | float)}
    ckpt = newest_checkpoint(ctx)
    result = {"step": last["step"], "metrics": metrics, "checkpoint": ckpt.name if ckpt else None}
    RunLayout(ctx.run_dir).eval.write_text(json.dumps(result, indent=2) + "\n")
    ctx.say("     " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()) + f" at step {last['step']}")


def evaluate_outputs(ctx: StepContext) -> dict[str, str]:
    digest = file_sha256(RunLayout(ctx.run_dir).eval)
    return {"eval": digest} if digest else {}


# -- export: the final checkpoint for inference (hf / safetensors / adapter / merged) -------------


def export_format(ctx: StepContext) -> str:
    from hpcpipe.recipes.registry import recipe_class

    fmt = ctx.job.pipeline.export_format
    formats = recipe_class(ctx.job.run.recipe).export_formats
    if fmt == "auto" and not formats:
        raise NotApplicable(f"recipe {ctx.job.run.recipe!r} has no export format")
    return formats[0] if fmt == "auto" else fmt


def export_dir(ctx: StepContext, ckpt: Path, fmt: str) -> Path:
    return RunLayout(ctx.run_dir).export_dir(ckpt.name, fmt)


def export(ctx: StepContext) -> None:
    from hpcpipe.recipes.export import export_checkpoint

    fmt = export_format(ctx)
    ckpt = newest_checkpoint(ctx)
    if ckpt is None:
        raise NotApplicable("no committed checkpoint (set checkpoint.every_steps)")
    # The run's own config: a checkpoint outside the run directory (checkpoint.dir, the durable
    # tier) has no config.yaml two levels up.
    written = export_checkpoint(ckpt, fmt, export_dir(ctx, ckpt, fmt), RunLayout(ctx.run_dir).config)
    ctx.say(f"     exported {ckpt.name} -> {written}")


def export_outputs(ctx: StepContext) -> dict[str, str]:
    ckpt = newest_checkpoint(ctx)
    try:
        fmt = export_format(ctx)
    except NotApplicable:
        return {}
    digest = tree_sha256(export_dir(ctx, ckpt, fmt)) if ckpt is not None else None
    return {"export": digest} if digest else {}


# -- register: a model version in the MLflow registry, with lineage tags and aliases -------------


def register(ctx: StepContext) -> None:
    from hpcpipe.track.mlflow_client import make_client, resolve_uri, server_errors
    from hpcpipe.track.registry import register_run
    from hpcpipe.track.sync import sync_run

    cfg = ctx.job.pipeline
    if cfg.register_as is None:
        raise NotApplicable("pipeline.register_as is null")
    if ctx.job.observe.mlflow is None:
        raise NotApplicable("pipeline.register_as needs observe.mlflow (the registry is MLflow's)")
    fmt = export_format(ctx)
    ckpt = newest_checkpoint(ctx)
    export = export_dir(ctx, ckpt, fmt) if ckpt is not None else None
    with server_errors("register step"):  # an unreachable server: one line, and the step resumes
        sync_run(ctx.run_dir)  # the MLflow run holds every value and artifact before registering
        uri = resolve_uri(ctx.job.observe.mlflow.tracking_uri)  # its run, not the first server's
        made = register_run(make_client(uri), ctx.run_dir, cfg.register_as, cfg.aliases, export, uri)
    aliases = f" ({', '.join(made.aliases)})" if made.aliases else ""
    ctx.say(f"     registered {made.name} version {made.version}{aliases}")


def register_outputs(ctx: StepContext) -> dict[str, str]:
    digest = file_sha256(RunLayout(ctx.run_dir).registry)
    return {"registry": digest} if digest and ctx.job.pipeline.register_as else {}


# -- report: summary.md, the loss curve, report.md + report.html ---------------------------------


def report(ctx: StepContext) -> None:
    from hpcpipe.report.loss_curve import plot_loss_curve
    from hpcpipe.report.run_report import build_report
    from hpcpipe.report.summary import write_summary

    if not ctx.job.pipeline.report:
        raise NotApplicable("pipeline.report is false")
    plot_loss_curve(ctx.run_dir)
    ctx.results["summary"] = write_summary(ctx.run_dir)
    build_report([ctx.run_dir], RunLayout(ctx.run_dir).report)
    if ctx.job.observe.mlflow is not None:
        _upload_report(ctx)


def _upload_report(ctx: StepContext) -> None:
    """The report's files go to the run's MLflow run too (a failure is a warning, not an error)."""
    from hpcpipe.errors import UserError
    from hpcpipe.track.artifacts import log_run_artifacts
    from hpcpipe.track.mlflow_client import make_client, recorded_run, request_limits, resolve_uri, scrub

    assert ctx.job.observe.mlflow is not None
    try:
        uri = resolve_uri(ctx.job.observe.mlflow.tracking_uri)
        run_id = recorded_run(ctx.run_dir, uri).get("run_id")  # the run on this server
    except UserError as exc:  # a damaged record: the report is written, its upload says why not
        ctx.say(f"     report not uploaded to MLflow ({exc})")
        return
    if not run_id:
        return
    try:
        client = make_client(uri)
        with request_limits(10, retries=0):
            client.get_run(run_id)  # a hung server: named after 10 s, before uploads that wait longer
            log_run_artifacts(client, run_id, ctx.run_dir)
    except Exception as exc:
        ctx.say(f"     report not uploaded to MLflow ({scrub(str(exc))[:200]}); `hpcpipe track sync` retries")


def report_outputs(ctx: StepContext) -> dict[str, str]:
    """Every file the step writes: one of them deleted is written again (report.md alone was
    checked; summary.md, the loss curve and report.html stayed missing)."""
    layout = RunLayout(ctx.run_dir)
    files = {
        "report": layout.report_markdown,
        "report_html": layout.report_html,
        "summary": layout.summary,
        "loss_curve": layout.loss_curve,
    }
    digests = {name: file_sha256(path) for name, path in files.items()}
    return {name: digest for name, digest in digests.items() if digest}


# The final checkpoint (checkpoint.every_steps) is what export and evaluation read: a run trained
# without one is trained again for it. The launcher's timeouts never change what is trained.
TRAIN_STEP = Step(
    "train",
    (*TRAINING_KEYS, "checkpoint.every_steps"),
    ("prepare",),
    train,
    train_outputs,
    "the workers; resumes from the newest verified checkpoint",
    ignores=WAITING_KEYS,
)

# Where a version is registered (the server, the experiment of its run; null when observe.mlflow
# is): the sink's transport settings (queue_size, close_timeout_s) registered a new version.
REGISTRY_KEYS = ("observe.mlflow.tracking_uri", "observe.mlflow.experiment")

STEPS = [
    Step("prepare", ("run.recipe", "recipe", "data", "model", "lora"), (), prepare, prepare_outputs,
         "dataset preparation (tokens, images, conversations), keyed by its inputs"),
    Step("stage", ("data.cache_dir",), ("prepare",), stage, stage_outputs,
         "a verified copy on the node-local cache (data.cache_dir)"),
    TRAIN_STEP,
    Step("evaluate", (), ("train",), evaluate, evaluate_outputs,
         "eval.json: held-out metrics of the final model"),
    Step("export", ("pipeline.export_format",), ("train",), export, export_outputs,
         "the final checkpoint as a Hugging Face model or LoRA adapter"),
    Step("register", ("pipeline.register_as", "pipeline.aliases", *REGISTRY_KEYS), ("export", "evaluate"),
         register, register_outputs, "a model version in the MLflow registry"),
    Step("report", ("pipeline.report",), ("train", "evaluate", "export", "register"), report, report_outputs,
         "summary.md, loss curve, report.md and report.html"),
]  # fmt: skip
