"""What the DDP overhead benchmarks share: hpcpipe's Trainer for a job on this rank, timed blocks
of two loops alternated on every rank in lockstep, and the ranks spawned with their result
collected from rank 0."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hpcpipe.config import JobConfig
from hpcpipe.recipes import build_recipe
from hpcpipe.train.trainer import Trainer

Loop = Callable[[int], Any]  # run N optimizer steps


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


def timed(fn: Loop, steps: int, items_per_step: int) -> float:
    """Items per second of ``steps`` steps of ``fn``, every rank starting and ending together."""
    if dist.is_initialized():
        dist.barrier()
    start = time.perf_counter()
    fn(steps)
    if dist.is_initialized():
        dist.barrier()
    return items_per_step * steps / (time.perf_counter() - start)


def alternate(
    a: Loop, b: Loop, repeats: int, steps: int, items: int, warmup: int = 2
) -> tuple[list[float], list[float]]:
    """Interleaved timed blocks of ``a`` and ``b``: a b, b a, a b, ... after a warm-up each."""
    a(warmup), b(warmup)
    xs: list[float] = []
    ys: list[float] = []
    for i in range(repeats):
        order = [(a, xs), (b, ys)] if i % 2 == 0 else [(b, ys), (a, xs)]
        for fn, out in order:
            out.append(timed(fn, steps, items))
    return xs, ys


def report(
    benchmark: str, result: dict[str, Any], rate: tuple[str, str], target: float, fields: dict[str, Any]
) -> None:
    """The rates side by side, the ratio of the medians (the figure) and a JSON line.

    ``rate`` is (unit as printed, its JSON key stem), e.g. ("tok/s", "tokens_per_s"). Beside the
    figure, the median of each repeat's own ratio (its two blocks ran back to back): steadier
    where the machine's speed drifts (CPU steal on a shared host)."""
    from run_context import print_rates, run_context

    hp, rw = statistics.median(result["hpcpipe"]), statistics.median(result["raw"])
    paired = statistics.median(x / y for x, y in zip(result["hpcpipe"], result["raw"], strict=True))
    print_rates("loop", rate[0], {"hpcpipe": result["hpcpipe"], "raw": result["raw"]})
    print(f"ratio hpcpipe/raw = {hp / rw:.3f} (target >= {target}); median of paired blocks {paired:.3f}")
    line = {
        "benchmark": benchmark,
        f"hpcpipe_{rate[1]}": round(hp, 1),
        f"raw_{rate[1]}": round(rw, 1),
        "ratio": round(hp / rw, 4),
        "paired_ratio": round(paired, 4),
        "target": target,
    }
    print(json.dumps({**line, **fields, **run_context()}))


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

    from hpcpipe.train.distributed import init_distributed
    from hpcpipe.train.environment import DistEnv

    env = DistEnv("torchrun", rank, rank, args.nproc, args.nproc, "127.0.0.1", port)
    ctx = init_distributed(job.parallel, env)
    trainer = trainer_for(job, ctx, out / "hpcpipe")
    raw = raw_loop(job, trainer.recipe, ctx)
    ours = lambda n: trainer.train_until(trainer.step + n)  # noqa: E731
    hp, rw = alternate(ours, raw.run, args.repeats, args.steps, items_per_step, warmup)
    trainer.close()
    finish(rank, {"hpcpipe": hp, "raw": rw, "threads": torch.get_num_threads()}, out)


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
    """``worker(rank, *args)`` on ``nproc`` spawned processes; rank 0 writes ``out/result.json``."""
    import torch.multiprocessing as mp

    mp.start_processes(worker, args=args, nprocs=nproc, start_method="spawn")
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result
