"""`hpcpipe doctor`: one table of environment and cluster checks (and --json)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from hpcpipe.cli.common import JsonOption, print_whole, write_json

_STYLE = {"OK": "green", "WARN": "yellow", "FAIL": "bold red", "SKIPPED": "dim"}


def doctor(
    run_dir: Annotated[
        Path, typer.Option(help="Where runs will be written: its disk and file system are checked.")
    ] = Path("runs"),
    json_out: JsonOption = None,
) -> None:
    """Check this node for what breaks or slows training jobs, in a few seconds.

    CPU, memory, the run directory's disk, Python and torch builds, CUDA and NCCL, every GPU
    through NVML (memory, driver, ECC errors, temperature, power, NVLink), GPU topology
    (nvidia-smi topo -m), InfiniBand/RDMA (ibstat, ibv_devinfo), Slurm (sinfo, scontrol),
    Lustre (lfs df), container runtimes, and NCCL/gloo environment variables. A tool that is
    not installed makes its check SKIPPED. Exits 1 when any check FAILs, else 0.

    Examples:

      hpcpipe doctor

      hpcpipe doctor --run-dir /lustre/project/runs --json doctor.json

      srun -N 4 --ntasks-per-node 1 bash -c 'hpcpipe doctor --json doctor-$(hostname).json'
    """
    from hpcpipe.doctor import FAIL, Probe, run_checks, worst_status

    checks = run_checks(Probe(run_dir=run_dir))
    table = Table("check", "status", "finding", title="hpcpipe doctor")
    for check in checks:
        style = _STYLE.get(check.status, "")
        table.add_row(escape(check.name), f"[{style}]{check.status}[/{style}]", escape(check.summary))
    if json_out != "-":
        print_whole(table, wraps={"finding"})
    worst = worst_status(checks)
    write_json({"status": worst, "checks": [c.to_dict() for c in checks]}, json_out)
    if worst == FAIL:
        raise typer.Exit(1)
