"""The costs a run directory recorded: save, durable copy, restore, restart and step times.

Every value is the median over the run's events (``events.jsonl``, see ``checkpoint/store.py``
for the checkpoint events and ``launch/worker.py`` for ``group_start``) and metrics rows:

- fast-tier save: ``blocking_s`` of ``checkpoint_staged`` when the run saved asynchronously
  (training waits only for the copy to CPU memory), else ``write_s`` of ``checkpoint_committed``;
- durable save: ``copy_s`` of ``checkpoint_durable_copied`` (hpcpipe copies in the background; the
  plan charges it as if training waited, which is what a save straight to that tier costs);
- restore: ``load_s`` of ``checkpoint_restored``, per tier;
- restart: for each restart of the worker group by the elastic agent (``group_start`` with
  ``restart_count`` > 0), from the failure to the next attempt's first trained step, less that
  attempt's restore and the steps it trained. The failure is when the agent saw it
  (``failure_seen`` of its ``agent_restart`` event, ``launch/agent_timeline.py``: at most one
  monitor interval late, so this errs a little low), else the failed attempt's last record (an
  event or a metrics row). A resumed run rewrites ``metrics.jsonl`` from its checkpoint on, so the
  failed attempt's last rows may be gone and that fallback can include lost work: it errs high;
- step time: ``step_time_s`` of the metrics rows (the median skips the steps that saved).

hpcpipe's current intervals come from the run's ``config.yaml`` (``checkpoint.every_steps``, and
the durable tier's schedule) times the step time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout
from hpcpipe.observe.metrics import read_events, read_metrics

FAST, DURABLE = "fast", "durable"


@dataclass(frozen=True)
class Timing:
    """A cost in seconds and where it came from (measured, given or defaulted), for the reader."""

    seconds: float
    source: str


@dataclass(frozen=True)
class RunTimes:
    """What one run directory measured; None (or a missing key) where it recorded nothing."""

    run_dir: Path
    save: dict[str, Timing] = field(default_factory=dict)  # per tier
    restore: dict[str, Timing] = field(default_factory=dict)  # per tier
    restart: Timing | None = None
    step_time_s: float | None = None
    intervals: dict[str, float] = field(default_factory=dict)  # hpcpipe's τ per tier, seconds
    notes: tuple[str, ...] = ()


def read_run_times(run_dir: Path) -> RunTimes:
    """Medians of the run's recorded costs (module doc)."""
    events = [e for e in read_events(run_dir) if isinstance(e.get("time"), int | float)]
    rows = [r for r in read_metrics(run_dir) if "loss" in r and "time" in r]  # training rows
    step_times = [float(r["step_time_s"]) for r in rows if r.get("step_time_s") is not None]
    step_time = statistics.median(step_times) if step_times else None
    save = {FAST: _fast_save(events), DURABLE: _median(events, "checkpoint_durable_copied", "copy_s")}
    restore = {
        tier: _median(_of_tier(events, tier), "checkpoint_restored", "load_s") for tier in (FAST, DURABLE)
    }
    intervals, notes = _current_intervals(run_dir, step_time)
    return RunTimes(
        run_dir=run_dir,
        save={tier: t for tier, t in save.items() if t is not None},
        restore={tier: t for tier, t in restore.items() if t is not None},
        restart=_restart(events, rows, step_time or 0.0),
        step_time_s=step_time,
        intervals=intervals,
        notes=notes,
    )


def _median(events: Sequence[dict[str, Any]], kind: str, key: str) -> Timing | None:
    values = [float(e[key]) for e in events if e.get("event") == kind and e.get(key) is not None]
    if not values:
        return None
    return Timing(statistics.median(values), f"measured: median {key} of {len(values)} {kind}")


def _fast_save(events: Sequence[dict[str, Any]]) -> Timing | None:
    """What training waited for: the staging copy of an async save, else the whole write."""
    return _median(events, "checkpoint_staged", "blocking_s") or _median(
        events, "checkpoint_committed", "write_s"
    )


def _of_tier(events: Sequence[dict[str, Any]], tier: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("tier", FAST) == tier]


def _restart(
    events: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], step_time: float
) -> Timing | None:
    """Median restart cost over the agent's restarts of the worker group (module doc)."""
    starts = [float(e["time"]) for e in events if e.get("event") == "group_start"]
    restarts = [e for e in events if e.get("event") == "group_start" and e.get("restart_count")]
    costs, seen = [], 0
    for start in restarts:  # the first start of an agent has restart_count 0: nothing failed
        begin = float(start["time"])
        window = (max((t for t in starts if t < begin), default=-math.inf), begin)
        failed, by_agent = _failure_time(window, events, rows)
        end = min((t for t in starts if t > begin), default=math.inf)  # the next attempt's start
        cost = _restart_cost(failed, begin, end, events, rows, step_time)
        if cost is not None:
            costs.append(cost)
            seen += by_agent
    if not costs:
        return None
    anchor = {0: "last record", len(costs): "failure seen by the agent"}.get(
        seen, "failure seen or last record"
    )
    plural = "s" if len(costs) > 1 else ""
    source = f"measured: median of {len(costs)} restart{plural} ({anchor} -> first step)"
    return Timing(statistics.median(costs), source)


def _failure_time(
    window: tuple[float, float], events: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]
) -> tuple[float | None, bool]:
    """When the attempt that ran in ``window`` failed: the agent's ``failure_seen`` when recorded
    (``agent_restart``), else the attempt's last record; and whether it was the agent's."""
    seen = [
        float(e["failure_seen"])
        for e in events
        if e.get("event") == "agent_restart"
        and isinstance(e.get("failure_seen"), int | float)
        and window[0] < float(e["failure_seen"]) < window[1]
    ]
    if seen:
        return max(seen), True
    # Not the lines the agent and the next attempt write after the failure.
    alive = [e for e in events if e.get("event") not in ("agent_restart", "restart", "membership_change")]
    last = [float(r["time"]) for r in (*alive, *rows) if window[0] <= float(r["time"]) < window[1]]
    return (max(last) if last else None), False


def _restart_cost(
    failed: float | None,
    begin: float,
    end: float,
    events: Sequence[dict[str, Any]],
    rows: Sequence[dict[str, Any]],
    step_time: float,
) -> float | None:
    """One restart, whose attempt ran from ``begin`` to ``end``: from the failure to this
    attempt's first trained step, less its restore and the steps it trained."""
    after = [r for r in rows if begin < float(r["time"]) < end]
    if failed is None or not after:
        return None  # the failed attempt left nothing, or this one never trained a step
    first = min(after, key=lambda r: float(r["time"]))
    restored = [
        e for e in events if e.get("event") == "checkpoint_restored" and begin <= float(e["time"]) < end
    ]
    resumed_step = int(restored[0].get("step", 0)) if restored else 0
    load = float(restored[0].get("load_s", 0.0)) if restored else 0.0
    trained = (int(first["step"]) - resumed_step) * step_time
    return max(0.0, float(first["time"]) - failed - load - trained)


def _current_intervals(run_dir: Path, step_time: float | None) -> tuple[dict[str, float], tuple[str, ...]]:
    """hpcpipe's checkpoint interval per tier in seconds of training, from the run's config."""
    from hpcpipe.config import load_config

    path = RunLayout(run_dir).config
    if step_time is None or not path.is_file():
        return {}, (f"{path}: no config or no step times: hpcpipe's current interval unknown",)
    from hpcpipe.recipes.registry import RecipeImportError

    try:
        ckpt = load_config(str(path)).checkpoint
    except (UserError, RecipeImportError) as exc:  # its recipe does not load here: times still do
        return {}, (f"current interval unknown: {exc}",)
    if ckpt.every_steps == 0:
        return {}, ("checkpoint.every_steps is 0: the run saved no periodic checkpoints",)
    fast = ckpt.every_steps * step_time
    intervals = {FAST: fast}
    if ckpt.durable_dir is not None:
        intervals[DURABLE] = _durable_interval(
            ckpt.every_steps, ckpt.durable_every_steps, ckpt.durable_every_s, fast
        )
    return intervals, ()


def _durable_interval(every_steps: int, durable_steps: int, durable_s: float, fast: float) -> float:
    """Seconds between durable copies: a copy is due at a multiple of ``durable_steps`` or once
    ``durable_s`` passed (``checkpoint/tiers.py DurableSchedule``), always at a fast checkpoint."""
    due = []
    if durable_steps > 0:
        due.append(math.lcm(every_steps, durable_steps) / every_steps * fast)
    if durable_s > 0:
        due.append(math.ceil(durable_s / fast) * fast)
    return min(due, default=fast)
