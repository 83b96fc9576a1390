"""Goodput against checkpoint interval, one curve per cluster size and tier, optima marked.

Drawn from the plan's JSON alone (each row carries δ, R and M), so a saved plan can be redrawn.
matplotlib is imported here, lazily, with the Agg backend: no display needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hpcpipe.plan.closed_form import goodput

_STYLE = {"fast": "-", "durable": "--"}


def plot_goodput(plan: dict[str, Any], path: Path) -> Path:
    """Write the plot to ``path`` (PNG) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    sizes = sorted({row["gpus"] for row in plan["rows"]})
    colors = dict(zip(sizes, plt.get_cmap("viridis")(np.linspace(0.0, 0.85, len(sizes))), strict=True))
    for row in plan["rows"]:
        _curve(ax, row, colors[row["gpus"]])
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval τ (s of training between checkpoints)")
    ax.set_ylabel("goodput (share of GPU time that trains)")
    ax.set_title(
        f"goodput vs checkpoint interval, per-GPU MTBF {plan['settings']['gpu_mtbf_hours']:,.0f} h\n"
        "dot: Daly optimum, cross: Young, star: hpcpipe's current interval",
        fontsize=9,
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _curve(ax: Any, row: dict[str, Any], color: Any) -> None:
    """One (cluster size, tier): the closed form from τ* / 30 to τ* × 30, stretched to reach
    hpcpipe's current interval, and its marked points."""
    delta, restart, mtbf = row["delta_s"], row["restart_s"], row["job_mtbf_s"]
    ends = [row["tau_daly_s"] / 30.0, row["tau_daly_s"] * 30.0]
    if row["current_tau_s"]:
        ends += [row["current_tau_s"] / 2.0, row["current_tau_s"] * 2.0]
    taus = np.geomspace(min(ends), max(ends), 300)
    label = f"{row['gpus']:,} GPUs, {row['tier']} (δ {delta:.3g} s)"
    ax.plot(taus, goodput(taus, delta, restart, mtbf), _STYLE.get(row["tier"], ":"), color=color, label=label)
    ax.plot(row["tau_daly_s"], row["goodput"], "o", color=color)
    young = row["tau_young_s"]
    ax.plot(young, goodput(young, delta, restart, mtbf), "x", color=color)
    if row["current_tau_s"]:
        ax.plot(row["current_tau_s"], row["goodput_current"], "*", color=color, markersize=10)
