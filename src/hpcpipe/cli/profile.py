"""`hpcpipe profile RUN_DIR`: what limits a finished (or running) training run, and what to try."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from hpcpipe.cli.common import JsonOption, console, print_whole, write_json
from hpcpipe.errors import UserError

if TYPE_CHECKING:
    from hpcpipe.observe.verdict import Verdict

_SHARE = dict(min=0.0, max=1.0, show_default=True)


def profile(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (holds metrics.jsonl).")],
    input_share: Annotated[
        float, typer.Option(help="Input-bound above this data-wait share of step time.", **_SHARE)
    ] = 0.05,
    comm_share: Annotated[
        float, typer.Option(help="Communication-bound above this exposed-communication share.", **_SHARE)
    ] = 0.20,
    host_share: Annotated[
        float, typer.Option(help="Host/launch-bound above this share of step time in no phase.", **_SHARE)
    ] = 0.15,
    gpu_busy: Annotated[
        float, typer.Option(help="Host/launch-bound below this GPU-busy fraction (trace or NVML).", **_SHARE)
    ] = 0.80,
    json_out: JsonOption = None,
) -> None:
    """Say whether a run is input-, communication-, host/launch- or compute-bound, with evidence.

    Reads the phase timers every run logs (metrics.jsonl: data wait, forward, backward, optimizer,
    exposed communication, step time), MFU and NVML GPU utilisation where present, the
    profiler trace when observe.profile recorded one (GPU kernel-busy fraction, top operators by self time),
    and the `nsys stats` CSV exports of an Nsight Systems run (profile/nsys/*_nvtx_sum.csv and
    *_cuda_gpu_kern_sum.csv: NVTX step and phase times, NCCL share of kernel time, top kernels).
    The limiter furthest over its threshold wins; none over: compute-bound. Only the run's last
    start counts (a resumed run's earlier attempts, their traces and events are left out), and
    its first logged row (warm-up). Thresholds default to the usual targets (DataLoader idle < 5%,
    communication < 20%, GPU busy > 80%).

    Examples:

      hpcpipe profile runs/quickstart

      hpcpipe train quickstart --set observe.profile.start_step=20 && hpcpipe profile runs/quickstart

      hpcpipe profile runs/big --input-share 0.10 --json verdict.json
    """
    from hpcpipe.observe.verdict import Thresholds, profile_run

    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    for option, share in (
        ("--input-share", input_share),
        ("--comm-share", comm_share),
        ("--host-share", host_share),
    ):
        if share <= 0:  # a share over a threshold of 0 divides by it
            raise UserError(f"{option} {share:g}: give a share above 0 (a share of step time, at most 1)")
    limits = Thresholds(input_share, comm_share, host_share, gpu_busy)
    verdict, trace = profile_run(run_dir, limits)
    if json_out != "-":  # standard output holds the JSON alone, as doctor's does
        _print_verdict(run_dir, verdict, trace)
    write_json({**verdict.to_dict(), "trace": str(trace) if trace else None}, json_out)


def _print_verdict(run_dir: Path, verdict: Verdict, trace: Path | None) -> None:
    ev = verdict.evidence
    console.print(f"{escape(str(run_dir))}: a step takes {ev.step_time_s * 1000:.1f} ms (rank 0)")
    table = Table()
    table.add_column("phase")
    table.add_column("share", justify="right")
    for phase, share in ev.shares.items():
        table.add_row(phase, f"{share:.1%}")
    print_whole(table)
    extra = []
    if ev.mfu is not None:
        extra.append(f"MFU {ev.mfu:.1%}")
    if ev.gpu_busy is not None:
        extra.append(f"GPU busy {ev.gpu_busy:.0%} ({ev.gpu_busy_source})")
    extra.append(f"{ev.rows} logged rows" + (f", trace {trace.name}" if trace else ", no profiler trace"))
    console.print("evidence: " + "; ".join(extra))
    if ev.top_ops:
        ops = ", ".join(f"{escape(name)} {seconds * 1000:.1f} ms" for name, seconds in ev.top_ops[:5])
        console.print(f"top operators (traced steps, self time): {ops}")
    for line in ev.nsys.describe() if ev.nsys is not None else []:
        console.print(escape(line), soft_wrap=True)
    if ev.straggler:
        console.print(f"straggler: {escape(ev.straggler)}")
    console.print(f"[bold]verdict: {verdict.kind}[/bold]: {escape(verdict.reason)}")
    console.print("try:")
    for knob in verdict.knobs:
        console.print(f"  - {escape(knob)}")
