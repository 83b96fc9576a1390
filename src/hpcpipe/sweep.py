"""Grid sweeps: every combination of ``--grid key=[values]`` is an ordinary run directory.

``hpcpipe sweep JOB --grid 'parallel.bucket_cap_mb=[25,50,100]' --grid 'train.precision=[fp32,bf16]'``
(or a sweep YAML with a ``grid:`` mapping) trains the points one after another under
``<out>/<job name>-<point>/`` and writes ``<out>/sweep.csv``: one row per point, rebuilt from the
run directories each time (``hpcpipe.observe.run_summary``). A point whose run finished with the
same config is skipped on re-run, so an interrupted sweep continues where it stopped. A point
that fails is recorded as failed and the sweep goes on; one stopped by a preemption, Ctrl-C or
its study (the preemption code, 130, 76) stops the sweep with that code.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import itertools
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpcpipe.config import JobConfig, load_config
from hpcpipe.config.checkpoint import own_checkpoint_dirs
from hpcpipe.config.launch import check_plain_env
from hpcpipe.errors import ConfigError, UserError
from hpcpipe.layout import RunLayout, SweepLayout
from hpcpipe.recipes.registry import RecipeImportError
from hpcpipe.yamlfile import dump_yaml, load_yaml_text, read_yaml_file

DONE_FILE = RunLayout.SWEEP_POINT  # in each point's run directory
SWEEP_COLUMNS = ("point", "status")


@dataclass(frozen=True)
class SweepPoint:
    overrides: tuple[str, ...]  # key=value, one per grid axis
    job: JobConfig

    @property
    def run_dir(self) -> Path:
        return self.job.run_dir


def parse_grid_option(item: str) -> tuple[str, list[Any]]:
    """``'train.precision=[fp32,bf16]'`` -> (key, values); UserError naming the option otherwise."""
    key, sep, text = item.partition("=")
    try:
        values = load_yaml_text(text) if sep else None
    except yaml.YAMLError:
        values = None
    if not key.strip() or not isinstance(values, list) or not values:
        raise UserError(f"--grid {item!r}: expected section.key=[value, value, ...]")
    return key.strip(), values


def load_sweep_file(path: Path) -> dict[str, list[Any]]:
    """A sweep YAML: ``grid: {section.key: [values]}``; UserError naming the file otherwise."""
    try:
        data = read_yaml_file(path, "sweep file")
    except OSError as exc:
        raise UserError(f"{path}: cannot read sweep file ({exc.strerror or exc})") from None
    grid = data.get("grid") if isinstance(data, dict) else None
    if not isinstance(grid, dict) or not grid:
        raise UserError(f"{path}: a sweep file needs a 'grid:' mapping of section.key: [values]")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise UserError(f"{path}: grid.{key} must be a non-empty list")
    return {str(k): v for k, v in grid.items()}


def sweep_dir_of(job: JobConfig) -> Path:
    """The sweep's directory when none is given: beside the job's runs, as ``hpcpipe hpo``
    places its study (``runs/`` alone ignored a job's ``run.out_dir``)."""
    return Path(job.run.out_dir) / f"sweep-{job.run.name}"


def plan_points(source: str, sets: list[str], grid: dict[str, list[Any]], out_dir: Path) -> list[SweepPoint]:
    """Every combination, validated up front (a bad key or value fails before anything trains)."""
    base = load_config(source, sets)
    points: dict[Path, SweepPoint] = {}
    for values in itertools.product(*grid.values()):
        overrides = tuple(f"{key}={_text(value)}" for key, value in zip(grid, values, strict=True))
        name = f"{base.run.name}-{point_slug(overrides)}"
        extra = [f"run.name={name}", f"run.out_dir={out_dir}"]
        try:
            job = load_config(source, [*sets, *overrides, *extra])
            scoped = own_checkpoint_dirs(job.checkpoint, name, out_dir)
            own = [f"{key}={value}" for key, value in scoped.items()]
            job = load_config(source, [*sets, *overrides, *extra, *own])
        except ConfigError as exc:
            raise UserError(f"sweep point {', '.join(overrides)}: {exc}") from None
        try:  # a grid value may add one: in folder names and sweep.csv too
            check_plain_env(job.launch)
        except ConfigError as exc:  # the point's keys alone: its values hold the secret
            keys = ", ".join(item.partition("=")[0] for item in overrides)
            raise UserError(f"sweep point {keys}: {exc}") from None
        if job.run_dir in points:  # 0.003 and 0.0030 are one value once parsed
            raise UserError(f"sweep: {', '.join(overrides)} is one point twice (the grid repeats a value)")
        points[job.run_dir] = SweepPoint(overrides, job)
    return list(points.values())


def point_slug(overrides: tuple[str, ...]) -> str:
    """``('train.precision=bf16', 'parallel.bucket_cap_mb=25')`` -> ``precision_bf16-bucket_cap_mb_25``."""
    parts = []
    for item in overrides:
        key, _, value = item.partition("=")
        parts.append(f"{key.rsplit('.', 1)[-1]}_{value}")
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))


def is_done(point: SweepPoint) -> bool:
    """Finished before with exactly this config (the marker holds its hash)."""
    try:
        marker = json.loads(RunLayout(point.run_dir).sweep_point.read_text())
    except (OSError, ValueError):
        return False
    return bool(marker.get("config_hash") == point.job.config_hash())


def run_sweep(
    points: list[SweepPoint],
    out_dir: Path,
    train: Callable[[JobConfig], Path],
    report: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train every point not done yet, then write ``sweep.csv``; returns rows and counts."""
    status: dict[Path, str] = {}
    for index, point in enumerate(points, start=1):
        label = f"[{index}/{len(points)}] {', '.join(point.overrides)}"
        if is_done(point):
            status[point.run_dir] = "skipped"
            report(f"{label}: done before, skipped")
            continue
        earlier = _set_aside_other_config(point)
        if earlier is not None:
            report(f"{label}: its run directory holds another config; moved to {earlier}")
        report(f"{label}: training -> {point.run_dir}")
        try:
            train(point.job)
        except (UserError, RuntimeError) as exc:
            if (code := getattr(exc, "exit_code", None)) in _stopping_codes(point.job):
                report(f"{label}: stopped (exit code {code}); run the sweep again to resume it")
                raise
            status[point.run_dir] = "failed"
            report(f"{label}: failed ({exc})")
            continue
        mark_done(point.job)
        status[point.run_dir] = "trained"
    rows = [sweep_row(point, status[point.run_dir]) for point in points]
    path = write_sweep_csv(rows, SweepLayout(out_dir).csv)
    counts = {s: sum(1 for v in status.values() if v == s) for s in ("trained", "skipped", "failed")}
    return {"csv": str(path), "rows": rows, **counts}


def _stopping_codes(job: JobConfig) -> set[int]:
    """Worker exits that stop the whole sweep, not only the point: the scheduler's preemption
    (resubmit the sweep), a person's Ctrl-C, a study's prune. Recorded as failures, the sweep
    trained every remaining point after them and exited 1."""
    from hpcpipe.train.preempt import INTERRUPT_EXIT_CODE
    from hpcpipe.train.trial import PRUNED_EXIT_CODE

    return {job.fault.preempt_exit_code, INTERRUPT_EXIT_CODE, PRUNED_EXIT_CODE}


def _set_aside_other_config(point: SweepPoint) -> Path | None:
    """Move the point's run directory aside when it holds a run of another config (the sweep ran
    again with another base config): the point resumed that run's final checkpoint, trained
    nothing and reported its results under the new config. An interrupted run of the same config
    stays, to resume."""
    config = RunLayout(point.run_dir).config
    if not config.is_file():
        return None
    try:
        same = load_config(config).config_hash() == point.job.config_hash()
    except (ConfigError, RecipeImportError):  # its recipe is not the point's, which imports
        same = False
    if same:
        return None
    # Its own checkpoint directories outside the run (own_checkpoint_dirs) go with it: left in
    # place, the new config resumed their final checkpoint all the same.
    own = [Path(d) for d in (point.job.checkpoint.dir, point.job.checkpoint.durable_dir) if d]
    for directory in (d for d in own if d.name == point.run_dir.name and d.exists()):
        directory.rename(_free_name(directory))
    aside = _free_name(point.run_dir)
    point.run_dir.rename(aside)
    return aside


def _free_name(directory: Path) -> Path:
    """``<name>.earlier-N`` with the first N not taken."""
    for n in itertools.count(1):
        aside = directory.with_name(f"{directory.name}.earlier-{n}")
        if not aside.exists():
            return aside
    raise AssertionError("unreachable")


def mark_done(job: JobConfig) -> None:
    """The marker ``is_done`` reads: this run finished with exactly this config."""
    RunLayout(job.run_dir).sweep_point.write_text(json.dumps({"config_hash": job.config_hash()}) + "\n")


def write_plan(points: list[SweepPoint], out_dir: Path) -> Path:
    """``<out>/sweep_plan.json``: the points of a sweep whose runs happen elsewhere (a job array)."""
    plan = [{"overrides": list(p.overrides), "config": str(RunLayout(p.run_dir).config)} for p in points]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = SweepLayout(out_dir).plan
    path.write_text(json.dumps(plan, indent=1) + "\n")
    return path


def collect_plan(out_dir: Path) -> Path:
    """Rebuild ``<out>/sweep.csv`` from the planned points' run directories (finished or pending).

    Each array task marks its point done, then collects. Two tasks that end together would each
    read the points and write the file: the one that read first and wrote last would leave the
    other's point "pending" (seen on Slurm, 2026-12-02). So a collector holds an exclusive lock on
    the plan from its read of the points to its write: whoever writes last read after every mark
    made before it took the lock, and a later mark collects again after it."""
    path = SweepLayout(out_dir).plan
    with contextlib.ExitStack() as stack:
        try:
            held = stack.enter_context(path.open("r+"))  # POSIX locks (NFS too) need it writable
            fcntl.lockf(held, fcntl.LOCK_EX)  # released when the file closes
            plan = json.loads(held.read())
        except (OSError, ValueError) as exc:
            raise UserError(f"{path}: cannot read the sweep plan ({exc})") from None
        return _collect(plan, SweepLayout(out_dir).csv)


def _collect(plan: list[dict[str, Any]], csv_path: Path) -> Path:
    rows = []
    for entry in plan:
        point = SweepPoint(tuple(entry["overrides"]), load_config(entry["config"]))
        rows.append(sweep_row(point, "trained" if is_done(point) else "pending"))
    return write_sweep_csv(rows, csv_path)


def sweep_row(point: SweepPoint, status: str) -> dict[str, Any]:
    from hpcpipe.observe.run_summary import summarize_run_dir

    row: dict[str, Any] = {"point": " ".join(point.overrides), "status": status}
    if status != "failed" and RunLayout(point.run_dir).metrics.is_file():
        row.update(summarize_run_dir(point.run_dir))
    else:
        row["run_id"] = point.run_dir.name
    return row


def write_sweep_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    from hpcpipe.observe.run_summary import RUN_COLUMNS

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # array tasks may finish together
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=(*SWEEP_COLUMNS, *RUN_COLUMNS), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)
    return path


def _text(value: Any) -> str:
    """A grid value as --set text (YAML scalars stay as written: 25, bf16, true; null stays null,
    it was the string "None")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if load_yaml_text(text) == value:
        return text
    return dump_yaml(value, default_flow_style=True, width=2**16).strip().removesuffix("...").strip()
