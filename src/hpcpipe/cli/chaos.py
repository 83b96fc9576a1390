"""`hpcpipe chaos`: declared fault scenarios against real training jobs, and the recovery table."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hpcpipe.cli.common import console, err_console
from hpcpipe.errors import UserError

if TYPE_CHECKING:
    from hpcpipe.chaos.report import ChaosReport

app = typer.Typer(
    help="Chaos suite: inject declared faults into real `hpcpipe train` jobs, many times, and "
    "publish how often recovery works.\n\nStart with `hpcpipe chaos run shipped --trials 1`.",
    no_args_is_help=True,
)

SHIPPED = ("shipped",)


def scenario_file(name: str) -> Path:
    """A shipped scenario file by name, or a path."""
    if name in SHIPPED:
        return Path(str(resources.files("hpcpipe.chaos").joinpath(f"scenarios/{name}.yaml")))
    return Path(name)


@app.command("run")
def run(
    ctx: typer.Context,
    scenarios: Annotated[
        str,
        typer.Argument(
            help="A scenario YAML file, or `shipped` (the scenarios hpcpipe ships).", show_default=False
        ),
    ],
    trials: Annotated[int, typer.Option("--trials", "-n", min=1, help="Trials per scenario.")] = 3,
    seed: Annotated[int, typer.Option("--seed", help="Where and when faults land derives from it.")] = 0,
    out: Annotated[Path, typer.Option("--out", "-o", help="Results directory (must be new).")] = Path(
        "runs/chaos"
    ),
    only: Annotated[
        list[str] | None,
        typer.Option("--only", help="Run only this scenario (repeatable).", show_default=False),
    ] = None,
    trial: Annotated[
        int | None,
        typer.Option(
            "--trial", min=0, help="Replay only this trial index (with --seed).", show_default=False
        ),
    ] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the directories of recovered trials too.")
    ] = False,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="Continue the run in OUT (same scenarios and --seed): skip recorded trials."
        ),
    ] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="A progress bar.")] = True,
) -> None:
    """Run every scenario TRIALS times; exit 1 when any trial did not recover.

    Writes OUT/trials.jsonl (a row per trial, with the command that replays it), then
    OUT/chaos.json, OUT/chaos.md and OUT/chaos-ttr.png (recovery times). Failed trials keep their
    directory (logs, run dirs) under OUT/SCENARIO/trial-NNNN.

    Examples:

      hpcpipe chaos run shipped --trials 50 --out runs/chaos-50

      hpcpipe chaos run shipped --only kill-a-rank --seed 0 --trial 7

      hpcpipe chaos run shipped --trials 100 --out runs/chaos-50 --resume   # 50 more each
    """
    from hpcpipe.chaos.runner import ChaosPlan, run_plan, worker_imports
    from hpcpipe.chaos.scenario import load_scenarios
    from hpcpipe.launch import zygote

    path = scenario_file(scenarios)
    chosen = load_scenarios(path)
    unknown = sorted(set(only or ()) - {s.name for s in chosen})
    if unknown:
        raise UserError(
            f"--only {unknown[0]!r}: no such scenario in {path} ({', '.join(s.name for s in chosen)})"
        )
    if only:
        chosen = [s for s in chosen if s.name in only]
    needs_root = [s.name for s in chosen if s.kind == "disk_full"]
    skipped: dict[str, str] = {}
    if needs_root and os.geteuid() != 0:  # each trial failed, counted as a recovery that did not happen
        if only:  # asked for by name
            raise UserError(f"scenario {needs_root[0]} mounts a small tmpfs, which needs root: run as root")
        chosen = [s for s in chosen if s.name not in needs_root]
        if not chosen:  # 0 trials would read PASS
            raise UserError(f"scenario {needs_root[0]} mounts a small tmpfs, which needs root: run as root")
        skipped = dict.fromkeys(needs_root, "it mounts a small tmpfs, which needs root")
        err_console.print(f"skipped {', '.join(needs_root)}: it mounts a small tmpfs, which needs root")
    # The replay line names `shipped` as the user wrote it; a file by its absolute path.
    label = Path(scenarios) if scenarios in SHIPPED else path.resolve()
    # The root command this verb runs under: the fuzz kinds run the whole CLI in-process.
    root = ctx.find_root().command
    plan = ChaosPlan(
        label, chosen, trials, seed, out.resolve(), trial, keep, resume, cli=root, skipped=skipped
    )
    # Before the progress bar starts its thread and before any trial computes: the trials'
    # `hpcpipe` runs fork from this process's imports (launch/zygote.py).
    zygote.prestart(worker_imports(plan.scenarios))
    run_plan(plan, progress=progress)
    if not _print_report(out).ok:  # every trial in OUT, those of an earlier run (--resume) too
        raise typer.Exit(1)


@app.command("report")
def report(
    results: Annotated[
        Path, typer.Argument(help="A `hpcpipe chaos run` --out directory.", show_default=False)
    ],
) -> None:
    """Write OUT/chaos.json, chaos.md and chaos-ttr.png from OUT/trials.jsonl, and print the table;
    exit 1 unless the verdict is PASS (a trial failed or lost data, or planned trials never ran)."""
    if not _print_report(results).ok:  # a script's check of a killed run must not read it as passed
        raise typer.Exit(1)


def _print_report(out: Path) -> ChaosReport:
    from hpcpipe.chaos.report import write_report

    try:
        written = write_report(out)
    except OSError as exc:
        raise UserError(f"cannot write the report into {out}: {exc.strerror or exc}") from None
    console.print(written.markdown_path.read_text(), markup=False, highlight=False, soft_wrap=True)
    return written
