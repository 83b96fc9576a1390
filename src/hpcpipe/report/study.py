"""`hpcpipe report DIR` (study part): every plot and table of a scaling study, from its CSVs alone.

Inputs are the ``scaling.csv`` files (``hpcpipe bench scaling``) and ``sweep.csv`` files
(``hpcpipe sweep``) found under DIR; the run directories are not needed. Outputs, in
``DIR/report/``: throughput vs devices with the ideal line, efficiency vs devices with the 70%
target, weak-scaling time per epoch, sweep throughput per point, and ``study.md`` with the
tables, the bottleneck verdict per configuration and a before/after table per optimization.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Any

from hpcpipe.errors import UserError
from hpcpipe.layout import ReportLayout, RunLayout, SweepLayout
from hpcpipe.report.plots_bench import _figure, _save

STRONG_TARGET = 0.70  # E_s(N) the study must reach
WEAK_VARIATION_TARGET = 0.10  # max spread of weak-scaling time per epoch around T(1)
KNOBS = (
    "precision",
    "bucket_cap_mb",
    "num_workers",
    "channels_last",
    "micro_batch_size",
    "global_batch_size",
)


# What each study CSV must hold for the plots and tables: its columns, and which are numbers
# (a sweep's throughput is empty for a point that did not train; such rows are left out).
SCALING_NUMBERS = ("nproc", "per_s", "efficiency", "global_batch_size", "step_time_s")
SCALING_COLUMNS = ("mode", *SCALING_NUMBERS)
SWEEP_NUMBERS = ("throughput",)
SWEEP_COLUMNS = ("run_id", *SWEEP_NUMBERS)


def read_csv_rows(
    path: Path, columns: tuple[str, ...] = (), numbers: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """Rows with numbers parsed; UserError naming the file when it is not a readable CSV, lacks
    one of ``columns``, or holds text where one of ``numbers`` belongs."""
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            fields = reader.fieldnames or []
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{path}: cannot read CSV ({exc})") from None
    missing = [c for c in columns if c not in fields]
    if missing:
        raise UserError(f"{path}: no {', '.join(missing)} column (is it a study CSV hpcpipe wrote?)")
    parsed = [{key: _number(value) for key, value in row.items()} for row in rows]
    for line, row in enumerate(parsed, start=2):
        for key in numbers:
            if not (row.get(key) is None or isinstance(row[key], int | float)):
                raise UserError(f"{path} line {line}: {key} {row[key]!r} is not a number")
    return parsed


def _number(text: str | None) -> Any:
    if text is None or text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def find_study_csvs(root: Path) -> tuple[list[Path], list[Path]]:
    if not root.is_dir():
        raise UserError(f"{root}: not a directory")
    scaling = sorted(root.rglob("scaling.csv"))
    sweeps = sorted(root.rglob(SweepLayout.CSV))
    if not scaling and not sweeps:
        raise UserError(
            f"{root}: no scaling.csv or sweep.csv under it (run `hpcpipe bench scaling` or `hpcpipe sweep`)"
        )
    return scaling, sweeps


def build_study(root: Path, out: Path | None = None) -> dict[str, Any]:
    """Read the CSVs under ``root``, draw the plots and write ``study.md``; returns what was made."""
    out = out or root / RunLayout.REPORT  # DIR/report, as a run's report
    scaling_paths, sweep_paths = find_study_csvs(root)
    scaling = [
        {**row, "study": _study_name(path, root)}  # each study its own lines, ideal and efficiency
        for path in scaling_paths
        for row in read_csv_rows(path, SCALING_COLUMNS, SCALING_NUMBERS)
        if all(row.get(k) is not None for k in ("nproc", "per_s", "efficiency", "step_time_s"))
    ]
    sweep = [
        {**row, "sweep": _study_name(path, root)}  # pairs are matched within one sweep only
        for path in sweep_paths
        for row in read_csv_rows(path, SWEEP_COLUMNS, SWEEP_NUMBERS)
        if row.get("throughput") is not None
    ]
    made: dict[str, Any] = {"scaling_rows": len(scaling), "sweep_rows": len(sweep), "plots": []}
    if scaling:
        made["plots"] += [
            str(plot_throughput(scaling, out / ReportLayout.PLOT_SCALING_THROUGHPUT)),
            str(plot_efficiency(scaling, out / ReportLayout.PLOT_SCALING_EFFICIENCY)),
        ]
        if any(r["mode"] == "weak" for r in scaling):
            made["plots"].append(str(plot_weak_epoch_time(scaling, out / ReportLayout.PLOT_WEAK_EPOCH_TIME)))
    if sweep:
        made["plots"].append(str(plot_sweep(sweep, out / ReportLayout.PLOT_SWEEP_THROUGHPUT)))
    made["optimizations"] = optimization_table(sweep)
    made["weak_variation"] = weak_variation(scaling)
    markdown = render_markdown(scaling, sweep, made)
    out.mkdir(parents=True, exist_ok=True)
    ReportLayout(out).study_markdown.write_text(markdown)
    made["markdown"] = str(ReportLayout(out).study_markdown)
    return made


# -- figures -------------------------------------------------------------------------------------


def _series(rows: list[dict[str, Any]], study: str, mode: str) -> list[dict[str, Any]]:
    """One study's rows of one mode, by devices: two scaling.csv files under DIR were one
    zig-zag line whose ideal came from whichever N=1 row sorted first."""
    chosen = (r for r in rows if r["mode"] == mode and r.get("study", ".") == study)
    return sorted(chosen, key=lambda r: r["nproc"])


def _lines(rows: list[dict[str, Any]], mode: str | None = None) -> list[tuple[str, str, str]]:
    """(study, mode, legend label) of every line to draw; the study is named when there are several."""
    keys = sorted({(str(r.get("study", ".")), str(r["mode"])) for r in rows if mode in (None, r["mode"])})
    several = len({study for study, _ in keys}) > 1
    return [(study, m, f"{study}: {m}" if several else m) for study, m in keys]


def plot_throughput(rows: list[dict[str, Any]], path: Path) -> Path:
    fig, (ax,) = _figure()
    for study, mode, label in _lines(rows):
        series = _series(rows, study, mode)
        n = [r["nproc"] for r in series]
        base = series[0]
        line = ax.plot(n, [r["per_s"] for r in series], "o-", label=f"{label} scaling")[0]
        ideal = [base["per_s"] * k / base["nproc"] for k in n]
        ax.plot(n, ideal, ":", color=line.get_color(), label=f"{label}: ideal")
    ax.set_xlabel("devices N")
    ax.set_ylabel(f"throughput ({rows[0].get('unit', 'samples')}/s, whole job)")
    ax.set_title("throughput vs devices")
    ax.set_xticks(sorted({r["nproc"] for r in rows}))
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_efficiency(rows: list[dict[str, Any]], path: Path) -> Path:
    fig, (ax,) = _figure()
    for study, mode, label in _lines(rows):  # each CSV's efficiency is against its own T(1)
        series = _series(rows, study, mode)
        ax.plot(
            [r["nproc"] for r in series], [r["efficiency"] for r in series], "o-", label=f"{label} scaling"
        )
    ax.axhline(STRONG_TARGET, color="red", linestyle="--", label=f"{STRONG_TARGET:.0%} target")
    ax.axhline(1.0, color="gray", linestyle=":")
    ax.set_ylim(0, max(1.1, max(r["efficiency"] for r in rows) * 1.1))
    ax.set_xlabel("devices N")
    ax.set_ylabel("efficiency")
    ax.set_title("E_s = T(1) / (N T(N)),  E_w = T(1) / T(N)")
    ax.set_xticks(sorted({r["nproc"] for r in rows}))
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def weak_epoch_times(rows: list[dict[str, Any]], study: str = ".") -> tuple[list[int], list[float], str]:
    """Weak scaling of one study: devices, and the time for an epoch that grows with N (each
    device's share fixed).

    That epoch has the same number of steps at every N, so its time is step time x the steps of
    the base run's epoch; without epochs in the CSV it is the step time itself.
    """
    series = _series(rows, study, "weak")
    base = series[0]
    if base.get("time_per_epoch_s"):
        steps = base["time_per_epoch_s"] / base["step_time_s"]
        return [r["nproc"] for r in series], [r["step_time_s"] * steps for r in series], "time per epoch (s)"
    return [r["nproc"] for r in series], [r["step_time_s"] for r in series], "step time (s)"


def plot_weak_epoch_time(rows: list[dict[str, Any]], path: Path) -> Path:
    """Weak scaling: time per epoch of a dataset that grows with N, with each study's ±10% band."""
    fig, (ax,) = _figure()
    devices: set[int] = set()
    labels: set[str] = set()
    top = 0.0
    for study, _, name in _lines(rows, "weak"):
        n, values, label = weak_epoch_times(rows, study)
        labels.add(label)
        named = "" if name == "weak" else f"{study}: "  # the study, when there are several
        line = ax.plot(n, values, "o-", label=f"{named}{label}")[0]
        low, high = values[0] * (1 - WEAK_VARIATION_TARGET), values[0] * (1 + WEAK_VARIATION_TARGET)
        ax.axhspan(low, high, alpha=0.15, color=line.get_color(), label=f"{named}T(1) ± 10%")
        devices |= set(n)
        top = max(top, *values)
    ax.set_xlabel("devices N (fixed per-device batch and per-device data)")
    # Studies with and without epochs in their CSV: each line's legend names its unit, the axis
    # neither (it took the last study's, under which another's step times were drawn).
    ax.set_ylabel(labels.pop() if len(labels) == 1 else "time (s): see each line")
    ax.set_title("weak scaling: time per epoch")
    ax.set_xticks(sorted(devices))
    ax.set_ylim(0, top * 1.3)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_sweep(rows: list[dict[str, Any]], path: Path) -> Path:
    ordered = sorted(rows, key=lambda r: r["throughput"])
    fig, (ax,) = _figure()
    fig.set_size_inches(8, max(3.0, 0.35 * len(ordered) + 1))
    several = len({r.get("sweep") for r in ordered}) > 1  # which sweep each bar is from
    labels = [(f"{r['sweep']}: " if several else "") + str(r.get("point") or r["run_id"]) for r in ordered]
    ax.barh(labels, [r["throughput"] for r in ordered])
    ax.set_xlabel(f"throughput ({ordered[0].get('throughput_unit', 'samples')}/s)")
    ax.set_title("sweep: throughput per point")
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


# -- tables --------------------------------------------------------------------------------------


def optimization_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per knob that varies: each value against the first one, in runs equal in everything else
    swept (the other knobs, the devices and nodes, and every other key the point overrides).

    The ratio is the median over such matched pairs of throughput(value) / throughput(baseline).
    """
    table = []
    varied = [k for k in KNOBS if len({r.get(k) for r in rows}) > 1]
    for knob in varied:
        others = [k for k in varied if k != knob]
        baseline = rows[0][knob]
        for value in dict.fromkeys(r[knob] for r in rows if r[knob] != baseline):
            ratios = []
            for after in (r for r in rows if r[knob] == value):
                match = [
                    b
                    for b in rows
                    if b[knob] == baseline
                    and all(b.get(k) == after.get(k) for k in others)
                    and _rest_of_the_point(b) == _rest_of_the_point(after)
                ]
                ratios += [after["throughput"] / b["throughput"] for b in match if b["throughput"]]
            if ratios:
                ratio = statistics.median(ratios)
                table.append(
                    {"knob": knob, "before": baseline, "after": value, "ratio": ratio, "pairs": len(ratios)}
                )
    return table


def _rest_of_the_point(row: dict[str, Any]) -> tuple[Any, ...]:
    """What a sweep row was run with besides the knobs: its sweep (another sweep's base config
    differs: a 6-layer run was paired with a 2-layer one), devices, nodes, and the point's other
    overrides (``train.lr=0.1 model.n_layers=4``; a knob is the last part of its key)."""
    overrides = str(row.get("point") or "").split()
    rest = sorted(o for o in overrides if o.partition("=")[0].rsplit(".", 1)[-1] not in KNOBS)
    return (row.get("sweep"), row.get("devices"), row.get("nodes"), *rest)


def _study_name(csv_path: Path, root: Path) -> str:
    """A sweep.csv's or scaling.csv's directory, relative to the study root ("." for the root's own)."""
    try:
        return str(csv_path.parent.relative_to(root))
    except ValueError:
        return str(csv_path.parent)


def weak_variation(rows: list[dict[str, Any]]) -> float | None:
    """Largest relative deviation of weak-scaling time per epoch from the smallest N's, in the
    study that deviates most (each against its own smallest N)."""
    found = []
    for study, _, _ in _lines(rows, "weak"):
        if len(_series(rows, study, "weak")) >= 2:
            _, values, _ = weak_epoch_times(rows, study)
            found.append(max(abs(v - values[0]) / values[0] for v in values))
    return max(found) if found else None


def render_markdown(scaling: list[dict[str, Any]], sweep: list[dict[str, Any]], made: dict[str, Any]) -> str:
    lines = ["# Scaling study", "", "Regenerated from CSV files alone by `hpcpipe report`.", ""]
    if scaling:
        several = len({r.get("study", ".") for r in scaling}) > 1  # which study each row is from
        header = [
            *(["study"] if several else []),
            "mode",
            "N",
            "nodes",
            "global batch",
            "throughput/s",
            "efficiency",
            ">= 70%",
        ]
        header += ["time/epoch (s)", "data wait", "exposed comm", "bottleneck"]
        body = [
            [
                *([r.get("study", ".")] if several else []),
                r["mode"],
                r["nproc"],
                r.get("nodes") or "-",
                r["global_batch_size"],
                f"{r['per_s']:.4g}",
                f"{r['efficiency']:.2f}",
                "yes" if r["efficiency"] >= STRONG_TARGET else "no",
                _fmt(r.get("time_per_epoch_s")),
                _pct(r.get("data_share")),
                _pct(r.get("comm_share")),
                r.get("bottleneck") or "-",
            ]
            for r in sorted(scaling, key=lambda r: (r.get("study", "."), r["mode"], r["nproc"]))
        ]
        lines += ["## Scaling", "", *_md_table(header, body)]
        variation = made["weak_variation"]
        if variation is not None:
            verdict = "within" if variation <= WEAK_VARIATION_TARGET else "outside"
            note = f"Weak scaling: time per epoch varies by {variation:.1%} ({verdict} the 10% target)."
            lines += ["", note]
        lines.append("")
    if sweep:
        header = ["point", "devices", "throughput/s", "time/epoch (s)", "final accuracy", "git"]
        body = [
            [
                r.get("point") or r["run_id"],
                r.get("devices") or "-",
                f"{r['throughput']:.4g}",
                _fmt(r.get("time_per_epoch_s")),
                _fmt(r.get("final_accuracy")),
                str(r.get("git_sha") or "-")[:12],
            ]
            for r in sorted(sweep, key=lambda r: -r["throughput"])
        ]
        lines += ["## Sweep", "", *_md_table(header, body), ""]
    if made["optimizations"]:
        header = ["knob", "before", "after", "throughput ratio", "gain", "matched pairs"]
        body = [
            [o["knob"], o["before"], o["after"], f"{o['ratio']:.3f}", f"{o['ratio'] - 1:+.1%}", o["pairs"]]
            for o in made["optimizations"]
        ]
        lines += ["## Before / after per optimization", "", *_md_table(header, body), ""]
    lines += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in made["plots"]] + [""]
    return "\n".join(lines)


def _md_table(header: list[str], body: list[list[Any]]) -> list[str]:
    rows = [header, ["---"] * len(header), *body]
    return ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


def _pct(value: Any) -> str:
    return "-" if value is None else f"{value:.0%}"
