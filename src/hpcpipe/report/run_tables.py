"""The tables of a run report (key figures, comparison, config differences, events, evaluation).

Cells are strings already formatted for reading, so the Markdown and HTML templates only lay
them out; numbers are formatted once here and look the same in both.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from hpcpipe.report.series import GIB, RunData
from hpcpipe.track.params import flatten

SHORT_HASH = 12
MAX_HOSTS = 8  # a 64-node job would otherwise fill the header with host names
DETAIL_CHARS = 80


@dataclass(frozen=True)
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]


def fmt(value: Any, spec: str = ".4g") -> str:
    """A cell: '-' for missing, numbers with ``spec``, anything else as text."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return format(value, spec)


def train_rows(run: RunData) -> list[dict[str, Any]]:
    return [r for r in run.metrics if "loss" in r]


def median_after_first(rows: list[dict[str, Any]], key: str) -> float | None:
    """Median of ``key`` over the logged intervals after the first (start-up, compilation)."""
    values = [float(r[key]) for r in rows[1:] or rows if isinstance(r.get(key), int | float)]
    return statistics.median(values) if values else None


def throughput_text(run: RunData) -> str:
    rate, key = run.summary["median_rate"], run.summary["rate_key"]
    return "-" if rate is None else f"{rate:,.0f} {key.removesuffix('_per_s')}/s"


def peak_memory_gib(run: RunData) -> float | None:
    values = [r["mem_bytes"] for r in train_rows(run) if isinstance(r.get("mem_bytes"), int | float)]
    return max(values) / GIB if values else None


def header_facts(run: RunData) -> list[tuple[str, str]]:
    """What produced the run: name, recipe, scale, code, config and data identities."""
    lineage, hosts = run.lineage, list(run.lineage.get("hosts") or [])
    shown = ", ".join(hosts[:MAX_HOSTS]) + (
        f" (+{len(hosts) - MAX_HOSTS} more)" if len(hosts) > MAX_HOSTS else ""
    )
    return [
        ("run", run.label),
        ("recipe", fmt(run.config.get("run", {}).get("recipe"))),
        ("world size", fmt(run.summary["world_size"] or lineage.get("world_size"))),
        ("hosts", shown or "-"),
        ("git sha", fmt(lineage.get("git_sha"))),
        ("config hash", fmt(lineage.get("config_hash"))),
        ("dataset manifest sha256", fmt(lineage.get("dataset_manifest_sha256"))),
        ("torch", fmt((lineage.get("versions") or {}).get("torch"))),
    ]


def key_figures(run: RunData) -> Table:
    s = run.summary
    rows = [
        ["steps", fmt(s["steps"])],
        ["final train loss", fmt(s["final_train_loss"])],
        ["first val loss", _at_step(s["val_loss_first"], s["val_loss_first_step"])],
        ["last val loss", _at_step(s["val_loss_last"], s["val_loss_last_step"])],
        ["median throughput (after the first interval)", throughput_text(run)],
        ["median MFU", fmt(median_after_first(train_rows(run), "mfu"), ".1%")],
        ["peak memory (GiB)", fmt(peak_memory_gib(run), ".2f")],
    ]
    return Table("Key figures", ["figure", "value"], rows)


def _at_step(value: float | None, step: int | None) -> str:
    return "-" if value is None else f"{value:.4g} (step {step})"


def comparison_table(runs: list[RunData]) -> Table:
    header = ["run", "recipe", "world size", "steps", "final loss", "last val loss"]
    header += ["median throughput", "median MFU", "config hash"]
    rows = [
        [
            run.label,
            fmt(run.config.get("run", {}).get("recipe")),
            fmt(run.summary["world_size"] or run.lineage.get("world_size")),
            fmt(run.summary["steps"]),
            fmt(run.summary["final_train_loss"]),
            fmt(run.summary["val_loss_last"]),
            throughput_text(run),
            fmt(median_after_first(train_rows(run), "mfu"), ".1%"),
            str(run.lineage.get("config_hash") or "-")[:SHORT_HASH],
        ]
        for run in runs
    ]
    return Table("Runs", header, rows)


def config_diff(runs: list[RunData]) -> Table:
    """Only the dotted config keys whose values are not the same in every run (absent counts)."""
    flats = [flatten(run.config) for run in runs]
    keys = sorted({key for flat in flats for key in flat})
    missing = object()
    differing = [k for k in keys if len({repr(flat.get(k, missing)) for flat in flats}) > 1]
    rows = [[key, *(fmt(flat.get(key)) for flat in flats)] for key in differing]
    return Table("Config differences", ["key", *(run.label for run in runs)], rows)


def events_table(runs: list[RunData]) -> Table | None:
    """Step, kind and the other fields of each event; a run column when there are several runs."""
    several = len(runs) > 1
    rows = []
    for run in runs:
        for event in run.events:
            detail = ", ".join(f"{k}={v}" for k, v in event.items() if k not in {"event", "time", "step"})
            cells = [fmt(event.get("step")), str(event.get("event", "?")), _shorten(detail)]
            rows.append([run.label, *cells] if several else cells)
    header = ["run", "step", "kind", "detail"] if several else ["step", "kind", "detail"]
    return Table("Events", header, rows) if rows else None


def _shorten(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 1] + "…"


def eval_tables(run: RunData) -> list[Table]:
    """The val_* metrics logged during training, then eval.json's metrics and each of its tables."""
    tables = []
    evals = [r for r in run.metrics if any(k.startswith("val_") for k in r)]
    keys = list(dict.fromkeys(k for r in evals for k in r if k.startswith("val_")))
    if evals:
        rows = [[fmt(r.get("step")), *(fmt(r.get(k)) for k in keys)] for r in evals]
        tables.append(Table("Validation during training", ["step", *keys], rows))
    result = run.eval_result or {}
    if isinstance(result.get("metrics"), dict) and result["metrics"]:
        rows = [[str(name), fmt(value)] for name, value in result["metrics"].items()]
        tables.append(Table(f"eval.json metrics (step {fmt(result.get('step'))})", ["metric", "value"], rows))
    named = result.get("tables")
    for name, table in (named if isinstance(named, dict) else {}).items():
        if isinstance(table, dict):
            tables.append(_nested_table(f"eval.json: {name}", table))
    return tables


def _nested_table(title: str, table: dict[str, Any]) -> Table:
    """{row: {column: value}} as a table; the columns are the union, in first-seen order."""
    columns = list(dict.fromkeys(c for row in table.values() if isinstance(row, dict) for c in row))
    rows = [
        [str(name), *(fmt(row.get(c)) if isinstance(row, dict) else "-" for c in columns)]
        for name, row in table.items()
    ]
    return Table(title, ["", *columns], rows)


def pipeline_table(run: RunData) -> Table | None:
    """lineage.json's pipeline step records, when the run went through a pipeline."""
    steps = run.lineage.get("steps")
    if not isinstance(steps, dict) or not steps:
        return None
    rows = [
        [str(name), fmt(rec.get("status") if isinstance(rec, dict) else rec)] for name, rec in steps.items()
    ]
    return Table("Pipeline steps", ["step", "status"], rows)
