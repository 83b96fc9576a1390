"""Run a training job from the launching process: validate, prepare data, start the workers."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

from hpcpipe.config import JobConfig, check_layout, check_micro_batches, grad_accum_steps
from hpcpipe.errors import USER_ERROR_EXIT_CODE, UserError
from hpcpipe.launch import heap
from hpcpipe.layout import RunLayout
from hpcpipe.train.environment import detect_environment

if TYPE_CHECKING:
    from hpcpipe.data.stage import StageSource

log = logging.getLogger("hpcpipe.launch.job")

WORKER_MODULE = "hpcpipe.launch.worker"
# What every training worker imports, once in the agent's fork server (parallel.worker_start):
# the trainer, and what a worker imports after it on its way to the first step (fault injection,
# lineage, DDP's hooks, DCP's state dicts, NVTX); the recipe's own in ``worker_preload``.
WORKER_PRELOAD = (
    "hpcpipe.train.trainer",
    "torch._dynamo",
    "hpcpipe.train.fault_injection",
    "hpcpipe.observe.lineage",
    "torch.distributed.algorithms.ddp_comm_hooks",
    "torch.distributed.checkpoint.state_dict",
    "nvtx",  # optional (the nvtx extra): the server skips a module it cannot import
)


def worker_preload(job: JobConfig) -> tuple[str, ...]:
    """What the fork server imports for ``job``'s workers: ``WORKER_PRELOAD``, the recipe's own
    module and what it declares its workers import (``worker_imports``: its data pipeline, its
    model, heavy libraries); for DeepSpeed ranks on a machine without a GPU, DeepSpeed itself
    (``train/deepspeed_cpu_import.py``)."""
    from hpcpipe.recipes.registry import recipe_class
    from hpcpipe.train.environment import gpu_device_present

    recipe = recipe_class(job.run.recipe)
    deepspeed = job.parallel.strategy == "deepspeed" and not gpu_device_present()
    extra = ("hpcpipe.train.deepspeed_cpu_import",) if deepspeed else ()
    return (*WORKER_PRELOAD, recipe.__module__, *recipe.worker_imports, *extra)


def prestart_fork_server(job: JobConfig, max_restarts: int = 0, nproc: int | None = None) -> None:
    """Fork the workers' server from this process now, while it has only read its config
    (``launch/fork_server.py``): the verbs that start local workers call it before the data
    preparation. ``nproc``: the most ranks of the runs to come, where they differ from the job's
    (``bench scaling``). Nothing to do for one in-process worker, under an external launcher, or
    with ``parallel.worker_start: spawn``."""
    ranks = nproc or job.parallel.nproc
    if detect_environment().is_external or (ranks == 1 and max_restarts == 0):
        return
    prestart_node_fork_server(job)


def prestart_node_fork_server(job: JobConfig) -> None:
    """``prestart_fork_server`` for a node agent (``hpcpipe launch agent``), which always starts
    its workers through the fork server unless ``parallel.worker_start`` is spawn or each worker
    starts under a profiler (``launch/nsight.py``)."""
    from hpcpipe.launch.nsight import profiles_workers

    if job.parallel.worker_start != "forkserver" or profiles_workers(job.observe.profile):
        return
    from hpcpipe.launch.fork_server import prestart

    prestart((WORKER_MODULE, *worker_preload(job)))


class WorkerFailure(RuntimeError):
    """The worker group ended with a non-zero exit code."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(f"training workers failed with exit code {exit_code}")
        self.exit_code = exit_code


def run_job(job: JobConfig, max_restarts: int = 0) -> Path:
    """Train ``job`` and return its run directory.

    Under an external launcher (torchrun, srun, Kubeflow) this process *is* a worker. Otherwise
    ``parallel.nproc`` local workers are started through the elastic agent (one process without
    restarts trains in-process). Bad input raises UserError before any worker starts, and so do
    new training settings for a run that trained to its last step (nothing would train); a
    preempted in-process run raises ``Preempted`` (its checkpoint is committed).
    """
    from hpcpipe.launch.finished import refuse_finished_run

    heap.settle()  # the launcher's (or this worker's) imports are done: frozen
    env = detect_environment()
    if env.is_external:
        from hpcpipe.launch.nsight import unwrapped_warning
        from hpcpipe.launch.worker import train_worker

        check_world(job, env.world_size, env.local_world_size)
        # Every rank reads the same run directory: all refuse together. Not a job counted in
        # epochs: its steps need the prepared data, which one rank per node prepares in
        # train_worker while the others wait; it judges those there (every rank preparing here
        # at once read the whole dataset once per rank).
        refuse_finished_run(job, prepare=False)
        # observe.profile.tool nsys/ncu: no agent here to start this process under the tool.
        if env.rank == 0 and (warning := unwrapped_warning(job.observe.profile)):
            log.warning("%s", warning)
        train_worker(job, env, refuse_finished_epochs=True)
        return job.run_dir

    from hpcpipe.launch import nsight
    from hpcpipe.train import fault_injection

    nproc = job.parallel.nproc
    check_world(job, nproc, nproc)
    fault_injection.check(os.environ)  # the workers' fork server would abort on a bad value
    run_dir = job.run_dir
    # Under Nsight every worker is its own process: checked before the data preparation.
    wrapper = nsight.worker_wrapper(job.observe.profile, run_dir, nsight.report_tag(job.run.name))
    check_memory_limit(job)  # before the data preparation, as every other check of the input
    refuse_finished_run(job)  # before prepare_job writes to the run directory
    config_path = prepare_job(job)
    nsight.make_report_dir(job.observe.profile, run_dir)
    if nproc == 1 and max_restarts == 0 and not wrapper:
        from hpcpipe.launch.worker import train_worker

        train_worker(job, env)
        return run_dir

    from hpcpipe.launch.local import launch_local

    with node_memory_tier(job):  # this process is the node's agent: the tier lives as long as it
        code = launch_local(
            WORKER_MODULE,
            [str(config_path)],
            nproc=nproc,
            max_restarts=max_restarts,
            start_method=job.parallel.worker_start,
            preload=worker_preload(job),
            wrapper=wrapper,
            events_dir=str(run_dir),
            grace_s=job.fault.agent_grace_s,
            preempt_exit_code=job.fault.preempt_exit_code,
        )
    if wrapper and job.observe.profile is not None and job.observe.profile.tool == "nsys":
        nsight.export_stats(run_dir, job.observe.profile.nsys)  # for `hpcpipe profile RUN_DIR`
    if code == USER_ERROR_EXIT_CODE:
        raise UserError(f"a worker rejected the job (see its message above); run dir: {run_dir}")
    if code != 0:
        raise WorkerFailure(code)
    return run_dir


def node_memory_tier(job: JobConfig) -> contextlib.AbstractContextManager[Path | None]:
    """The node's checkpoint memory tier (``checkpoint/memory_tier.py``), owned by the calling
    agent process for the ``with`` block; UserError when ``checkpoint.memory_limit_gb`` exceeds
    ``/dev/shm``. A no-op when the job does not checkpoint or turned the tier off."""
    if not job.checkpoint.memory_tier or job.checkpoint.every_steps == 0:
        return contextlib.nullcontext()
    from hpcpipe.checkpoint.memory_tier import owned
    from hpcpipe.checkpoint.tiers import fast_root

    return owned(fast_root(job.checkpoint.dir, job.run_dir), job.checkpoint.memory_limit_gb)


def check_memory_limit(job: JobConfig) -> None:
    """UserError when ``checkpoint.memory_limit_gb`` is larger than this node's ``/dev/shm``."""
    from hpcpipe.checkpoint.memory_tier import SHM_ROOT, limit_bytes

    if job.checkpoint.memory_tier and job.checkpoint.memory_limit_gb is not None and SHM_ROOT.is_dir():
        limit_bytes(job.checkpoint.memory_limit_gb)


def prepare_inputs(job: JobConfig) -> None:
    """The recipe's data (and model) preparation: idempotent, keyed by the inputs' hash, so every
    node may run it; bad input raises UserError here, before any worker starts."""
    from hpcpipe.recipes import build_recipe

    build_recipe(job).prepare(progress=sys.stderr.isatty())  # no progress frames in CI logs


def stage_source(job: JobConfig, progress: bool = False) -> StageSource | None:
    """The files of the dataset ``job`` reads (prepared or verified first), as its recipe stages
    them to ``data.cache_dir``; None when its data have no file manifest to stage by."""
    from hpcpipe.recipes import build_recipe

    return cast("StageSource | None", build_recipe(job).stage_source(progress))


def prepare_job(job: JobConfig) -> Path:
    """Everything before the workers: ``prepare_inputs``, then the run directory; returns the
    config file the workers read.

    That is the run's config.yaml for a new run (or an unchanged config). A run directory that
    holds another config keeps it: the workers read a copy in this launcher's temporary
    directory, and rank 0 writes config.yaml once the run's checkpoint has loaded, so a job its
    checkpoints refuse (another model shape, say) leaves the run as it was."""
    prepare_inputs(job)
    job.run_dir.mkdir(parents=True, exist_ok=True)
    config_path = RunLayout(job.run_dir).config
    text = job.to_yaml()
    if config_path.is_file() and config_path.read_text() != text:
        import uuid

        from hpcpipe.launch.exit_dirs import exit_dir

        config_path = Path(exit_dir()) / f"config-{uuid.uuid4().hex[:8]}.yaml"
    config_path.write_text(text)
    return config_path


def check_world(job: JobConfig, world_size: int, ranks_per_node: int) -> None:
    """ConfigError unless the job's layout (parallel.tp, pp) and batch split fit this world."""
    p = job.parallel
    check_layout(p.tp, world_size, ranks_per_node, p.pp)
    accum = grad_accum_steps(job.train, world_size, p.tp, p.pp)
    check_micro_batches(p, accum)


def check_node_range(job: JobConfig, per_node: int) -> None:
    """Every world size the job can run at (each node count in parallel.nnodes) must split the
    global batch; otherwise the job would fail on the nodes after waiting in the queue."""
    low, high = job.parallel.node_range
    for nodes in range(low, high + 1):
        check_world(job, nodes * per_node, per_node)
