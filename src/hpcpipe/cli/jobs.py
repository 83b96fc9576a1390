"""`hpcpipe jobs status|logs|cancel`: a submitted Slurm job (by its id or run directory) or
Kubernetes job (by the run directory `launch k8s --submit` recorded it in)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hpcpipe.cli.common import JsonOption, console, print_table, write_json
from hpcpipe.cli.launch_k8s import ContextOption, KubeconfigOption
from hpcpipe.errors import UserError

app = typer.Typer(
    help="Follow and stop jobs submitted with `hpcpipe launch slurm` or `hpcpipe launch k8s --submit`.",
    no_args_is_help=True,
)

JobArg = Annotated[
    str,
    typer.Argument(
        help="A Slurm job id (123, or 123_4 for an array task), or the run or sweep directory "
        "`hpcpipe launch slurm` or `hpcpipe launch k8s --submit` printed.",
        show_default=False,
    ),
]


def _k8s_job(job: str):  # type: ignore[no-untyped-def]  # K8sJobRef | None
    from hpcpipe.launch.k8s_cluster import SUBMISSION_FILE, resolve

    return resolve(Path(job)) if (Path(job) / SUBMISSION_FILE).is_file() else None


@app.command("status")
def status(
    job: JobArg,
    json_out: JsonOption = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
) -> None:
    """Slurm: state, exit code, run time, nodes and requeue count of the job (each array task),
    from scontrol while slurmctld remembers the job, from sacct after that. Kubernetes: the
    job's conditions and its pods (phase, node, restarts)."""
    from hpcpipe.launch.slurm_jobs import job_states, resolve_job

    if (ref := _k8s_job(job)) is not None:
        _k8s_status(ref, json_out, kubeconfig, context)
        return

    rows = job_states(resolve_job(job).job_id)
    if json_out != "-":
        keys = ("job", "state", "exit_code", "elapsed", "nodes", "restarts")
        cells = [[str(row.get(key, "-")) for key in keys] for row in rows]
        headers = ("job", "state", "exit", "elapsed", "nodes", "restarts")
        print_table(headers, cells, typed={"job", "nodes"})
    write_json(rows, json_out)


def _k8s_status(ref, json_out: str | None, kubeconfig: Path | None, context: str | None) -> None:  # type: ignore[no-untyped-def]
    from hpcpipe.launch import k8s_cluster

    state = k8s_cluster.status(k8s_cluster.connect(kubeconfig, context), ref)
    if json_out != "-":
        conditions = (
            ", ".join(f"{c['type']}={c['status']}" for c in state["conditions"]) or "no conditions yet"
        )
        console.print(f"{state['job']} in {state['namespace']}: {conditions}")
        cells = [[pod["pod"], pod["phase"], pod["node"], str(pod["restarts"])] for pod in state["pods"]]
        print_table(("pod", "phase", "node", "restarts"), cells, typed={"pod", "node"})
    write_json(state, json_out)


@app.command("logs")
def logs(
    job: JobArg,
    tail: Annotated[int, typer.Option(min=0, help="Last N lines of each log (0: all).")] = 100,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
) -> None:
    """Print the job's output: Slurm's file(s), one per job or array task (appended across
    requeues); on Kubernetes, each pod's training container."""
    from hpcpipe.launch.slurm_jobs import log_files, resolve_job

    if (ref := _k8s_job(job)) is not None:
        from hpcpipe.launch import k8s_cluster

        for pod, text in k8s_cluster.logs(
            k8s_cluster.connect(kubeconfig, context), ref, tail or None
        ).items():
            console.rule(pod)
            console.print(text.rstrip("\n"), markup=False, highlight=False)
        return

    files = log_files(resolve_job(job))
    for path in files:
        lines = path.read_text(errors="replace").splitlines()
        console.rule(str(path))
        console.print("\n".join(lines[-tail:] if tail else lines), markup=False, highlight=False)


@app.command("cancel")
def cancel(
    job: JobArg,
    signal: Annotated[
        str | None,
        typer.Option(help="Send this signal instead of ending the job (USR1: checkpoint, exit 75, requeue)."),
    ] = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
) -> None:
    """Cancel the job with scancel, or send its tasks a signal (--signal USR1 preempts it). A
    Kubernetes job is deleted with its pods and ConfigMap (its checkpoints stay on the claim)."""
    from hpcpipe.launch.slurm_jobs import cancel_job, resolve_job

    if (k8s_ref := _k8s_job(job)) is not None:
        if signal:
            raise UserError("--signal is for Slurm jobs; a Kubernetes job is cancelled by deleting it")
        from hpcpipe.launch import k8s_cluster

        k8s_cluster.cancel(k8s_cluster.connect(kubeconfig, context), k8s_ref)
        console.print(f"deleted {k8s_ref.kind} {k8s_ref.namespace}/{k8s_ref.name}")
        return

    ref = resolve_job(job)
    cancel_job(ref.job_id, signal)
    what = f"sent {signal} to" if signal else "cancelled"
    console.print(f"{what} job {ref.job_id}")
