"""The report of a ``hpcpipe chaos run``: ``chaos.json``, ``chaos.md`` and ``chaos-ttr.png``.

Everything is read back from the run's directory (``run.json`` and ``trials.jsonl``), never from
the runner's memory, so a report can be redrawn for a run that was killed half way: its torn last
line is skipped and the scenarios it never reached show 0 of their planned trials.

Usage::

    report = write_report(Path("runs/chaos-50"))
    print(report.markdown_path.read_text())
    if not report.ok:
        ...  # some trial did not recover or lost data (FAIL), or planned trials never ran (INCOMPLETE)
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from hpcpipe.chaos.phases import LABELS, OTHER, PHASES
from hpcpipe.errors import UserError, one_line
from hpcpipe.fsutil import read_json_object
from hpcpipe.layout import ChaosLayout

NONE_MARK = "—"  # a table cell with no number (no trial measured a TTR)
LOG_SPREAD = 20.0  # max/min TTR from which the plot's x axis turns logarithmic


@dataclass(frozen=True)
class Failure:
    """A trial that did not recover, with the command that reruns exactly it."""

    trial: int
    seed: int | None
    replay: str
    detail: str
    error: str | None = None  # set when the harness itself failed the trial (timeout, exception)


@dataclass(frozen=True)
class ScenarioRow:
    """One scenario's trials, aggregated. TTR and duration figures are seconds."""

    name: str
    kind: str
    trials: int  # finished (rows in trials.jsonl)
    planned: int | None  # from run.json; None when run.json is missing or does not list it
    missing: int  # planned trial indices with no row (rows of other indices fill none of them)
    recovered: int
    failed: int
    lost: int  # summed over trials: must be 0
    ttr_median_s: float | None
    ttr_max_s: float | None
    ttr_p90_s: float | None
    duration_median_s: float | None
    failures: list[Failure] = field(default_factory=list)
    ttrs_s: list[float] = field(default_factory=list)  # every measured TTR, for the plot
    # The TTR's phases (chaos/phases.py), over the trials that measured each: median and max.
    phase_trials: int = 0  # trials whose row has phases
    phase_median_s: dict[str, float] = field(default_factory=dict)
    phase_max_s: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.lost == 0

    @property
    def complete(self) -> bool:
        """Every planned trial index has a row. Without a plan (no run.json) the rows are all we know."""
        return self.planned is None or self.missing == 0

    @property
    def ran(self) -> int:
        """The planned trials that have a row (all the rows without a plan)."""
        return self.trials if self.planned is None else self.planned - self.missing

    def as_json(self) -> dict[str, Any]:
        row = asdict(self)
        del row["ttrs_s"]  # the raw values stay in trials.jsonl
        return {**row, "complete": self.complete}


@dataclass(frozen=True)
class ChaosReport:
    """What :func:`write_report` wrote, and the numbers it wrote."""

    json_path: Path
    markdown_path: Path
    plot_path: Path | None  # None when no trial measured a TTR; plot_skipped says why
    plot_skipped: str | None
    rows: list[ScenarioRow]
    # trials, planned, missing, complete (a bool), recovered, failed, lost, unreadable_lines
    total: dict[str, int]

    @property
    def verdict(self) -> str:
        return verdict(self.total)

    @property
    def ok(self) -> bool:
        """Every planned trial finished, recovered and lost no data."""
        return self.verdict == "PASS"


def write_report(out_dir: Path) -> ChaosReport:
    """Aggregate ``out_dir/trials.jsonl`` per scenario; write chaos.json, chaos.md, chaos-ttr.png."""
    trials_path = _trials_path(out_dir)
    layout = ChaosLayout(out_dir)
    run = read_json_object(layout.run)  # tolerated missing: derive what we can
    trials, unreadable = read_trials(trials_path)
    rows = aggregate(run, trials)
    total = _total(rows, unreadable)
    json_path = layout.report_json
    payload = {"run": run, "scenarios": [r.as_json() for r in rows], "total": total}
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    plot_path, plot_skipped = _plot_or_reason(rows, layout.ttr_plot)
    markdown_path = layout.report_markdown
    markdown_path.write_text(render_markdown(run, trials, rows, total, plot_path))
    return ChaosReport(json_path, markdown_path, plot_path, plot_skipped, rows, total)


def _trials_path(out_dir: Path) -> Path:
    """``out_dir/trials.jsonl``, or a one-line UserError that says what to run first."""
    hint = f"run `hpcpipe chaos run SCENARIOS.yaml --out {one_line(str(out_dir))}` first"
    if not out_dir.is_dir():
        what = "is not a directory" if out_dir.exists() else "does not exist"
        raise UserError(f"chaos results {one_line(str(out_dir))} {what}; {hint}")
    path = ChaosLayout(out_dir).trials
    if not path.is_file():
        raise UserError(f"{one_line(str(path))} not found: no chaos trial has finished there; {hint}")
    return path


def read_trials(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The trial rows of ``trials.jsonl`` and how many lines were unreadable.

    A run killed mid-write leaves a torn last line; it is counted and skipped, not fatal.
    """
    rows: list[dict[str, Any]] = []
    unreadable = 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            unreadable += 1
            continue
        if isinstance(row, dict) and isinstance(row.get("scenario"), str):
            rows.append(row)
        else:
            unreadable += 1
    return rows, unreadable


def aggregate(run: dict[str, Any], trials: list[dict[str, Any]]) -> list[ScenarioRow]:
    """One row per scenario: run.json's file order, then scenarios found only in trials.jsonl."""
    planned = {s["name"]: s for s in run.get("scenarios", []) if isinstance(s, dict) and "name" in s}
    names = list(dict.fromkeys([*planned, *(t["scenario"] for t in trials)]))
    return [
        _scenario_row(name, planned.get(name, {}), [t for t in trials if t["scenario"] == name])
        for name in names
    ]


def _scenario_row(name: str, plan: dict[str, Any], trials: list[dict[str, Any]]) -> ScenarioRow:
    ttrs = [x for x in (_number(t.get("ttr_s")) for t in trials) if x is not None]
    durations = [x for x in (_number(t.get("duration_s")) for t in trials) if x is not None]
    failed = [t for t in trials if t.get("recovered") is not True]
    kinds = [t["kind"] for t in trials if isinstance(t.get("kind"), str)]
    planned = planned_indices(plan)
    ran = {t["trial"] for t in trials if _is_int(t.get("trial"))}
    phased = [t["phases"] for t in trials if isinstance(t.get("phases"), dict)]
    by_phase = {
        name: values
        for name in (*PHASES, OTHER)
        if (values := [x for x in (_number(p.get(name)) for p in phased) if x is not None])
    }
    return ScenarioRow(
        name=name,
        kind=str(plan.get("kind") or (kinds[0] if kinds else "?")),
        trials=len(trials),
        planned=None if planned is None else len(planned),
        missing=0 if planned is None else len(planned - ran),
        recovered=len(trials) - len(failed),
        failed=len(failed),
        lost=sum(int(_number(t.get("lost")) or 0) for t in trials),
        ttr_median_s=_rounded(statistics.median(ttrs)) if ttrs else None,
        ttr_max_s=_rounded(max(ttrs)) if ttrs else None,
        ttr_p90_s=_rounded(p90(ttrs)) if ttrs else None,
        duration_median_s=_rounded(statistics.median(durations)) if durations else None,
        failures=[_failure(t) for t in failed],
        ttrs_s=ttrs,
        phase_trials=len(phased),
        phase_median_s={name: _rounded(statistics.median(v)) for name, v in by_phase.items()},
        phase_max_s={name: _rounded(max(v)) for name, v in by_phase.items()},
    )


def planned_indices(entry: dict[str, Any]) -> set[int] | None:
    """The trial indices a scenario of run.json plans: its ``indices`` where listed (a replay of
    one ``--trial``), else 0 .. ``trials`` - 1; None where it gives neither."""
    indices = entry.get("indices")
    if isinstance(indices, list) and all(_is_int(i) for i in indices):
        return set(indices)
    trials = entry.get("trials")
    return set(range(trials)) if _is_int(trials) else None


def _is_int(value: Any) -> TypeGuard[int]:
    # A trial index or count: an int >= 0 (JSON's true is an int to Python).
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def p90(values: list[float]) -> float:
    """The 90th percentile, interpolated between the closest ranks (numpy's default)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def _failure(trial: dict[str, Any]) -> Failure:
    error = trial.get("error")
    detail = str(trial.get("detail") or error or "no detail recorded")
    seed = trial.get("seed")
    index = trial.get("trial")
    return Failure(
        trial=index if isinstance(index, int) else -1,
        seed=seed if isinstance(seed, int) else None,
        replay=one_line(str(trial.get("replay") or "")),
        detail=one_line(detail),
        error=one_line(str(error)) if error else None,
    )


def _number(value: Any) -> float | None:
    """A finite number from a JSON value; None for null, NaN, bools and strings."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _rounded(value: float) -> float:
    return round(value, 3)  # the runner records durations to the millisecond


def _total(rows: list[ScenarioRow], unreadable: int) -> dict[str, int]:
    return {
        "trials": sum(r.trials for r in rows),
        "planned": sum(r.trials if r.planned is None else r.planned for r in rows),
        "missing": sum(r.missing for r in rows),
        "complete": all(r.complete for r in rows),
        "recovered": sum(r.recovered for r in rows),
        "failed": sum(r.failed for r in rows),
        "lost": sum(r.lost for r in rows),
        "unreadable_lines": unreadable,
    }


# --- markdown ------------------------------------------------------------------------------------

TABLE_HEADER = (
    "| scenario | kind | trials | recovered | lost data | median TTR (s) | max TTR (s) |\n"
    "|---|---|---:|---:|---:|---:|---:|"
)


def render_markdown(
    run: dict[str, Any],
    trials: list[dict[str, Any]],
    rows: list[ScenarioRow],
    total: dict[str, int],
    plot_path: Path | None,
) -> str:
    """chaos.md: the title, the environment line, the table, a summary and the failures."""
    lines = ["# Chaos report", "", _environment_line(run, trials), "", TABLE_HEADER]
    lines += [_table_row(r) for r in rows]
    lines += ["", _summary_line(total, rows)]
    lines += _skipped_lines(run)
    lines += _phase_table([r for r in rows if r.phase_trials])
    if total["unreadable_lines"]:
        lines.append(
            f"\n{total['unreadable_lines']} unreadable line(s) of trials.jsonl skipped "
            "(a run killed mid-write leaves a torn last line)."
        )
    if plot_path is not None:
        lines += ["", f"![time to recover per scenario]({plot_path.name})"]
    lines += ["", "## Failures", "", *_failure_lines(rows)]
    return "\n".join(lines) + "\n"


def _environment_line(run: dict[str, Any], trials: list[dict[str, Any]]) -> str:
    seeds = sorted({t["seed"] for t in trials if isinstance(t.get("seed"), int)})
    seed = run.get("seed", seeds[0] if len(seeds) == 1 else None)
    starts = [x for x in (_number(t.get("started")) for t in trials) if x is not None]
    started = _number(run.get("started")) or (min(starts) if starts else None)
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)) if started else "date unknown"
    parts = [
        f"torch {run.get('torch', 'unknown')}",
        f"{run.get('cores', 'unknown')} cores",
        f"seed {seed if seed is not None else 'unknown'}",
        date,
    ]
    if run.get("file"):
        parts.append(f"scenarios `{one_line(str(run['file']))}`")
    return " · ".join(parts)


def _table_row(row: ScenarioRow) -> str:
    # A killed run shows planned trials finished of planned; a complete one just the count.
    whole = row.complete and row.planned in (None, row.trials)
    trials = str(row.trials) if whole else f"{row.ran}/{row.planned}"
    name = escape_cell(row.name) + ("" if row.ok else " ✗")
    cells = [
        name,
        escape_cell(row.kind),
        trials,
        f"{row.recovered}/{row.trials}",
        str(row.lost),
        _seconds(row.ttr_median_s),
        _seconds(row.ttr_max_s),
    ]
    return "| " + " | ".join(cells) + " |"


PHASE_NOTE = (
    "Phases (`hpcpipe/chaos/phases.py`), from the run's own timestamps: detection (fault → the "
    "agent sees a failed worker), teardown (→ every old worker gone), spawn + import (→ the new "
    "workers run trainer code), rendezvous (the agent's round and `init_process_group`), setup "
    "(recipe, barriers, model, DDP, optimizer, loader), restore (choose, verify, load the "
    "checkpoint), first step (→ the first step logged). other: time across milestones that were "
    "not recorded (a recovery by a new `hpcpipe train`, or a restart with no checkpoint to restore). "
    "Per trial the phases add up to its TTR; medians do not add up."
)


def _phase_table(rows: list[ScenarioRow]) -> list[str]:
    """The TTR by phase: median / max per phase, one row per scenario that measured phases."""
    if not rows:
        return []
    names = (*PHASES, OTHER)
    lines = [
        "",
        "## Time to recover by phase",
        "",
        "Seconds, median / max over the trials that measured each phase.",
        "",
        "| scenario | trials | " + " | ".join(LABELS[n] for n in names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    for row in rows:
        cells = [escape_cell(row.name), str(row.phase_trials)]
        for name in names:
            median, top = row.phase_median_s.get(name), row.phase_max_s.get(name)
            cells.append(NONE_MARK if median is None or top is None else f"{median:.2f} / {top:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, "", PHASE_NOTE]


def _skipped_lines(run: dict[str, Any]) -> list[str]:
    """The scenarios of the file this host could not run: a PASS covers the others only."""
    skipped = [s for s in run.get("skipped", []) if isinstance(s, dict) and "name" in s]
    if not skipped:
        return []
    names = ", ".join(
        f"{escape_cell(str(s['name']))} ({escape_cell(str(s.get('why', '')))})" for s in skipped
    )
    return ["", f"Not run here, so not covered by this verdict: {names}."]


def verdict(total: dict[str, int]) -> str:
    """FAIL (a trial did not recover or lost data), else INCOMPLETE (planned trials have no row:
    a run killed half way; what did not run cannot pass), else PASS."""
    if total["failed"] or total["lost"]:
        return "FAIL"
    return "PASS" if total["complete"] else "INCOMPLETE"


def _summary_line(total: dict[str, int], rows: list[ScenarioRow]) -> str:
    line = (
        f"**{verdict(total)}**: {total['recovered']}/{total['trials']} trials recovered, "
        f"{total['lost']} lost (✗ marks a scenario with a failed trial or lost data)."
    )
    short = [f"{escape_cell(r.name)} {r.ran}/{r.planned}" for r in rows if not r.complete]
    if short:
        line += (
            f" {total['missing']} of {total['planned']} planned trials never ran ({', '.join(short)}): "
            "`hpcpipe chaos run` with the same scenarios, `--trials`, `--seed` and `--out`, and "
            "`--resume`, runs them."
        )
    return line


def _failure_lines(rows: list[ScenarioRow]) -> list[str]:
    lines = []
    for row in rows:
        for f in row.failures:
            lines.append(f"- **{escape_cell(row.name)}** trial {f.trial}: {escape_cell(f.detail)}")
            lines.append(f"  `{f.replay}`")
    return lines or ["none"]


def escape_cell(text: str) -> str:
    """``text`` safe inside a markdown table cell: one line, ``|`` escaped."""
    return one_line(text).replace("|", "\\|")


def _seconds(value: float | None) -> str:
    return NONE_MARK if value is None else f"{value:.2f}"  # restarts take well under a second


# --- plot ----------------------------------------------------------------------------------------


def _plot_or_reason(rows: list[ScenarioRow], path: Path) -> tuple[Path | None, str | None]:
    measured = [r for r in rows if r.ttrs_s]
    if not measured:
        path.unlink(missing_ok=True)  # a stale plot from an earlier report would mislead
        return None, "no trial measured a time to recover"
    return plot_ttr(measured, path), None


def plot_ttr(rows: list[ScenarioRow], path: Path) -> Path:
    """Every trial's TTR as a dot, one row per scenario: range as a line, median as a tick; x in s.
    Beside it, where trials measured phases, each scenario's median phases as a stacked bar."""
    from hpcpipe.report.plots_bench import _figure, _save

    phased = [r for r in rows if r.phase_trials]
    fig, axes = _figure(ncols=2 if phased else 1)
    ax = axes[0]
    fig.set_size_inches(7.5 * len(axes), 1.5 + 0.5 * len(rows) + (0.8 if phased else 0.0))
    values = [r.ttrs_s for r in rows]
    positions = list(range(len(rows), 0, -1))  # first scenario on top, as in the table
    jitter = random.Random(0)  # fixed: the same run draws the same picture
    for pos, ttrs in zip(positions, values, strict=True):
        # Drawn by hand rather than with boxplot(): its orientation argument changed in matplotlib 3.10.
        ax.hlines(pos, min(ttrs), max(ttrs), color="gray", linewidth=1, zorder=1)
        ax.scatter(ttrs, [pos + jitter.uniform(-0.15, 0.15) for _ in ttrs], s=14, alpha=0.6, zorder=2)
        ax.scatter([statistics.median(ttrs)], [pos], marker="|", s=400, color="black", zorder=3)
    ax.set_yticks(positions, [r.name for r in rows])
    everything = [x for ttrs in values for x in ttrs]
    if min(everything) > 0 and max(everything) / min(everything) >= LOG_SPREAD:
        ax.set_xscale("log")
    ax.set_xlabel("time to recover (s)")
    ax.set_title("chaos: time to recover per trial")
    ax.grid(alpha=0.3, axis="x", which="both")
    if phased:
        _plot_phases(axes[1], phased)
    return _save(fig, path)


def _plot_phases(ax: Any, rows: list[ScenarioRow]) -> None:
    """Each scenario's median phases, stacked left to right in the order they happen."""
    positions = list(range(len(rows), 0, -1))
    left = [0.0] * len(rows)
    for name in (*PHASES, OTHER):
        widths = [r.phase_median_s.get(name, 0.0) for r in rows]
        if any(widths):
            ax.barh(positions, widths, left=left, height=0.5, label=LABELS[name])
            left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_yticks(positions, [r.name for r in rows])
    ax.set_xlabel("median seconds per phase")
    ax.set_title("time to recover by phase (medians)")
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, frameon=False)
    ax.grid(alpha=0.3, axis="x")
