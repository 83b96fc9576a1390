"""The loss-curve PNG of a run: training loss per logged step, validation loss per evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcpipe.layout import RunLayout
from hpcpipe.observe.metrics import read_metrics


def plot_loss_curve(run_dir: Path, out: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    train = [(r["step"], r["loss"]) for r in rows if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss", color="tab:blue", linewidth=1.2)
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="validation loss", color="tab:orange")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(loss_label(rows))
    ax.set_title(f"{run_dir.name}: loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out or RunLayout(run_dir).loss_curve
    fig.savefig(path)
    plt.close(fig)
    return path


def loss_label(rows: list[dict[str, Any]]) -> str:
    """The y-axis: per token where the recipe counts its throughput in tokens (its
    ``throughput_unit``, logged as ``tokens_per_s``), else just "loss": an image classifier's axis
    read "cross-entropy (nats/token)", and a recipe's own loss may be no cross-entropy at all."""
    return "loss per token" if any("tokens_per_s" in r for r in rows) else "loss"
