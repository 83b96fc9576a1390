"""The `hpcpipe` entry point: registers each verb group and turns UserError into exit code 2."""

from __future__ import annotations

import signal
import sys

import typer

from hpcpipe.cli import accept as accept_cli
from hpcpipe.cli import analysis as analysis_cli
from hpcpipe.cli import bench as bench_cli
from hpcpipe.cli import chaos as chaos_cli
from hpcpipe.cli import ckpt as ckpt_cli
from hpcpipe.cli import data as data_cli
from hpcpipe.cli import doctor as doctor_cli
from hpcpipe.cli import evaluate as evaluate_cli
from hpcpipe.cli import hpo as hpo_cli
from hpcpipe.cli import jobs as jobs_cli
from hpcpipe.cli import launch as launch_cli
from hpcpipe.cli import lineage as lineage_cli
from hpcpipe.cli import new as new_cli
from hpcpipe.cli import plan as plan_cli
from hpcpipe.cli import presets as presets_cli
from hpcpipe.cli import profile as profile_cli
from hpcpipe.cli import recipes as recipes_cli
from hpcpipe.cli import report as report_cli
from hpcpipe.cli import sweep as sweep_cli
from hpcpipe.cli import track as track_cli
from hpcpipe.cli import train as train_cli
from hpcpipe.errors import USER_ERROR_EXIT_CODE, UserError, one_line, path_error
from hpcpipe.launch import heap
from hpcpipe.launch.exit import finish_as_exit_would, flush_and_exit
from hpcpipe.recipes.registry import RecipeImportError

app = typer.Typer(
    name="hpcpipe",
    help="Train deep-learning jobs from a laptop to multi-node GPU clusters with one config.\n\n"
    "Start with `hpcpipe run quickstart`; list jobs with `hpcpipe presets list`.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from hpcpipe import __version__

        typer.echo(f"hpcpipe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
) -> None:
    """Train deep-learning jobs from a laptop to multi-node GPU clusters with one config."""


app.add_typer(presets_cli.app, name="presets")
app.add_typer(recipes_cli.app, name="recipes")
app.add_typer(recipes_cli.app, name="recipe", hidden=True)  # `hpcpipe recipe check NAME` reads well too
app.add_typer(new_cli.app, name="new")
app.add_typer(data_cli.app, name="data")
app.add_typer(ckpt_cli.app, name="ckpt")
app.command("train")(train_cli.train)
app.command("run")(train_cli.run)
app.add_typer(bench_cli.app, name="bench")
app.command("accept")(accept_cli.accept)
app.command("doctor")(doctor_cli.doctor)
app.command("roofline")(analysis_cli.roofline)
app.command("profile")(profile_cli.profile)
app.add_typer(analysis_cli.scaling_law_app, name="scaling-law")
app.command("sweep")(sweep_cli.sweep)
app.command("report")(report_cli.report)
app.command("lineage")(lineage_cli.lineage)
app.add_typer(track_cli.app, name="track")
app.command("register")(track_cli.register)
app.add_typer(track_cli.models_app, name="models")
app.add_typer(evaluate_cli.app, name="eval")
app.add_typer(hpo_cli.app, name="hpo")
app.add_typer(chaos_cli.app, name="chaos")
app.add_typer(launch_cli.app, name="launch")
app.add_typer(jobs_cli.app, name="jobs")
app.add_typer(plan_cli.app, name="plan")


def command() -> None:
    """The ``hpcpipe`` command (its console script, ``python -m hpcpipe``): ``main``, in a process
    of its own. torch's optimizers import torch._dynamo, which loads triton, and triton 3.9's
    nanobind bindings print ~60 lines of "leaked" objects at interpreter teardown
    (triton-lang/triton#11552): such a process does what exit does before its teardown, then
    leaves without it. (``main`` itself ends with SystemExit, for callers in their own process.)"""
    try:
        main()
    except SystemExit as exc:
        if "triton._C.libtriton" not in sys.modules:
            raise
        code = exc.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
            code = 1
        finish_as_exit_would()
        flush_and_exit(code or 0)


def main() -> None:
    heap.start_up()  # the collector mostly idle while the verb imports (launch/heap.py)
    code: int | str | None = 0
    try:
        app()
    except UserError as exc:
        # One line in one write: ranks that fail together (unbuffered) do not interleave theirs.
        sys.stderr.write(f"error: {one_line(str(exc))}\n")
        sys.stderr.flush()
        code = USER_ERROR_EXIT_CODE
    except RecipeImportError as exc:  # a bug in the recipe's module: its own traceback, exit 1
        sys.stderr.write(exc.report())
        sys.stderr.flush()
        code = 1
    except OSError as exc:
        if (error := path_error(exc)) is None:
            raise  # not about a path: a bug, with its traceback
        sys.stderr.write(f"error: {one_line(str(error))}\n")
        sys.stderr.flush()
        code = USER_ERROR_EXIT_CODE
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:  # Ctrl-C outside training (data preparation, a launcher, a study)
        sys.stderr.write("interrupted\n")
        code = 130
    except Exception as exc:
        if (signum := _torch_signal(exc)) is None:
            raise
        sys.stderr.write("interrupted\n" if signum == signal.SIGINT else f"stopped by {signum.name}\n")
        code = 128 + signum
    _exit(code)


def _torch_signal(exc: Exception) -> signal.Signals | None:
    """The signal of torch's SignalException: torch's agent raises it from the handlers it installs
    for SIGINT, SIGHUP and SIGQUIT while it runs workers (launch/agent.py puts the previous ones
    back, but one that arrives while it runs ends the launcher): 128 + N, as dying of it would."""
    api = sys.modules.get("torch.distributed.elastic.multiprocessing.api")  # only once torch ran
    if api is None or not isinstance(exc, api.SignalException):
        return None
    return signal.Signals(exc.sigval)


def _exit(code: int | str | None) -> None:
    """Exit; a process that was a gloo/NCCL rank leaves through os._exit after flushing.

    gloo sometimes aborts at interpreter exit after ``destroy_process_group`` (SIGABRT), which
    would turn a finished torchrun/srun worker into a failed one.
    """
    distributed = sys.modules.get("hpcpipe.train.distributed")
    if distributed is None or not distributed.joined_a_group():
        sys.exit(code)
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    flush_and_exit(code or 0)


if __name__ == "__main__":
    main()
