"""The job a recipe is checked with: its own test-size job, shrunk to a few steps whose batches
split over 1 and 2 ranks, checkpointing every other step, logging every step."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hpcpipe.config import JobConfig, apply_values, load_config
from hpcpipe.config.loading import load_values
from hpcpipe.recipes.registry import recipe_class
from hpcpipe.yamlfile import dump_yaml

STEPS = 6  # enough to kill at KILL_STEP and resume from the checkpoint two steps before
CHECKPOINT_EVERY = 2
KILL_STEP = 4


def given_job(ref: str, config: str | None, sets: list[str]) -> JobConfig:
    """``config`` (a preset or YAML, with ``sets``) or else the recipe's ``check_preset`` (none:
    the defaults) with ``sets``: the user's input, validated without writing anything."""
    cls = recipe_class(ref)
    # run.recipe first: the --set recipe.<key> values are the recipe's keys, and the job trains
    # the recipe checked whatever recipe a given config names.
    values = [f"run.recipe={ref}", *sets]
    source = config or cls.check_preset
    return load_config(source, values) if source else load_values({}, values, origin="--set")


def check_job(
    ref: str, config: str | None, sets: list[str], work: Path, given: JobConfig | None = None
) -> JobConfig:
    """``given_job``'s job (``given``, when the caller loaded it before emptying ``work``), with
    the recipe's ``check_overrides`` unless a config was given; then the check's own settings.
    Written to ``work/job.yaml``."""
    job = given or given_job(ref, config, sets)
    if config is None:
        job = apply_values(job, recipe_class(ref).check_overrides(work))
    micro = job.train.micro_batch_size
    per_step = 2 * micro  # the global batch must split over 2 ranks
    global_batch = max(per_step, -(-job.train.global_batch_size // per_step) * per_step)
    job = apply_values(job, _check_settings(work, global_batch))
    (work / "job.yaml").write_text(job.to_yaml())
    return job


def _check_settings(work: Path, global_batch: int) -> dict[str, Any]:
    return {
        "run.name": "check",
        "run.out_dir": str(work / "runs"),
        "train.steps": STEPS,
        "train.epochs": None,
        "train.global_batch_size": global_batch,
        "train.eval_every": 0,
        "train.compile": False,
        # Unclipped: 1 process and 2 ranks sum the gradient norm's squares in another order, and
        # the clip factor's rounding (4e-7 at step 1 on ResNet-18) grew to 5e-4 by step 5 on an
        # AVX2 machine (AMD EPYC, 2026-12-02). The parity properties compare the norms instead.
        "train.grad_clip": 0.0,
        "checkpoint.every_steps": CHECKPOINT_EVERY,
        "checkpoint.keep_last": STEPS,
        "checkpoint.async": False,
        "checkpoint.dir": None,
        "observe.log_every": 1,
        "observe.progress": False,
        "parallel.nproc": 1,
        "parallel.strategy": "auto",
        # The same intra-op threads in every run: kernels split their reductions by thread count,
        # and on ResNet-18 a step-1 difference of 1e-7 from that alone grew to 0.6% by step 4.
        "parallel.threads_per_rank": max(1, (os.cpu_count() or 2) // 2),
        "fault.hang_timeout_s": 0,
        "pipeline.report": False,
    }


def job_yaml(job: JobConfig) -> str:
    return dump_yaml(job.to_dict(), sort_keys=False)
