"""Run declared scenarios trial by trial; one JSON line per finished trial in ``trials.jsonl``.

A trial's fault placement comes from ``trial_rng(seed, scenario, trial)`` alone, so the
``replay`` line each row carries reruns exactly that trial. A trial's directory is removed when
it recovered (``keep`` keeps them all) and kept when it did not, for the post-mortem.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcpipe.chaos.kinds import KINDS
from hpcpipe.chaos.scenario import Scenario, TrialContext, TrialResult, trial_rng
from hpcpipe.errors import UserError
from hpcpipe.layout import ChaosLayout

KindRunner = Callable[[TrialContext], TrialResult]


def resolve(kind: str) -> KindRunner:
    """The function that runs one trial of ``kind`` (imported now, not when the file is read)."""
    from hpcpipe.chaos import harness, saving, security, training

    runners: dict[str, KindRunner] = {
        "always_pass": harness.always_pass,
        "must_fail": harness.must_fail,
        "kill_rank": training.kill_rank,
        "always_fail": training.always_fail,
        "oom": training.oom,
        "stall": training.stall,
        "slow_rank": training.slow_rank,
        "lost_node": training.lost_node,
        "kill_during_save": saving.kill_during_save,
        "sigterm_during_save": saving.sigterm_during_save,
        "corrupt_checkpoint": saving.corrupt_checkpoint,
        "disk_full": saving.disk_full,
        "fuzz_config": security.fuzz_config,
        "malicious_pickle": security.malicious_pickle,
        "secrets": security.secrets_stay_hidden,
        "loopback_only": security.loopback_only,
    }
    assert set(runners) == set(KINDS), "kinds.py and the runner name different kinds"
    return runners[kind]


@dataclass(frozen=True)
class ChaosPlan:
    """What ``hpcpipe chaos run`` was asked for."""

    file: Path
    scenarios: list[Scenario]
    trials: int  # per scenario, unless the scenario says otherwise
    seed: int
    out: Path
    only_trial: int | None = None  # replay one trial index
    keep: bool = False
    resume: bool = False  # continue a run in ``out``: skip the trials it already recorded
    cli: Any = None  # the hpcpipe CLI's click command, for kinds that run it in-process (fuzz_config)
    skipped: dict[str, str] = field(default_factory=dict)  # scenario name -> why it cannot run here

    def trial_indices(self, scenario: Scenario) -> list[int]:
        if self.only_trial is not None:
            return [self.only_trial]
        return list(range(scenario.trials or self.trials))

    def replay(self, scenario: Scenario, trial: int) -> str:
        # Its own --out: the default one may hold results already, which a new run refuses.
        out = f"{self.out}/replay-{scenario.name}-{trial}"
        which = f"--seed {self.seed} --only {scenario.name} --trial {trial}"
        return f"hpcpipe chaos run {self.file} {which} --out {out}"


def start_output(plan: ChaosPlan) -> set[tuple[str, int]]:
    """Create ``out`` with ``run.json``; the (scenario, trial) pairs already recorded there
    (only with ``resume``: otherwise a directory holding trials is refused)."""
    import torch

    from hpcpipe import __version__

    done: set[tuple[str, int]] = set()
    before: dict[str, Any] = {}  # the run.json of the run resumed
    layout = ChaosLayout(plan.out)
    if layout.trials.exists():
        if not plan.resume:
            raise UserError(
                f"{plan.out} already holds chaos results; give a new --out, or --resume to continue it"
            )
        done, before = _recorded(plan)
    try:
        plan.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {plan.out}: cannot create it ({exc.strerror or exc})") from None
    run = {
        "file": str(plan.file),
        "seed": plan.seed,
        "trials": plan.trials,
        "torch": torch.__version__,
        "cores": os.cpu_count(),
        "hpcpipe": __version__,
        "started": float(before.get("started") or time.time()),
        **_merged_plan(plan, before),
    }
    layout.run.write_text(json.dumps(run, indent=2) + "\n")
    return done


def _merged_plan(plan: ChaosPlan, before: dict[str, Any]) -> dict[str, Any]:
    """run.json's ``scenarios`` and ``skipped``: this plan's, merged into those of the run it
    resumes (``before``), which the report reads what never ran from. A scenario keeps every trial
    index either run planned (a resume with fewer --trials or another --only runs less, and the
    trials it leaves out still count as missing); one this resume did not select keeps its plan."""
    from hpcpipe.chaos.report import planned_indices

    kinds: dict[str, Any] = {}
    indices: dict[str, set[int]] = {}
    for name, entry in _listed(before, "scenarios").items():
        if (found := planned_indices(entry)) is not None:
            kinds[name], indices[name] = entry.get("kind"), found
    for s in plan.scenarios:
        kinds[s.name] = s.kind
        indices[s.name] = indices.get(s.name, set()) | set(plan.trial_indices(s))
    skipped = {**{n: e.get("why") for n, e in _listed(before, "skipped").items()}, **plan.skipped}
    return {
        "scenarios": [_planned_entry(name, kinds[name], indices[name]) for name in indices],
        "skipped": [{"name": n, "why": why} for n, why in skipped.items() if n not in indices],
    }


def _listed(run: dict[str, Any], key: str) -> dict[str, dict[str, Any]]:
    """run.json's list under ``key`` by name; entries that are not named objects are left out."""
    listed = run.get(key)
    entries = listed if isinstance(listed, list) else []
    return {e["name"]: e for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)}


def _planned_entry(name: str, kind: Any, indices: set[int]) -> dict[str, Any]:
    entry = {"name": name, "kind": kind, "trials": len(indices)}
    if indices != set(range(len(indices))):  # not 0 .. trials - 1: a replay's --trial, say
        entry["indices"] = sorted(indices)
    return entry


def _recorded(plan: ChaosPlan) -> tuple[set[tuple[str, int]], dict[str, Any]]:
    """What ``plan.out`` holds and its run.json, after checking the file and seed match."""
    layout = ChaosLayout(plan.out)
    try:
        run = json.loads(layout.run.read_text())
    except (OSError, ValueError):
        run = None
    if not isinstance(run, dict):
        raise UserError(f"{layout.run}: missing or unreadable; cannot --resume this directory")
    if (run.get("file"), run.get("seed")) != (str(plan.file), plan.seed):
        was = f"{run.get('file')} --seed {run.get('seed')}"
        raise UserError(f"--resume: {plan.out} was run with {was}; give the same scenarios and --seed")
    done = set()
    for line in layout.trials.read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            row = json.loads(line)
            done.add((str(row["scenario"]), int(row["trial"])))
    return done, run


def run_trial(plan: ChaosPlan, scenario: Scenario, trial: int) -> dict[str, Any]:
    """One trial, start to verdict; the row ``trials.jsonl`` gets (a harness error is a failure)."""
    layout = ChaosLayout(plan.out)
    work = layout.trial_dir(scenario.name, trial)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ctx = TrialContext(
        scenario,
        trial,
        plan.seed,
        trial_rng(plan.seed, scenario.name, trial),
        work,
        layout.shared,
        cli=plan.cli,
    )
    ctx.shared.mkdir(exist_ok=True)
    started, error = time.time(), None
    try:
        result = resolve(scenario.kind)(ctx)
    except UserError:
        raise  # a bad scenario (a wrong param): stop the run, one line
    except Exception as exc:  # the harness failed this trial: recorded, the run goes on
        layout.harness_error(scenario.name, trial).write_text(traceback.format_exc())
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        result = TrialResult(False, error)
    row = {
        "scenario": scenario.name,
        "kind": scenario.kind,
        "trial": trial,
        "seed": plan.seed,
        "replay": plan.replay(scenario, trial),
        "started": started,
        "duration_s": round(time.time() - started, 3),
        **result.as_row(),
        "error": error,
    }
    if result.recovered and not plan.keep:
        shutil.rmtree(work, ignore_errors=True)
    return row


def worker_imports(scenarios: list[Scenario]) -> tuple[str, ...]:
    """What the scenarios' jobs import in their workers (their recipes' modules and worker_imports:
    what the zygote the trials' runs fork from preloads); a job that does not load is left to its
    trial to report."""
    from hpcpipe.config import load_config
    from hpcpipe.recipes.registry import recipe_class

    found: dict[str, None] = {}
    for scenario in scenarios:
        with contextlib.suppress(Exception):
            recipe = recipe_class(load_config(scenario.job).run.recipe)
            found.update(dict.fromkeys((recipe.__module__, *recipe.worker_imports)))
    return tuple(found)


def run_plan(plan: ChaosPlan, progress: bool = True) -> list[dict[str, Any]]:
    """Every trial of every scenario, in file order; the rows, as also appended to trials.jsonl."""
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    done = start_output(plan)
    todo = [(s, t) for s in plan.scenarios for t in plan.trial_indices(s) if (s.name, t) not in done]
    rows: list[dict[str, Any]] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with (
        Progress(*columns, disable=not progress, transient=True) as bar,
        ChaosLayout(plan.out).trials.open("a") as log,
    ):
        task = bar.add_task("chaos", total=len(todo))
        for scenario, trial in todo:
            bar.update(task, description=f"{scenario.name} #{trial}")
            row = run_trial(plan, scenario, trial)
            log.write(json.dumps(row) + "\n")
            log.flush()
            rows.append(row)
            if not row["recovered"]:
                failed = f"[red]FAILED[/red] {scenario.name} #{trial}: {escape(row['detail'])}"
                bar.console.print(failed, highlight=False)
            bar.advance(task)
    skipped = f" ({len(done)} recorded before, skipped)" if done else ""
    print(
        f"chaos: {sum(r['recovered'] for r in rows)}/{len(rows)} trials recovered{skipped}", file=sys.stderr
    )
    return rows
