"""PNG plots of run reports, drawn only from tidy series rows (see :mod:`hpcpipe.report.series`).

Taking the rows rather than run directories is what lets :func:`plot_from_csv` redraw every
figure from a report's ``series.csv``. A plot whose series are absent is skipped, not drawn empty.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from hpcpipe.layout import ReportLayout
from hpcpipe.report.plots_bench import _figure, _save
from hpcpipe.report.series import EVENT_PREFIX, GIB, SeriesRow, read_series_csv, runs_in, select, series_in

if TYPE_CHECKING:
    from matplotlib.axes import Axes

THROUGHPUT_KEYS = ("tokens_per_s", "samples_per_s")
PHASES = ("data_time_s", "forward_time_s", "backward_time_s", "optimizer_time_s", "comm_time_s")


class Plot(NamedTuple):
    name: str  # the file stem: a stable id for the plot
    title: str
    path: Path


def draw_plots(rows: list[SeriesRow], out: Path, compare: bool | None = None) -> list[Plot]:
    """One run: its detail plots; several (or ``compare``): curves overlaid, one line per run."""
    runs = runs_in(rows)
    if len(runs) == 1 and not compare:
        return _single_run(rows, runs[0], out)
    return _overlaid(rows, runs, out)


def plot_from_csv(csv_path: Path, out: Path) -> list[Plot]:
    """Redraw a report's plots from its ``series.csv`` alone."""
    return draw_plots(read_series_csv(csv_path), out)


def throughput_key(rows: list[SeriesRow], run: str) -> str | None:
    present = series_in(rows, run)
    return next((k for k in THROUGHPUT_KEYS if k in present), None)


def _text(text: str) -> str:
    """Run names as plain text: '$' would start mathtext, a leading '_' hides a legend entry."""
    text = text.replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def _single_run(rows: list[SeriesRow], run: str, out: Path) -> list[Plot]:
    present = series_in(rows, run)
    plots = []
    if present & {"loss", "val_loss"}:
        plots.append(plot_loss(rows, run, out / ReportLayout.PLOT_LOSS))
    rate = throughput_key(rows, run)
    if rate:
        unit = f"{rate.removesuffix('_per_s')}/s"
        plots.append(
            _plot_one(
                rows, run, rate, Plot("throughput", "Throughput", out / ReportLayout.PLOT_THROUGHPUT), unit
            )
        )
    if "mfu" in present:
        plots.append(
            _plot_one(
                rows, run, "mfu", Plot("mfu", "MFU", out / ReportLayout.PLOT_MFU), "model FLOP utilization"
            )
        )
    if "mem_bytes" in present:
        memory = Plot("memory", "Peak memory", out / ReportLayout.PLOT_MEMORY)
        plots.append(_plot_one(rows, run, "mem_bytes", memory, "GiB", scale=1 / GIB))
    if "step_time_s" in present and present & set(PHASES):
        plots.append(plot_phases(rows, run, out / ReportLayout.PLOT_PHASES))
    return plots


def plot_loss(rows: list[SeriesRow], run: str, path: Path) -> Plot:
    """Training loss with validation loss overlaid and the run's events as vertical lines."""
    fig, (ax,) = _figure()
    steps, values = select(rows, run, "loss")
    if steps:
        ax.plot(steps, values, label="train loss", color="tab:blue", linewidth=1.2)
    steps, values = select(rows, run, "val_loss")
    if steps:
        ax.plot(steps, values, "o-", label="validation loss", color="tab:orange")
    _mark_events(ax, rows, run)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(_text(f"{run}: loss"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return Plot("loss", "Loss", _save(fig, path))


def _mark_events(ax: Axes, rows: list[SeriesRow], run: str) -> None:
    kinds = sorted(s for s in series_in(rows, run) if s.startswith(EVENT_PREFIX))
    colors = ("tab:red", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:gray", "tab:olive")
    for number, kind in enumerate(kinds):
        steps, _ = select(rows, run, kind)
        for index, step in enumerate(steps):
            label = kind.removeprefix(EVENT_PREFIX) if index == 0 else None
            ax.axvline(step, color=colors[number % len(colors)], linestyle="--", alpha=0.6, label=label)


def _plot_one(rows: list[SeriesRow], run: str, key: str, plot: Plot, ylabel: str, scale: float = 1.0) -> Plot:
    """One series of one run against step, saved at ``plot.path``."""
    fig, (ax,) = _figure()
    steps, values = select(rows, run, key)
    ax.plot(steps, [v * scale for v in values], "o-", markersize=3)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.set_title(_text(f"{run}: {plot.title}"))
    ax.grid(alpha=0.3)
    _save(fig, plot.path)
    return plot


def plot_phases(rows: list[SeriesRow], run: str, path: Path) -> Plot:
    """Share of step time per phase, stacked; 'other' is what the phases do not cover.

    Communication can overlap backward, so the stack may pass 100% on overlapping runs.
    """
    steps, totals = select(rows, run, "step_time_s")
    total_at = dict(zip(steps, totals, strict=True))
    shares: dict[str, list[float]] = {}
    for phase in PHASES:
        at = dict(zip(*select(rows, run, phase), strict=True))
        if at:
            shares[phase.removesuffix("_time_s")] = [
                at.get(s, 0.0) / total_at[s] if total_at[s] else 0.0 for s in steps
            ]
    shares["other"] = [max(0.0, 1 - sum(column)) for column in zip(*shares.values(), strict=True)]
    fig, (ax,) = _figure()
    ax.stackplot(steps, *shares.values(), labels=list(shares), alpha=0.85)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("share of step time")
    ax.set_title(_text(f"{run}: step-time phases"))
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    return Plot("phases", "Step-time phases", _save(fig, path))


def _overlaid(rows: list[SeriesRow], runs: list[str], out: Path) -> list[Plot]:
    plots = []
    overlays = (
        ("loss", "training loss", ReportLayout.PLOT_LOSS),
        ("val_loss", "validation loss", ReportLayout.PLOT_VAL_LOSS),
    )
    for key, title, name in overlays:
        if any(key in series_in(rows, run) for run in runs):
            plots.append(_plot_overlay(rows, {run: key for run in runs}, title, "loss", out / name))
    rates = {run: rate for run in runs if (rate := throughput_key(rows, run))}
    if rates:
        units = "/s, ".join(sorted({k.removesuffix("_per_s") for k in rates.values()}))
        plots.append(
            _plot_overlay(rows, rates, "throughput", f"{units}/s", out / ReportLayout.PLOT_THROUGHPUT)
        )
    return plots


def _plot_overlay(rows: list[SeriesRow], keys: dict[str, str], title: str, ylabel: str, path: Path) -> Plot:
    fig, (ax,) = _figure()
    for run, key in keys.items():
        steps, values = select(rows, run, key)
        if steps:
            ax.plot(steps, values, "o-" if len(steps) < 20 else "-", markersize=3, label=_text(run))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return Plot(path.stem, title.capitalize(), _save(fig, path))
