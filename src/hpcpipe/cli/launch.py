"""`hpcpipe launch`: submit a job to Slurm, and the pieces its batch script runs on the nodes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hpcpipe.cli import launch_k8s, launch_kfp
from hpcpipe.cli.common import ConfigArg, GridOption, SetOption, console, err_console, scheduler_overrides
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout

if TYPE_CHECKING:
    from hpcpipe.config import JobConfig
    from hpcpipe.launch.agent import AgentSpec


class ProfileTool(StrEnum):
    """``launch slurm --profile``: the Nsight tool the workers of observe.profile.ranks start under."""

    nsys = "nsys"
    ncu = "ncu"


app = typer.Typer(
    help="Submit jobs to a cluster scheduler (Slurm, Kubernetes), and the per-node agent they start.",
    no_args_is_help=True,
)
app.command("k8s")(launch_k8s.k8s)
app.command("helm-values")(launch_k8s.helm_values)
app.command("kfp")(launch_kfp.kfp)


@app.command("slurm")
def slurm(
    config: ConfigArg,
    sets: SetOption = None,
    nodes: Annotated[
        str | None,
        typer.Option(help="Nodes: N, or MIN:MAX for an elastic run (parallel.nnodes).", show_default=False),
    ] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option(help="GPUs per node; also the workers per node.", show_default=False)
    ] = None,
    partition: Annotated[str | None, typer.Option(help="Slurm partition.", show_default=False)] = None,
    time_limit: Annotated[
        str | None, typer.Option("--time", help="Time limit, [D-]HH:MM:SS.", show_default=False)
    ] = None,
    grids: GridOption = None,  # one array task per point
    out: Annotated[
        Path | None,
        typer.Option(
            help="With --grid: the sweep directory (default: <run.out_dir>/sweep-<run.name>).",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the sbatch script; submit nothing.")
    ] = False,
    profile: Annotated[
        ProfileTool | None,
        typer.Option(
            help="Run the workers of observe.profile.ranks (default rank 0; `all`: every rank) under "
            "Nsight Systems (nsys) or Nsight Compute (ncu) over the observe.profile window "
            "(observe.profile.tool).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Render an sbatch script from the job's launch.slurm section and submit it.

    The script asks for one task per node and starts one hpcpipe agent per node through srun;
    the agents meet at a c10d rendezvous on the first node (the job id is the rendezvous id)
    and each starts the node's workers. On the preemption signal (launch.slurm.signal, sent
    launch.slurm.signal_grace_s before the time limit, or by `scancel --signal=USR1`), every
    rank checkpoints and the job exits 75; the script then requeues it (at most
    launch.slurm.max_requeues times, and only if the checkpoint advanced) and the requeued job
    resumes the same run directory.

    Examples:

      hpcpipe launch slurm gpt-124m --nodes 2 --gpus-per-node 8 --partition gpu --dry-run

      hpcpipe launch slurm quickstart --nodes 1:2 --set launch.slurm.env='{GLOO_SOCKET_IFNAME: eth0}'

      hpcpipe launch slurm tiny -g 'train.lr=\\[1e-3,3e-3]' -g 'run.seed=\\[0,1]'   (a 4-task array)

      hpcpipe launch slurm gpt-124m --nodes 2 --gpus-per-node 8 --profile nsys   (then hpcpipe profile)
    """
    from hpcpipe.launch import slurm as slurm_launch
    from hpcpipe.launch.finished import refuse_finished_run

    overrides = [*(sets or []), *_cli_overrides(nodes, gpus_per_node, partition, time_limit)]
    if profile is not None:
        overrides.append(f"observe.profile.tool={profile.value}")
    sub, points = _submission(config, overrides, grids or [], out)
    if dry_run:
        typer.echo(slurm_launch.render_sbatch(sub), nl=False)  # verbatim: no wrapping or markup
        return
    slurm_launch.require_sbatch()  # before anything is written
    for job in sub.jobs:  # a finished run's refusal now, not from the nodes once the job is queued
        refuse_finished_run(job, prepare=False)  # epochs' steps need the data: the nodes judge them
    slurm_launch.check_partition(sub.first.launch.slurm.partition)
    script = slurm_launch.write_submission(sub)
    if sub.sweep_dir is not None:
        from hpcpipe.sweep import collect_plan, write_plan

        write_plan(points, sub.sweep_dir)
        collect_plan(sub.sweep_dir)
    job_id = slurm_launch.submit(script)
    from hpcpipe.launch.slurm_jobs import SUBMISSION_FILE

    record = {"job_id": job_id, "script": str(script), "runs": [str(j.run_dir) for j in sub.jobs]}
    (script.parent / SUBMISSION_FILE).write_text(json.dumps(record, indent=1) + "\n")
    where = sub.sweep_dir or sub.first.run_dir
    console.print(f"submitted job [bold]{job_id}[/] ({len(sub.jobs)} run(s)); run directory: {where}")
    console.print(f"follow it: hpcpipe jobs status {job_id}; hpcpipe jobs logs {where}")


def _cli_overrides(nodes: str | None, gpus: int | None, partition: str | None, time: str | None) -> list[str]:
    more = {"launch.slurm.partition": partition, "launch.slurm.time": time}
    return scheduler_overrides(nodes, gpus, "launch.slurm.gpus_per_node", more)


def _submission(config: str, overrides: list[str], grids: list[str], out: Path | None):  # type: ignore[no-untyped-def]
    """(what to submit, the sweep points: empty without --grid), every config validated."""
    from hpcpipe.config import load_config
    from hpcpipe.launch.slurm import SlurmSubmission, check_world_sizes
    from hpcpipe.sweep import parse_grid_option, plan_points, sweep_dir_of

    job = load_config(config, overrides)
    if not grids:
        check_world_sizes(job)
        return SlurmSubmission([job], script_dir=job.run_dir), []
    sweep_dir = out or sweep_dir_of(job)
    points = plan_points(config, overrides, dict(parse_grid_option(item) for item in grids), sweep_dir)
    for point in points:
        check_world_sizes(point.job)
    sub = SlurmSubmission([p.job for p in points], script_dir=sweep_dir, sweep_dir=sweep_dir)
    return sub, points


@app.command("agent")
def agent(
    config: Annotated[Path, typer.Argument(help="The run's config.yaml.", show_default=False)],
    nnodes: Annotated[str, typer.Option(help="N or MIN:MAX nodes.", envvar="PET_NNODES")] = "1",
    nproc_per_node: Annotated[
        int, typer.Option(min=1, help="Workers on this node.", envvar="PET_NPROC_PER_NODE")
    ] = 1,
    rdzv_endpoint: Annotated[
        str | None,
        typer.Option(
            help="host:port of the rendezvous store (default: $PET_RDZV_ENDPOINT, else "
            "$PET_MASTER_ADDR:$PET_MASTER_PORT, else 127.0.0.1:29400).",
            envvar="PET_RDZV_ENDPOINT",
            show_default=False,
        ),
    ] = None,
    rdzv_id: Annotated[str, typer.Option(help="The same on every node of one job.")] = "hpcpipe",
    max_restarts: Annotated[
        int, typer.Option(min=0, help="Worker-group restarts.", envvar="PET_MAX_RESTARTS")
    ] = 0,
    grace: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="Seconds the workers get after a preemption (default: fault.agent_grace_s).",
            show_default=False,
        ),
    ] = None,
    local_addr: Annotated[
        str | None,
        typer.Option(
            help="This node's address for the others (default: $SLURMD_NODENAME).", show_default=False
        ),
    ] = None,
) -> None:
    """One node's agent: prepare the inputs, start its workers, join the rendezvous, exit with the
    workers' code.

    The sbatch script runs it on every node through srun; Kubeflow pods run it as their command,
    and like torchrun it takes its settings from the operator's PET_* variables (PET_NNODES,
    PET_NPROC_PER_NODE, PET_RDZV_ENDPOINT or PET_MASTER_ADDR/PORT, PET_MAX_RESTARTS). You can also
    start it by hand on each node (the same --rdzv-endpoint and --rdzv-id everywhere).
    A preemption signal (USR1) is passed to the workers, which checkpoint and exit 75; the agent
    then exits 75 too (torchrun's agent would report a failure).
    """
    import os

    from hpcpipe.config import load_config
    from hpcpipe.launch import nsight
    from hpcpipe.launch.agent import AgentPreempted, AgentSpec, stop_early_on_preemption
    from hpcpipe.launch.finished import refuse_finished_run
    from hpcpipe.launch.job import prestart_node_fork_server, worker_preload
    from hpcpipe.launch.rendezvous import split_endpoint

    job = load_config(config)  # bad config: one line, before anything starts
    low, _, high = nnodes.partition(":")
    if not (low.isdigit() and (high or low).isdigit()) or not 1 <= int(low) <= int(high or low):
        raise UserError(f"--nnodes {nnodes}: give N or MIN:MAX, 1 <= MIN <= MAX")
    _check_node_range(config, nnodes)
    endpoint = rdzv_endpoint or _endpoint_from_env(os.environ)
    try:
        split_endpoint(endpoint)
    except ValueError:
        raise UserError(f"--rdzv-endpoint {endpoint}: give HOST:PORT, the port in 0-65535") from None
    preempted = job.fault.preempt_exit_code
    # Under Nsight each worker starts as its own process under the tool (launch/nsight.py).
    wrapper = nsight.worker_wrapper(job.observe.profile, job.run_dir, nsight.report_tag(job.run.name))
    spec = AgentSpec(
        nproc_per_node=nproc_per_node,
        min_nodes=int(low),
        max_nodes=int(high or low),
        rdzv_endpoint=endpoint,
        rdzv_id=rdzv_id,
        max_restarts=max_restarts,
        local_addr=local_addr or os.environ.get("SLURMD_NODENAME"),
        grace_s=job.fault.agent_grace_s if grace is None else grace,
        last_call_s=job.parallel.rdzv_last_call_s,
        keep_alive_s=job.parallel.rdzv_keep_alive_s,
        keep_alive_misses=job.parallel.rdzv_keep_alive_misses,
        start_method=job.parallel.worker_start,
        preload=worker_preload(job),
        preempt_exit_code=preempted,
        wrapper=wrapper,
        events_dir=str(job.run_dir),
        ignore_sigterm_after_preemption=True,  # srun's SIGTERM to the nodes on their way out
    )
    stop_early_on_preemption(preempted)  # until the workers run: a signal now is a clean 75
    try:
        prestart_node_fork_server(job)  # before the data preparation computes anything
        # Every node reads the same run directory: all refuse together, before any worker starts.
        # After the two above: a job counted in epochs prepares its data here to count its steps.
        refuse_finished_run(job)
        code = _run_node_agent(job, config, spec)
    except AgentPreempted as exc:  # a signal in any step above (it was a traceback, exit 1)
        code = exc.exit_code
    if code == preempted:
        err_console.print(f"agent: preempted; exit {code} (any checkpoint the workers wrote is committed)")
    raise typer.Exit(code)


def _check_node_range(config: Path, nnodes: str) -> None:
    """The config's own checks of a node range (parallel.nnodes), for the one --nnodes gives:
    DeepSpeed refuses an elastic range, which --nnodes MIN:MAX got past."""
    from hpcpipe.config import load_config
    from hpcpipe.errors import ConfigError

    try:
        load_config(config, [f"parallel.nnodes={nnodes}"])
    except ConfigError as exc:
        raise UserError(f"--nnodes {nnodes}: {exc}") from None


def _endpoint_from_env(env: Mapping[str, str]) -> str:
    """TrainJob pods get torchrun's static master address; the c10d store runs there."""
    if "PET_MASTER_ADDR" in env:
        return f"{env['PET_MASTER_ADDR']}:{env.get('PET_MASTER_PORT', '29400')}"
    return "127.0.0.1:29400"


def _run_node_agent(job: JobConfig, config: Path, spec: AgentSpec) -> int:
    """Check every world size splits the batch, prepare the inputs, run the workers."""
    from hpcpipe.launch.agent import run_agent
    from hpcpipe.launch.job import WORKER_MODULE, check_world, node_memory_tier, prepare_inputs
    from hpcpipe.launch.nsight import make_report_dir

    for nodes in range(spec.min_nodes, spec.max_nodes + 1):  # workers would fail the same way, N times
        check_world(job, nodes * spec.nproc_per_node, spec.nproc_per_node)
    prepare_inputs(job)  # torch is imported already: about 1 s here, against 5 s as its own step
    make_report_dir(job.observe.profile, job.run_dir)
    with node_memory_tier(job):
        return run_agent(spec, WORKER_MODULE, [str(config)])


@app.command("finished")
def finished(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.", show_default=False)],
    config: Annotated[
        Path | None,
        typer.Option(
            help="The config the job ran (default: the run's config.yaml). A job resubmitted with "
            "more steps runs from its submitted copy until it resumed; judged by the run's older "
            "config.yaml, the earlier, shorter run's end would read as this job's.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Exit 0 when the run trained to its last step, 1 otherwise (for scripts: an elastic job
    whose lost node failed its task still finished on the others)."""
    from hpcpipe.config import load_config
    from hpcpipe.observe.metrics import trained_to_the_end

    train = load_config(config or RunLayout(run_dir).config).train
    steps = train.steps
    done = trained_to_the_end(run_dir, steps, train.epochs)
    console.print(f"{run_dir}: {'finished' if done else 'not finished'} (train.steps={steps})")
    raise typer.Exit(0 if done else 1)


@app.command("preempted")
def preempted(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.", show_default=False)],
    since: Annotated[
        float, typer.Option(help="Count only a preemption after this time (seconds since the epoch).")
    ] = 0.0,
) -> None:
    """Exit 0 when the run checkpointed on a preemption after SINCE, 1 otherwise, 2 when RUN_DIR is
    no run (for scripts: srun reports its highest task code, so an elastic job's node lost on the
    way, 137, hides the others' preemption code, and the job would not be requeued)."""
    from hpcpipe.config import load_config
    from hpcpipe.observe.metrics import read_events

    code = load_config(RunLayout(run_dir).config).fault.preempt_exit_code
    done = any(
        e.get("event") == "preempted"
        and e.get("checkpointed") is True
        and e.get("exit_code") == code
        and isinstance(e.get("time"), int | float)
        and e["time"] > since
        for e in read_events(run_dir)
    )
    said = "checkpointed on a preemption" if done else "no preemption checkpoint"
    console.print(f"{run_dir}: {said} since {since:.0f}")
    raise typer.Exit(0 if done else 1)


@app.command("collect")
def collect(
    sweep_dir: Annotated[
        Path, typer.Argument(help="The sweep directory of a job array.", show_default=False)
    ],
    finished: Annotated[
        Path | None, typer.Option(help="Mark this point's run directory finished first.", show_default=False)
    ] = None,
) -> None:
    """Rebuild a job array's sweep.csv from its points' run directories."""
    from hpcpipe.config import load_config
    from hpcpipe.sweep import collect_plan, mark_done

    if finished is not None:
        mark_done(load_config(RunLayout(finished).config))
    console.print(f"wrote {collect_plan(sweep_dir)}")
