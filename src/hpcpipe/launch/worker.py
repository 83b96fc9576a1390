"""Worker entry points: ``python -m hpcpipe.launch.worker RUN_DIR/config.yaml`` (an external
``torchrun``, ``srun``, the Kubeflow operator) and ``forked_main`` (the local elastic agent's fork
server). Either joins the group, trains, tears down and leaves without interpreter teardown.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from hpcpipe.config import JobConfig, load_config
from hpcpipe.errors import USER_ERROR_EXIT_CODE, UserError, paths_are_input
from hpcpipe.launch.exit import (
    PEER_LOST_EXIT_CODE,
    a_refusal_was_said,
    first_to_say,
    flush_and_exit,
    lost_a_peer,
    lost_a_peer_in_a_collective,
    return_or_exit,
)
from hpcpipe.launch.fork_server import begin_forked_worker
from hpcpipe.launch.launcher_watch import start_ticks, watch_the_launcher
from hpcpipe.layout import RunLayout
from hpcpipe.recipes.registry import RecipeImportError
from hpcpipe.train.environment import DistEnv, detect_environment, node_name
from hpcpipe.train.preempt import INTERRUPT_EXIT_CODE, Preempted

if TYPE_CHECKING:
    from hpcpipe.train.distributed import DistContext


def train_worker(job: JobConfig, env: DistEnv, refuse_finished_epochs: bool = False) -> None:
    """Train ``job`` as the rank described by ``env`` (joins and leaves the process group).
    ``refuse_finished_epochs``: no agent judged whether a job counted in epochs asks a finished run
    for no more steps with new settings (torchrun, srun: ``run_job``); judged once its data are
    prepared, by every rank alike (the same files), before the run directory is written."""
    import torch.distributed as dist

    from hpcpipe.launch.finished import refuse_finished_run
    from hpcpipe.observe.lineage import (
        build_lineage,
        with_earlier_dataset,
        with_earlier_starts,
        write_lineage,
    )
    from hpcpipe.observe.prometheus import remove_sd_targets
    from hpcpipe.recipes import build_recipe
    from hpcpipe.train.distributed import init_distributed, shutdown_distributed
    from hpcpipe.train.fault_injection import hold_until_world, installed
    from hpcpipe.train.trainer import Trainer

    running = time.time()  # trainer code runs: imported (free in a forked worker)
    ctx = init_distributed(job.parallel, env)
    # (process start, code running, process group up) of this rank: group_start carries the latest.
    timing = (process_start_time(), running, time.time())
    try:
        with paths_are_input():  # checkpoint.dir a file, and the like: one line, exit 2
            recipe = build_recipe(job)
            # One preparer per node (idempotent, keyed by the inputs' hash); the rest reuse it.
            if ctx.local_rank == 0:
                recipe.prepare(progress=False)
        ctx.barrier()
        if refuse_finished_epochs and job.train.epochs is not None:
            refuse_finished_run(job, prepare=False, recipe=recipe)
        run_dir = job.run_dir
        ranks: list[tuple[str, float | None, float, float]] = [(node_name(), *timing)]
        if ctx.is_distributed:
            gathered: list[object] = [None] * ctx.world_size
            dist.all_gather_object(gathered, ranks[0])
            ranks = cast("list[tuple[str, float | None, float, float]]", gathered)
        hosts = [str(r[0]) for r in ranks]
        if ctx.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            recipe.on_train_start(run_dir)
            _record_group_start(run_dir, ctx.world_size, hosts, _latest(ranks))
        ctx.barrier()
        hold_until_world(ctx.world_size)  # chaos only (HPCPIPE_CHAOS_HOLD): no step before the late node
        with paths_are_input():
            trainer = Trainer(job, recipe, ctx, run_dir, faults=installed(ctx.rank))
        ended = False  # finished, preempted or pruned: no longer a scrape target; a crash stays one
        try:
            _advertise_exporters(job, ctx, trainer.telemetry.exporter.serving_port)
            if ctx.is_main:  # once the checkpoint loaded: a job it refused leaves the run's files
                RunLayout(run_dir).config.write_text(job.to_yaml())
                lineage = build_lineage(job.config_hash(), recipe.dataset_hash(), hosts, ctx.world_size)
                lineage, earlier = with_earlier_dataset(run_dir, lineage, trainer.step)
                lineage = with_earlier_starts(run_dir, lineage, trainer.step)
                write_lineage(run_dir, lineage)
                if earlier is not None:
                    _note_dataset_change(run_dir, trainer.step, earlier, lineage["dataset_manifest_sha256"])
            trainer.fit()
            recipe.trained_step = trainer.step
            recipe.on_train_end(trainer.inference_model(), ctx.is_main, run_dir)
            ended = True
        except Preempted:  # and Pruned: a resumed run advertises itself again
            ended = True
            raise
        finally:
            trainer.close()  # its exporters stop serving
            if ended and ctx.local_rank == 0:  # now, not after on_run_end: up == 0 meanwhile (RankDown)
                remove_sd_targets(
                    Path(job.run.out_dir), job.observe.prometheus, run=job.run.name, node=node_name()
                )
        ctx.barrier()  # the group's last collective
        if ctx.is_main:
            from hpcpipe.observe.metrics import append_event

            recipe.on_run_end(run_dir)  # the other ranks are leaving, not waiting for it
            append_event(
                run_dir, "run_finished", step=trainer.step, world_size=ctx.world_size, epochs=job.train.epochs
            )
    finally:
        shutdown_distributed()


def _advertise_exporters(job: JobConfig, ctx: DistContext, port: int | None) -> None:
    """Local rank 0 writes its node's target file for Prometheus file discovery: the ports its
    ranks' exporters bound (every rank takes part). A port another process held is left out:
    Prometheus would scrape that process's metrics as this run's."""
    import torch.distributed as dist

    from hpcpipe.observe.prometheus import node_ports, write_sd_targets

    if job.observe.prometheus.port is None:  # the same on every rank: all skip the gather
        return
    served: list[tuple[str, int | None]] = [(node_name(), port)]
    if ctx.is_distributed:
        gathered: list[object] = [None] * ctx.world_size
        dist.all_gather_object(gathered, served[0])
        served = cast("list[tuple[str, int | None]]", gathered)
    if ctx.local_rank == 0:
        ports = node_ports(served, node_name())
        write_sd_targets(Path(job.run.out_dir), job.observe.prometheus, node_name(), ports, job.run.name)


def _note_dataset_change(run_dir: Path, step: int, earlier: str, now: str) -> None:
    """A run resumed on other data: said once, recorded in events.jsonl (lineage.json keeps both)."""
    from hpcpipe.observe.metrics import append_event

    append_event(run_dir, "dataset_changed", step=step, earlier=earlier, now=now)
    print(
        f"note: resumed at step {step} on another dataset ({earlier[:12]} -> {now[:12]}); "
        "lineage.json records both",
        file=sys.stderr,
        flush=True,
    )


def process_start_time() -> float | None:
    """When this process started, wall clock (Linux ``/proc``, to 10 ms; None elsewhere)."""
    started_ticks = start_ticks()
    if started_ticks is None:
        return None
    try:
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return time.time() - (uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _latest(ranks: list[tuple[str, float | None, float, float]]) -> dict[str, float | None]:
    """The group's start milestones: each the latest over the ranks (the group waits for it)."""
    starts = [r[1] for r in ranks if r[1] is not None]
    return {
        "worker_start": max(starts) if starts else None,  # the last worker process started
        "worker_running": max(r[2] for r in ranks),  # ... and runs trainer code
        "pg_up": max(r[3] for r in ranks),  # init_process_group returned everywhere
    }


def _record_group_start(
    run_dir: Path, world_size: int, hosts: list[str], timing: dict[str, float | None] | None = None
) -> None:
    """Log each (re)start of the worker group: the elastic agent's restart count, and a
    ``membership_change`` when the world size differs from the previous start's (a node was
    lost, or one joined). ``timing``: when the workers started, ran trainer code and had
    their process group (wall clock, the latest rank's), for the chaos suite's phases."""
    from hpcpipe.observe.metrics import append_event, read_events

    count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if count > 0:
        append_event(run_dir, "restart", restart_count=count)
    starts = [e for e in read_events(run_dir) if e.get("event") == "group_start"]
    nodes = sorted(set(hosts))
    if starts and starts[-1].get("world_size") != world_size:
        old = starts[-1].get("world_size")
        append_event(run_dir, "membership_change", old_world_size=old, new_world_size=world_size, nodes=nodes)
    append_event(
        run_dir, "group_start", world_size=world_size, nodes=nodes, restart_count=count, **(timing or {})
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m hpcpipe.launch.worker CONFIG`` (torchrun, srun, the operator, a spawned agent)."""
    watch_the_launcher()  # under a profiler hpcpipe's agent started: end when the agent ends
    flush_and_exit(run(sys.argv[1:] if argv is None else argv))


def forked_main(*args: str) -> None:
    """A worker forked from the local agent's fork server (``launch/agent.py``)."""
    begin_forked_worker()
    return_or_exit(run(list(args)))


def run(args: list[str]) -> int:
    """Train the job of ``args`` as this rank; the exit code (see ARCHITECTURE.md, exit codes)."""
    code = 0
    try:
        if len(args) != 1:
            raise UserError("usage: python -m hpcpipe.launch.worker RUN_DIR/config.yaml")
        train_worker(load_config(Path(args[0])), detect_environment())
    except UserError as exc:
        if first_to_say(str(exc)):  # the same refusal of every rank: one line per node
            sys.stderr.write(f"error: {exc}\n")  # one write: ranks' lines must not interleave
        code = USER_ERROR_EXIT_CODE
    except RecipeImportError as exc:  # a bug in the recipe's module: a restart imports it again
        report = exc.report()
        if first_to_say(report):  # every rank imports it: its traceback once per node
            sys.stderr.write(report)
        code = USER_ERROR_EXIT_CODE  # terminal (agent.terminal_exit_codes): no restart
    except Preempted as exc:
        world = int(os.environ.get("WORLD_SIZE", "1"))  # each rank says it stopped, and which it is
        print(f"rank {os.environ.get('RANK', '0')}: {exc}" if world > 1 else str(exc), file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C before the trainer's handler was installed: no traceback
        code = INTERRUPT_EXIT_CODE
    except BaseException as exc:
        if not lost_a_peer_in_a_collective(exc):
            import traceback

            traceback.print_exc()
            return PEER_LOST_EXIT_CODE if lost_a_peer(exc) else 1
        # A victim: the rank that failed first prints why (a one-line refusal, or its traceback);
        # this rank's traceback of gloo's "Connection reset by peer" would bury it.
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        rank = os.environ.get("RANK", "0")
        if not a_refusal_was_said():  # a peer's one-line refusal is the whole story
            sys.stderr.write(f"rank {rank}: lost a peer ({message}); the rank that failed says why\n")
        code = PEER_LOST_EXIT_CODE
    return code


if __name__ == "__main__":
    main()
