"""Run a recipe's properties in order and report each: passed, failed (with why, and the
traceback when the recipe's own code raised) or skipped (it does not apply, and why)."""

from __future__ import annotations

import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcpipe.config import JobConfig
from hpcpipe.config.loading import job_source_path
from hpcpipe.errors import UserError, one_line
from hpcpipe.recipecheck import loader, training
from hpcpipe.recipecheck import work as workdir
from hpcpipe.recipecheck.job import check_job, given_job
from hpcpipe.recipes.base import Recipe
from hpcpipe.recipes.registry import recipe_class

# Relative difference allowed between the per-step losses of 1 process and of 2 DDP or FSDP2
# ranks (fp32: the ranks sum gradients in another order). Resuming is held to 0: bit for bit.
RTOL = 1e-4

PROPERTIES = (
    "loader-repeatable",
    "loader-resumable",
    "loader-world-sizes",
    "checkpoint-round-trip",
    "loss-is-a-mean",
    "bad-args-refused",
    "parity-ddp",
    "parity-fsdp",
    "resume-after-kill",
    "export-loads",
    "eval-metrics",
)
# The properties whose runs are 2-rank `hpcpipe train` jobs (forked from the check's zygote).
MULTI_RANK = {"parity-ddp", "parity-fsdp", "resume-after-kill"}


def worker_imports(ref: str) -> tuple[str, ...]:
    """What recipe ``ref``'s workers import: its module and ``worker_imports`` (what the zygote
    its runs fork from preloads, ``launch/zygote.py``)."""
    cls = recipe_class(ref)
    return (cls.__module__, *cls.worker_imports)


@dataclass
class PropertyResult:
    name: str
    passed: bool
    skipped: bool
    detail: str
    seconds: float
    traceback: str | None = None  # when the recipe's code (or hpcpipe's) raised


@dataclass
class CheckReport:
    recipe: str
    passed: bool
    seconds: float
    rtol: float
    results: list[PropertyResult] = field(default_factory=list)
    kept: str | None = None  # the temporary work directory, kept for a failure's runs and logs


class _Runs:
    """The check's ``hpcpipe train`` runs, each started once, when a property first needs it."""

    def __init__(self, work: Path, preload: tuple[str, ...] = ()) -> None:
        self.work = work
        self.preload = preload  # the recipe's module and worker_imports
        self._done: dict[str, Path | Exception] = {}

    def get(self, name: str) -> Path:
        if name not in self._done:
            try:
                self._done[name] = self._start(name)
            except Exception as exc:  # every property that needs this run fails with its reason
                self._done[name] = exc
        found = self._done[name]
        if isinstance(found, Exception):
            raise training.RunFailed(f"the {name} run failed: {found}") from found
        return found

    def _start(self, name: str) -> Path:
        if name == "single":
            return training.train_here(self.work, name)
        if name == "killed":  # 2 DDP ranks, rank 1 SIGKILLed: the agent restarts the group
            env = training.killed_env(self.work)
            return training.train(self.work, name, 2, "ddp", env=env, restarts=1, preload=self.preload)
        return training.train(self.work, name, 2, name, preload=self.preload)  # "ddp" or "fsdp"


def _properties(recipe: Recipe, job: JobConfig, runs: _Runs, rtol: float) -> dict[str, Callable[[], str]]:
    work = runs.work

    invariant = recipe.world_size_invariant_order
    order_note = "the recipe's data order depends on the world size (world_size_invariant_order)"

    def parity_ddp() -> str:
        if not invariant:  # 1 process sees other batches than 2 ranks: nothing to compare
            raise training.Skip(f"{order_note}; parity-fsdp compares 2 FSDP2 ranks with 2 DDP ranks")
        return training.check_parity(runs.get("single"), runs.get("ddp"), "2 DDP ranks", rtol)

    def parity_fsdp() -> str:
        if not invariant:
            return training.check_parity(
                runs.get("ddp"), runs.get("fsdp"), "2 FSDP2 ranks", rtol, "2 DDP ranks"
            )
        return training.check_parity(runs.get("single"), runs.get("fsdp"), "2 FSDP2 ranks", rtol)

    return {
        "loader-repeatable": lambda: loader.check_repeatable(recipe, job),
        "loader-resumable": lambda: loader.check_resumable(recipe, job),
        "loader-world-sizes": lambda: loader.check_world_sizes(recipe, job),  # runs whatever the order
        "checkpoint-round-trip": lambda: training.check_round_trip(recipe, job, work),
        "loss-is-a-mean": lambda: training.check_loss_is_a_mean(recipe, job),
        "bad-args-refused": lambda: training.check_bad_args(job),
        "parity-ddp": parity_ddp,
        "parity-fsdp": parity_fsdp,
        "resume-after-kill": lambda: training.check_resume(recipe, runs.get("ddp"), runs.get("killed")),
        "export-loads": lambda: training.check_exports(recipe, runs.get("single"), work),
        "eval-metrics": lambda: training.check_eval_metrics(recipe, runs.get("single")),
    }


def check_recipe(
    ref: str,
    config: str | None = None,
    sets: list[str] | tuple[str, ...] = (),
    work: str | Path | None = None,
    only: tuple[str, ...] = (),
    say: Callable[[str], None] | None = None,
    rtol: float = RTOL,
) -> CheckReport:
    """Every property (or ``only`` those) of recipe ``ref``, checked with ``config`` or its own
    test-size job, in ``work`` (a temporary directory when None, removed after unless a property
    failed: then kept for the runs and logs the report names, ``CheckReport.kept``; a ``work``
    that a previous check filled is emptied first, one holding anything else refused, as is a
    ``config`` inside it). Bad input (an unknown recipe, a bad config, data it cannot read, such
    a ``work``) raises UserError before any property runs; all but the data before ``work`` is
    emptied (a recipe's ``check_overrides`` may write its test data there)."""
    started = time.perf_counter()
    recipe_class(ref)  # ConfigError when ref names no usable recipe
    # The user's job is read before --work is emptied: a bad one left the previous check's runs
    # gone, and a --config in --work was removed before it was read.
    given = given_job(ref, config, list(sets))
    temporary = work is None
    root = Path(tempfile.mkdtemp(prefix="hpcpipe-check-")) if temporary else Path(work or ".").absolute()
    if not temporary and config is not None:
        workdir.refuse_config_inside(root, job_source_path(config))
    workdir.claim(root)
    results: list[PropertyResult] = []
    passed = keep = False
    try:
        job = check_job(ref, config, list(sets), root, given)
        recipe = recipe_class(ref).from_job(job)
        recipe.prepare(progress=False)
        checks = _properties(recipe, job, _Runs(root, worker_imports(ref)), rtol)
        for name in only or PROPERTIES:
            if say is not None:
                say(name)
            results.append(_run(name, checks[name]))
        passed = all(r.passed or r.skipped for r in results)
        keep = temporary and not passed  # the failed runs' directories and logs, which the report names
    finally:
        if temporary and not keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            workdir.record(root)
    return CheckReport(ref, passed, time.perf_counter() - started, rtol, results, str(root) if keep else None)


def _run(name: str, check: Callable[[], str]) -> PropertyResult:
    started = time.perf_counter()
    try:
        detail = check()
    except training.Skip as exc:
        return PropertyResult(name, False, True, str(exc), time.perf_counter() - started)
    except AssertionError as exc:  # the property does not hold: the detail says how
        return PropertyResult(name, False, False, one_line(str(exc)), time.perf_counter() - started)
    except training.RunFailed as exc:  # with the traceback of what the recipe raised in this process
        cause = exc.__cause__
        trace = None
        if cause is not None and not isinstance(cause, training.RunFailed | UserError):
            trace = "".join(traceback.format_exception(cause))
        return PropertyResult(name, False, False, one_line(str(exc)), time.perf_counter() - started, trace)
    except Exception as exc:  # the recipe's own code raised (torch's RuntimeErrors too): its traceback
        trace = "".join(traceback.format_exception(exc))
        detail = one_line(f"{type(exc).__name__}: {exc}")
        return PropertyResult(name, False, False, detail, time.perf_counter() - started, trace)
    return PropertyResult(name, True, False, detail, time.perf_counter() - started)


def report_dict(report: CheckReport) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(report)
