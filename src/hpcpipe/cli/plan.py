"""`hpcpipe plan goodput`: how often to checkpoint at each cluster size, from measured or given costs;
`hpcpipe plan memory` (plan_memory.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from hpcpipe.cli import plan_memory
from hpcpipe.cli.common import console, print_whole, write_text
from hpcpipe.errors import UserError
from hpcpipe.plan.failures import DEFAULT_GPU_MTBF_HOURS
from hpcpipe.plan.inputs import DEFAULT_RESTART_S, GivenTimes, resolve_inputs

if TYPE_CHECKING:
    from hpcpipe.plan.goodput import PlanSettings

app = typer.Typer(
    help="Plan a job before it runs at scale: its memory per GPU and layout, its checkpointing.",
    no_args_is_help=True,
)
app.command("memory")(plan_memory.memory)


def _seconds(help_text: str) -> Any:
    return typer.Option(help=help_text, show_default=False)


@app.command("goodput")
def goodput(
    run: Annotated[
        Path | None,
        typer.Option(
            "--run",
            help="A run directory: save, restore and restart times are read from its events.jsonl "
            "(medians), hpcpipe's current interval from its config and step times.",
            show_default=False,
        ),
    ] = None,
    save_s: Annotated[
        float | None, _seconds("Fast-tier checkpoint cost δ: what one save stops training for.")
    ] = None,
    restore_s: Annotated[
        float | None, _seconds("Fast-tier restore time (default: measured, else = save).")
    ] = None,
    restart_s: Annotated[
        float | None,
        _seconds(
            f"Restart after a failure, before the restore (default: measured, else {DEFAULT_RESTART_S:g})."
        ),
    ] = None,
    durable_save_s: Annotated[
        float | None, _seconds("Durable-tier checkpoint cost (shared file system); adds the durable rows.")
    ] = None,
    durable_restore_s: Annotated[
        float | None, _seconds("Durable-tier restore time (default: measured, else = durable save).")
    ] = None,
    gpu_mtbf_hours: Annotated[
        float,
        typer.Option(
            help="Mean time between failures of ONE GPU (with its share of host, network and software), "
            "in hours; the job's MTBF is this / GPUs. Default: Llama 3's 419 unexpected interruptions "
            "in 54 days on 16,384 GPUs = 54 x 24 x 16384 / 419.",
            show_default=f"{DEFAULT_GPU_MTBF_HOURS:,.0f}",
        ),
    ] = DEFAULT_GPU_MTBF_HOURS,
    gpus: Annotated[
        str, typer.Option(help="Cluster sizes to plan for, comma-separated.")
    ] = "1024,4096,16384",
    days: Annotated[float, typer.Option(help="Training time per simulated run, in days.")] = 30.0,
    replicas: Annotated[int, typer.Option(help="Simulated runs per row (Monte Carlo).")] = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the simulation.")] = 0,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Where goodput.json and goodput.png go (default: RUN/plan, else ./goodput-plan).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Goodput (the share of GPU time that trains) of periodic checkpointing at each cluster size,
    the optimal interval per checkpoint tier, and how far the costs are from losing 5%.

    Failures grow with the cluster: the job's MTBF is M = per-GPU MTBF / GPUs, about 3 h at
    16,384 GPUs with Llama 3's rate. A checkpoint that costs δ seconds is best taken every
    τ = sqrt(2 δ M) (Young) or Daly's higher-order τ; a failure costs the work since the last
    checkpoint plus R = restart + restore. Goodput is Daly's closed form under exponential
    failures, checked against a seeded Monte-Carlo simulation of the same model (agreement
    within 1% is printed). Each tier is planned as if it alone recovered every failure.

    The headroom table gives, per size, the largest δ at which the optimum still loses at most
    5% to checkpoints and rework, and the largest R at which everything together stays within
    5%, against the measured or given costs.

    Examples:

      hpcpipe plan goodput --run runs/tiny          (measured costs; writes runs/tiny/plan/)

      hpcpipe plan goodput --save-s 2 --restore-s 3 --restart-s 90 --gpus 16

      hpcpipe plan goodput --save-s 5 --restore-s 60 --restart-s 600 --durable-save-s 300

      hpcpipe plan goodput --run runs/tiny --gpu-mtbf-hours 25000   (twice Llama 3's rate)
    """
    from hpcpipe.layout import RunLayout
    from hpcpipe.plan.goodput import PlanSettings, plan_goodput
    from hpcpipe.plan.measured import read_run_times
    from hpcpipe.plan.plot import plot_goodput

    settings = PlanSettings(_cluster_sizes(gpus), gpu_mtbf_hours, days, replicas, seed)
    _check_settings(settings)
    if run is not None and not run.is_dir():
        raise UserError(f"--run {run}: no such run directory")
    given = GivenTimes(save_s, restore_s, restart_s, durable_save_s, durable_restore_s)
    inputs = resolve_inputs(given, read_run_times(run) if run is not None else None)
    plan = plan_goodput(inputs, settings)
    out_dir = out or (RunLayout(run).plan if run is not None else Path("goodput-plan"))
    plan["plot"] = str(out_dir / RunLayout.GOODPUT_PLOT)
    write_text(out_dir / RunLayout.GOODPUT_JSON, _json(plan))
    plot_goodput(plan, out_dir / RunLayout.GOODPUT_PLOT)
    _print_plan(plan)
    console.print(f"written: {escape(str(out_dir / RunLayout.GOODPUT_JSON))}, {escape(plan['plot'])}")


def _cluster_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(f"--gpus {text}: give whole numbers separated by commas, e.g. 1024,4096") from None
    if not sizes or min(sizes) < 1:
        raise UserError(f"--gpus {text}: every cluster size must be 1 or more")
    return sizes


def _check_settings(settings: PlanSettings) -> None:
    if not (math.isfinite(settings.gpu_mtbf_hours) and settings.gpu_mtbf_hours > 0):
        raise UserError(f"--gpu-mtbf-hours must be a number > 0 (got {settings.gpu_mtbf_hours:g})")
    if not (math.isfinite(settings.horizon_days) and settings.horizon_days > 0):
        raise UserError(f"--days must be a number > 0 (got {settings.horizon_days:g})")
    if settings.replicas < 2:
        raise UserError(f"--replicas must be 2 or more (got {settings.replicas})")


def _json(plan: dict[str, Any]) -> str:
    import json

    return json.dumps(plan, indent=2) + "\n"


def _print_plan(plan: dict[str, Any]) -> None:
    _print_costs(plan)
    _print_goodput(plan)
    _print_headroom(plan)
    gap, tolerance = plan["max_sim_gap"], plan["sim_tolerance"]
    settings = plan["settings"]
    if gap is None:  # every row had too many failures per run to simulate (goodput ~0)
        verdict = "[yellow]not simulated[/]"
    else:
        verdict = "[green]agree[/]" if gap <= tolerance else "[yellow]disagree: see the rows[/]"
    shown = f"{gap:.3%}" if gap is not None else "-"
    console.print(
        f"simulation: {settings['replicas']} runs of {settings['horizon_days']:g} days per row, seed "
        f"{settings['seed']}; largest |simulated - closed form| / closed form = {shown} "
        f"(tolerance {tolerance:.0%}): {verdict}"
    )
    for note in plan["notes"]:
        console.print(f"[yellow]note[/yellow] {escape(note)}")


def _print_costs(plan: dict[str, Any]) -> None:
    table = Table("cost", "seconds", "source", title="costs (R of a tier = restart + its restore)")
    for name, cost in plan["costs"].items():
        table.add_row(name.replace("_", " "), f"{cost['seconds']:.4g}", escape(cost["source"]))
    print_whole(table, wraps={"source"})


def _print_goodput(plan: dict[str, Any]) -> None:
    headers = [
        "GPUs",
        "job MTBF",
        "tier",
        "δ",
        "R",
        "τ Young",
        "τ Daly",
        "goodput",
        "simulated ±s.e.",
        "ckpt share",
    ]
    table = Table(
        *headers,
        title=f"goodput at Daly's interval (per-GPU MTBF {plan['settings']['gpu_mtbf_hours']:,.0f} h)",
    )
    for row in plan["rows"]:
        sim = row["goodput_sim"]
        simulated = f"{sim:.3%} ±{100 * row['goodput_sim_stderr']:.1g}%" if sim is not None else "-"
        if row["sim_gap"] is not None and abs(row["sim_gap"]) > plan["sim_tolerance"]:
            simulated = f"[yellow]{simulated}[/]"
        table.add_row(
            f"{row['gpus']:,}",
            duration(row["job_mtbf_s"]),
            row["tier"],
            duration(row["delta_s"]),
            duration(row["restart_s"]),
            duration(row["tau_young_s"]),
            duration(row["tau_daly_s"]),
            f"{row['goodput']:.3%}",
            simulated,
            f"{row['checkpoint_share']:.2%}",
        )
    print_whole(table)


def _print_headroom(plan: dict[str, Any]) -> None:
    budget = f"{plan['loss_budget']:.0%}"
    headers = ["GPUs", "tier", "δ", f"δ at {budget}", "δ headroom", "R", f"R at {budget}", "R headroom"]
    table = Table(
        *headers, "τ now", "goodput now", title=f"headroom: costs at which the optimum loses {budget}"
    )
    for row in plan["rows"]:
        restart_5 = row["restart_at_budget_s"]
        table.add_row(
            f"{row['gpus']:,}",
            row["tier"],
            duration(row["delta_s"]),
            duration(row["delta_at_budget_s"]),
            _factor(row["delta_headroom"]),
            duration(row["restart_s"]),
            duration(restart_5) if restart_5 is not None else "[red]δ alone[/]",
            _factor(row["restart_headroom"]),
            duration(row["current_tau_s"]) if row["current_tau_s"] else "-",
            f"{row['goodput_current']:.3%}" if row["goodput_current"] is not None else "-",
        )
    print_whole(table)


def _factor(headroom: float | None) -> str:
    """``x12`` (the cost can grow 12-fold before it costs the budget), red below 1 (over it)."""
    if headroom is None:
        return "-"
    shown = f"x{headroom:,.0f}" if headroom >= 100 else f"x{headroom:.3g}"
    return shown if headroom >= 1 else f"[red]{shown}[/]"


def duration(seconds: float) -> str:
    """A duration in the unit that reads best: 54 ms, 12.3 s, 5.5 min, 3.09 h, 2.1 d."""
    for unit, size, below in (
        ("ms", 1e-3, 1.0),
        ("s", 1.0, 120.0),
        ("min", 60.0, 7200.0),
        ("h", 3600.0, 172800.0),
    ):
        if seconds < below:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds / 86400:.3g} d"
