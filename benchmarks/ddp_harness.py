"""What the DDP overhead benchmarks share: the ranks spawned on this host and joined into one
group, hpcpipe's Trainer for a job on a rank, a hand-written loop's parts (its batches and its
optimizer steps), and rank 0's result collected. The timing itself is ``harness.py``'s, with
every rank starting and ending each block together."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from harness import compare_loops, trainer_loop
from hpcpipe.config import JobConfig, ParallelConfig
from hpcpipe.recipes import build_recipe
from hpcpipe.train.trainer import Trainer


def timing_overrides(steps: int, batch: int, nproc: int) -> list[str]:
    """A job that only trains while timed: no end, no evaluation or checkpoint, a metrics row per
    timed block, ``batch`` per rank on ``nproc`` ranks, one micro-batch per step."""
    return [
        f"train.steps={10**6}",
        "train.eval_every=0",
        "checkpoint.every_steps=0",
        "observe.progress=false",
        f"observe.log_every={steps}",
        f"train.micro_batch_size={batch}",
        f"train.global_batch_size={batch * nproc}",
        f"parallel.nproc={nproc}",
    ]


def compare_on_rank(
    rank: int,
    job: JobConfig,
    port: int,
    out: Path,
    raw_loop: Callable[[JobConfig, Any, Any], Any],
    items_per_step: int,
    args: Any,
    warmup: int = 2,
) -> None:
    """One rank of an overhead benchmark: hpcpipe's Trainer for ``job`` and ``raw_loop(job, recipe,
    ctx)`` (an object with ``run(steps)``) timed in alternation (``args.repeats`` blocks of
    ``args.steps`` steps on ``args.nproc`` ranks); rank 0 writes the result to ``out``."""
    import torch

    ctx = join_group(rank, args.nproc, port, job.parallel)
    trainer = trainer_for(job, ctx, out / "hpcpipe")
    raw = raw_loop(job, trainer.recipe, ctx)
    loops = {"hpcpipe": trainer_loop(trainer), "raw": raw.run}
    result = compare_loops(loops, args.repeats, args.steps, items_per_step, warmup)
    trainer.close()
    finish(rank, {**result, "threads": torch.get_num_threads()}, out)


def join_group(rank: int, nproc: int, port: int, parallel: ParallelConfig) -> Any:
    """This spawned rank's place in a group of ``nproc`` ranks on this host, meeting at ``port``."""
    from hpcpipe.train.distributed import init_distributed
    from hpcpipe.train.environment import DistEnv

    env = DistEnv("torchrun", rank, rank, nproc, nproc, "127.0.0.1", port)
    return init_distributed(parallel, env)


def trainer_for(job: JobConfig, ctx: Any, run_dir: Path) -> Trainer:
    """hpcpipe's Trainer for ``job`` on this rank, its data prepared by local rank 0."""
    recipe = build_recipe(job)
    if ctx.local_rank == 0:
        recipe.prepare(progress=False)
    if dist.is_initialized():
        dist.barrier()
    run_dir.mkdir(parents=True, exist_ok=True)
    return Trainer(job, recipe, ctx, run_dir)


def finish(rank: int, result: dict[str, Any], out: Path) -> None:
    """Rank 0 writes ``result`` to ``out/result.json``; every rank leaves the group and exits
    (``os._exit``: gloo may abort at interpreter exit)."""
    if rank == 0:
        (out / "result.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


class SampledBatches:
    """What a hand-written DDP loop iterates: a DataLoader over a DistributedSampler, reshuffled
    at every epoch (``set_epoch``), endlessly."""

    def __init__(self, data: Any, micro_batch_size: int, rank: int, world_size: int, seed: int) -> None:
        from torch.utils.data import DataLoader, DistributedSampler

        self.sampler = DistributedSampler(data, world_size, rank, shuffle=True, seed=seed, drop_last=True)
        # Whole micro-batches only, as the trainer's: a short last batch would time fewer samples.
        self.loader = DataLoader(data, batch_size=micro_batch_size, sampler=self.sampler, drop_last=True)
        self.epoch = 0
        self.batches = iter(self.loader)

    def next(self) -> Any:
        try:
            return next(self.batches)
        except StopIteration:
            self.epoch += 1
            self.sampler.set_epoch(self.epoch)
            self.batches = iter(self.loader)
            return next(self.batches)


def raw_steps(
    model: Any, optimizer: Any, job: JobConfig, first_step: int, steps: int, loss_of: Callable[[], Any]
) -> int:
    """``steps`` hand-written optimizer steps from ``first_step``: the LR of the schedule,
    ``loss_of()`` (forward), backward, clip, step, and the loss read now and then as a script
    prints it; returns the last step."""
    import torch

    from hpcpipe.train.schedule import lr_at

    step = first_step
    for _ in range(steps):
        step += 1
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, job.train)
        loss = loss_of()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), job.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % job.observe.log_every == 0:
            loss.item()
    return step


def spawn(worker: Callable[..., None], args: tuple[Any, ...], nproc: int, out: Path) -> dict[str, Any]:
    """``worker(rank, *args)`` on ``nproc`` processes; the result rank 0 wrote to
    ``out/result.json`` (``finish``).

    The ranks fork from multiprocessing's fork server: the script's own process when its ``main``
    called ``ranks_fork_from_here`` first (its imports are theirs), else multiprocessing's usual
    server, where each rank imports the script itself as a spawned one did. The timed blocks start
    after every rank has joined the group and warmed up: how a rank started does not reach them."""
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(worker, *args), nprocs=nproc, start_method="forkserver")
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result


def _rank(rank: int, worker: Callable[..., None], *args: Any) -> None:
    """A rank started as hpcpipe starts its workers (``launch/fork_server.py
    begin_forked_worker``): the default signal dispositions and start method, so its DataLoader
    workers fork as in a run instead of asking the server's "forkserver" context for a server of
    their own; and its end when the script's process ends, killed or not."""
    from hpcpipe.launch.fork_server import begin_forked_worker

    begin_forked_worker()
    worker(rank, *args)


def ranks_fork_from_here() -> None:
    """Fork this process into the ranks' server now (``hpcpipe.launch.fork_server.prestart``): its
    imports are then the ranks' for free. First thing in ``main``: a process forked after torch
    computed (an OpenMP region) hangs at its own first one."""
    from hpcpipe.launch.fork_server import prestart

    prestart(())
