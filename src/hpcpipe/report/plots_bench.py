"""PNG plots of benchmark results: collective bandwidth, scaling, roofline, scaling-law fits.

Each function takes the JSON-able result of the matching ``hpcpipe.bench`` module, so a plot can
be redrawn later from a saved ``--json`` file without measuring again.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _figure(ncols: int = 1) -> tuple[Figure, list[Axes]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(6.5 * ncols, 4.5), dpi=120, squeeze=False)
    return fig, list(axes[0])


def _save(fig: Figure, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_collectives(result: dict[str, Any], path: Path) -> Path:
    """Bus bandwidth against message size, one line per collective (nccl-tests' busbw)."""
    fig, (ax,) = _figure()
    for name in dict.fromkeys(r["collective"] for r in result["results"]):
        rows = [r for r in result["results"] if r["collective"] == name]
        ax.plot(
            [r["size_bytes"] for r in rows], [r["busbw_gbps"] for r in rows], "o-", label=name, markersize=3
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes, nccl-tests convention)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"collectives: {result['world_size']} ranks, {result['backend']}, {result['dtype']}")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return _save(fig, path)


def plot_scaling(rows: list[dict[str, Any]], path: Path) -> Path:
    """Throughput and efficiency against world size, per mode, with the ideal lines."""
    fig, (left, right) = _figure(2)
    for mode in sorted({r["mode"] for r in rows}):
        series = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["nproc"])
        n = [r["nproc"] for r in series]
        base = series[0]
        left.plot(n, [r["per_s"] for r in series], "o-", label=f"{mode} scaling")
        left.plot(n, [base["per_s"] * k / base["nproc"] for k in n], ":", color="gray")
        right.plot(n, [r["efficiency"] for r in series], "o-", label=f"{mode} scaling")
    unit = rows[0].get("unit", "tokens")
    left.set_ylabel(f"throughput ({unit}/s, whole job)")
    left.set_title("throughput (dotted: linear scaling)")
    right.axhline(1.0, color="gray", linestyle=":")
    right.set_ylim(0, max(1.1, max(r["efficiency"] for r in rows) * 1.1))
    right.set_ylabel("efficiency")
    right.set_title("E_strong = T(1) / (N T(N)),  E_weak = T(1) / T(N)")
    for ax in (left, right):
        ax.set_xlabel("world size N")
        ax.set_xticks(sorted({r["nproc"] for r in rows}))
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(fig, path)


def plot_roofline(result: dict[str, Any], path: Path) -> Path:
    """The two roofs and every operation at its arithmetic intensity and attainable FLOP/s.

    Operations crowd together (every large matmul sits near the compute roof), so points carry a
    number and the legend names them.
    """
    import numpy as np

    fig, (ax,) = _figure()
    fig.set_size_inches(10, 5)
    peak, ridge = result["peak_tflops"], result["ridge_flop_per_byte"]
    intensities = [op["intensity"] for op in result["ops"]]
    x = np.logspace(np.log10(min(*intensities, ridge) / 4), np.log10(max(*intensities, ridge) * 4), 200)
    ax.plot(x, np.minimum(peak, x * result["bandwidth_gbps"] / 1e3), color="black", linewidth=1.5)
    ax.axvline(ridge, color="gray", linestyle=":", linewidth=1, label=f"ridge {ridge:.3g} FLOP/byte")
    for number, op in enumerate(result["ops"], start=1):
        color = "tab:red" if op["bound"] == "memory" else "tab:blue"
        point = (op["intensity"], op["attainable_tflops"])
        ax.plot(*point, "o", color=color, label=f"{number}. {op['name']} ({op['bound']})")
        offset = (4, -12) if number % 2 else (4, 6)
        ax.annotate(str(number), point, fontsize=8, xytext=offset, textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_title(f"roofline: {result['name']} ({result['precision']}); red memory-, blue compute-bound")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return _save(fig, path)


def plot_scaling_law(points: list[dict[str, Any]], fit: dict[str, Any], path: Path) -> Path:
    """Loss against N and against D: the runs, the Kaplan envelopes and Chinchilla curves."""
    import numpy as np

    fig, (left, right) = _figure(2)
    chin = fit["chinchilla"]
    n = np.array([p["params"] for p in points])
    d = np.array([p["tokens"] for p in points])
    loss = np.array([p["loss"] for p in points])
    for ax, x, other, kaplan, label in (
        (left, n, d, fit["kaplan_n"], "N"),
        (right, d, n, fit["kaplan_d"], "D"),
    ):
        ax.scatter(x, loss, c=np.log10(other), cmap="viridis", s=18, zorder=3)
        grid = np.logspace(np.log10(x.min()) - 0.2, np.log10(x.max()) + 0.2, 100)
        ax.plot(
            grid,
            (kaplan["x_c"] / grid) ** kaplan["alpha"],
            "--",
            color="black",
            label=f"Kaplan L({label}), alpha={kaplan['alpha']:.3f}",
        )
        for value in np.unique(other)[:: max(1, len(np.unique(other)) // 5)]:
            args = (grid, np.full_like(grid, value)) if label == "N" else (np.full_like(grid, value), grid)
            pred = chin["E"] + chin["A"] / args[0] ** chin["alpha"] + chin["B"] / args[1] ** chin["beta"]
            ax.plot(grid, pred, color="tab:orange", linewidth=0.8, alpha=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("non-embedding parameters N" if label == "N" else "training tokens D")
        ax.set_ylabel("final validation loss")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    left.set_title(
        f"Chinchilla fit (orange): E={chin['E']:.3g}, alpha={chin['alpha']:.3f}, beta={chin['beta']:.3f}"
    )
    right.set_title("colour: log10 of the other axis")
    return _save(fig, path)
