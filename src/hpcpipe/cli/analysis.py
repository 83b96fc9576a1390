"""`hpcpipe roofline` and `hpcpipe scaling-law fit`: analyses over measurements and run directories."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from hpcpipe.cli.common import ConfigArg, JsonOption, SetOption, console, load_job, print_whole, write_json
from hpcpipe.errors import UserError

scaling_law_app = typer.Typer(
    help="Fit scaling laws (Kaplan L(N), L(D); Chinchilla L(N, D)) to finished runs or a CSV.",
    no_args_is_help=True,
)


def roofline(
    config: ConfigArg,
    sets: SetOption = None,
    ceilings: Annotated[
        Path | None,
        typer.Option(
            help="JSON from `hpcpipe bench compute --json` (default: measure now).", show_default=False
        ),
    ] = None,
    peak_tflops: Annotated[
        float | None,
        typer.Option(help="Compute roof in TFLOP/s (overrides the measured one).", show_default=False),
    ] = None,
    bandwidth_gbps: Annotated[
        float | None,
        typer.Option(help="Memory roof in GB/s (overrides the measured one).", show_default=False),
    ] = None,
    png: Annotated[Path | None, typer.Option(help="Where to save the plot.", show_default=False)] = None,
    json_out: JsonOption = None,
) -> None:
    """Place a recipe's main operations on the roofline: which are memory-, which compute-bound.

    The operations of one forward micro-batch at the job's sizes (matmuls, SDPA attention, norms,
    activations, the loss) with their FLOPs and bytes, against the device's measured matmul
    TFLOP/s (at train.precision) and memory bandwidth. Default plot: runs/roofline-<run.name>.png.

    Examples:

      hpcpipe roofline quickstart

      hpcpipe bench compute --json h100.json && hpcpipe roofline gpt-124m --ceilings h100.json

      hpcpipe roofline gpt-124m --peak-tflops 989 --bandwidth-gbps 3350   (datasheet roofs)
    """
    from hpcpipe.bench.roofline import Ceilings
    from hpcpipe.bench.roofline import roofline as analyse
    from hpcpipe.report.plots_bench import plot_roofline

    for option, roof in (("--peak-tflops", peak_tflops), ("--bandwidth-gbps", bandwidth_gbps)):
        if roof is not None and not 0 < roof < math.inf:  # 0 divided by zero; nan broke the plot
            raise UserError(f"{option} {roof}: give a positive, finite number")
    job = load_job(config, sets)
    roofs = _ceilings(job.train.precision, ceilings, peak_tflops, bandwidth_gbps)
    if (peak_tflops is None) != (bandwidth_gbps is None):  # one roof given, the other measured
        roofs = Ceilings(
            peak_tflops * 1e12 if peak_tflops is not None else roofs.peak_flops,
            bandwidth_gbps * 1e9 if bandwidth_gbps is not None else roofs.bandwidth,
            f"{roofs.source}, one roof given on the command line",
        )
    result = analyse(job, roofs)
    result["png"] = str(plot_roofline(result, png or Path("runs") / f"roofline-{job.run.name}.png"))
    if json_out != "-":
        _print_roofline(result)
    write_json(result, json_out)


def _ceilings(precision: str, path: Path | None, peak: float | None, bandwidth: float | None) -> Any:
    from hpcpipe.bench.roofline import Ceilings, ceilings_from_compute

    if path is not None:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            raise UserError(f"--ceilings: cannot read JSON from {path}") from None
        return ceilings_from_compute(data, precision, str(path))
    if peak is not None and bandwidth is not None:
        return Ceilings(peak * 1e12, bandwidth * 1e9, "given on the command line")
    import torch

    from hpcpipe.bench.compute import ComputeSpec, measure_compute

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    measured = measure_compute(ComputeSpec.build([precision], None, None, 0.3, 3), device)
    return ceilings_from_compute(measured, precision, f"measured now on {measured['device_name']}")


def _print_roofline(result: dict[str, Any]) -> None:
    table = Table(
        "operation",
        "x",
        "GFLOP",
        "MB",
        "FLOP/byte",
        "bound",
        "attainable TFLOP/s",
        "time share",
        title=f"{result['name']} ({result['precision']}, micro-batch {result['micro_batch_size']} x "
        f"{result['seq_len']}): roofs {result['peak_tflops']:.3g} TFLOP/s, "
        f"{result['bandwidth_gbps']:.4g} GB/s, ridge {result['ridge_flop_per_byte']:.3g} FLOP/byte "
        f"({result['ceilings_source']})",
    )
    for op in result["ops"]:
        style = "red" if op["bound"] == "memory" else "blue"
        table.add_row(
            op["name"],
            str(op["count"]),
            f"{op['flops'] / 1e9:.3g}",
            f"{op['bytes'] / 1e6:.3g}",
            f"{op['intensity']:.3g}",
            f"[{style}]{op['bound']}[/{style}]",
            f"{op['attainable_tflops']:.3g}",
            f"{op['time_share']:.1%}",
        )
    print_whole(table)
    console.print(f"plot: {result['png']}")


@scaling_law_app.command("fit")
def fit(
    inputs: Annotated[
        list[str],
        typer.Argument(
            help="CSV files (columns params,tokens,loss), run directories, or directories of runs."
        ),
    ],
    flops: Annotated[
        float | None,
        typer.Option(
            help="FLOP budget C for the compute-optimal N and D (C = 6 N D), e.g. 1e21.", show_default=False
        ),
    ] = None,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for the intervals (0: none).")] = 100,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap resampling.")] = 0,
    confidence: Annotated[float, typer.Option(help="Interval coverage.")] = 0.95,
    png: Annotated[Path, typer.Option(help="Where to save the plot.")] = Path("runs/scaling_law.png"),
    json_out: JsonOption = None,
) -> None:
    """Fit L(N) and L(D) power laws and L(N, D) = E + A/N^alpha + B/D^beta, with bootstrap intervals.

    From each run directory: N = non-embedding parameters of its model, D = tokens trained
    (steps x global batch x sequence length), L = its final validation loss. The Chinchilla form
    is fitted as in Hoffmann et al. (approach 3): Huber loss on log-loss, L-BFGS from a grid.

    Examples:

      hpcpipe scaling-law fit runs/                   (every finished run under runs/)

      hpcpipe scaling-law fit runs.csv --flops 1e21 --bootstrap 200 --json fit.json  (params,tokens,loss)
    """
    import numpy as np

    from hpcpipe.bench.scaling_inputs import load_observations
    from hpcpipe.bench.scaling_law import Points, fit_all
    from hpcpipe.report.plots_bench import plot_scaling_law

    if bootstrap < 0 or not 0 < confidence < 1:
        raise UserError("--bootstrap must be >= 0 and --confidence between 0 and 1")
    points, skipped = load_observations(inputs)
    arrays = Points(*(np.array([p[k] for p in points], dtype=float) for k in ("params", "tokens", "loss")))
    result = fit_all(arrays, flops, bootstrap, seed, confidence)
    result.update(points=points, skipped=skipped)
    result["png"] = str(plot_scaling_law(points, result, png))
    if json_out != "-":
        _print_fit(result)
    write_json(result, json_out)


def _print_fit(result: dict[str, Any]) -> None:
    intervals = result["intervals"]
    pct = f"{result['confidence']:.0%}"
    table = Table(
        "law",
        "parameter",
        "value",
        f"{pct} interval",
        title=f"scaling-law fit: {result['n_points']} runs, {result['bootstrap']} bootstrap resamples",
    )
    rows: list[tuple[str, str, float]] = [
        ("L(N) = (N_c/N)^alpha", k, v) for k, v in result["kaplan_n"].items()
    ]
    rows += [("L(D) = (D_c/D)^alpha", k, v) for k, v in result["kaplan_d"].items()]
    rows += [
        ("E + A/N^alpha + B/D^beta", k, result["chinchilla"][k]) for k in ("E", "A", "B", "alpha", "beta")
    ]
    keys = [f"kaplan_n.{k}" for k in result["kaplan_n"]] + [f"kaplan_d.{k}" for k in result["kaplan_d"]]
    keys += [f"chinchilla.{k}" for k in ("E", "A", "B", "alpha", "beta")]
    if "compute_optimal" in result:
        budget = f"C = {result['compute_optimal']['flops']:.3g} FLOPs"
        rows += [(budget, "N_opt", result["compute_optimal"]["params"])]
        rows += [(budget, "D_opt", result["compute_optimal"]["tokens"])]
        keys += ["compute_optimal.params", "compute_optimal.tokens"]
    for (law, name, value), key in zip(rows, keys, strict=True):
        low_high = intervals.get(key)
        shown = f"[{low_high[0]:.4g}, {low_high[1]:.4g}]" if low_high else "-"
        table.add_row(law, name, f"{value:.4g}", shown)
    print_whole(table)
    quality = result["quality"]
    console.print(
        f"L(N, D) log-loss RMSE: {quality['log_rmse']:.4f} in sample, {quality['loo_log_rmse']:.4f} "
        "leaving each run out (far above the first: it describes these runs, it predicts none)"
    )
    for line in result["skipped"]:
        console.print(f"[yellow]skipped[/yellow] {escape(line)}")
    console.print(f"plot: {result['png']}")
