"""The training loop: one code path for a single process, DDP and FSDP2.

Read it top to bottom: ``Trainer.__init__`` builds the model, wraps it for the strategy, makes
the optimizer and loader; ``fit`` evaluates, then runs ``train_step`` until ``train.steps``,
logging and evaluating on schedule. Everything workload-specific lives in the Recipe.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpcpipe.config import JobConfig, grad_accum_steps
from hpcpipe.observe.metrics import MetricsSink
from hpcpipe.observe.progress import TrainProgress
from hpcpipe.observe.throughput import ThroughputMeter, peak_memory_bytes
from hpcpipe.recipes.base import Batch, Recipe
from hpcpipe.train.distributed import DistContext
from hpcpipe.train.optim import build_optimizer
from hpcpipe.train.parallel import (
    apply_parallelism,
    clip_grad_norm,
    gradient_sync,
    resolve_strategy,
    unwrap,
)
from hpcpipe.train.precision import Precision
from hpcpipe.train.schedule import lr_at


@dataclass
class StepOutput:
    loss: torch.Tensor  # () mean training loss of this rank's share of the global batch
    grad_norm: torch.Tensor  # () global gradient norm before clipping
    lr: float
    data_time_s: float


@dataclass
class FitResult:
    steps: int
    final_loss: float | None = None
    val_losses: dict[int, float] = field(default_factory=dict)


class Trainer:
    def __init__(self, job: JobConfig, recipe: Recipe, ctx: DistContext, run_dir: Path) -> None:
        self.cfg = job.train
        self.observe = job.observe
        self.recipe = recipe
        self.ctx = ctx
        self.run_dir = run_dir
        self.strategy = resolve_strategy(job.parallel.strategy, ctx.world_size)
        self.accum_steps = grad_accum_steps(job.train, ctx.world_size)

        # Same seed on every rank: identical initial weights without a broadcast.
        torch.manual_seed(job.run.seed)
        model = recipe.build_model().to(ctx.device)
        units = recipe.shard_units(model)
        if self.cfg.compile:
            # Compile blocks before FSDP2 wraps them (per-block graphs), the whole model otherwise.
            for module in units if self.strategy == "fsdp" else [model]:
                module.compile()
        self.model = apply_parallelism(model, self.strategy, ctx, units)
        self.optimizer = build_optimizer(self.model, self.cfg, ctx.device)
        self.precision = Precision(self.cfg.precision, ctx.device, sharded=self.strategy == "fsdp")
        self.loader = recipe.train_loader(ctx.rank, ctx.world_size)
        # Dropout streams differ per rank (the data differ too); still a function of the seed.
        torch.manual_seed(job.run.seed + ctx.rank)
        self.step = 0

        self.meter = ThroughputMeter(
            items_per_step=self.cfg.global_batch_size * recipe.items_per_sample,
            unit=recipe.throughput_unit,
            world_size=ctx.world_size,
            flops_per_item=_per_item(recipe.flops_per_sample(), recipe.items_per_sample),
            device=ctx.device,
            precision=self.cfg.precision,
            peak_tflops_override=self.observe.peak_tflops,
        )
        self.sink = MetricsSink(run_dir, start_step=self.step) if ctx.is_main else None
        self.progress = TrainProgress(total=self.cfg.steps, enabled=ctx.is_main and self.observe.progress)

    # -- the loop ----------------------------------------------------------------------------

    def fit(self) -> FitResult:
        """Evaluate, then train and evaluate on schedule until ``train.steps``."""
        result = FitResult(steps=self.cfg.steps)
        with self.progress:
            result.val_losses[self.step] = self.evaluate_and_log()
            while self.step < self.cfg.steps:
                result.final_loss = self.train_until(self._next_eval_step())
                result.val_losses[self.step] = self.evaluate_and_log()
        return result

    def train_until(self, stop_step: int) -> float | None:
        """Train up to ``stop_step``, logging every ``observe.log_every``; the last logged loss."""
        last_loss = None
        self.meter.start()  # throughput intervals never include evaluation or start-up
        while self.step < stop_step:
            self.step += 1
            out = self.train_step()
            self.meter.add_step(out.data_time_s)
            if self.step % self.observe.log_every == 0 or self.step == stop_step:
                last_loss = self.log_train(out)
            self.progress.advance(self.step)
        return last_loss

    def train_step(self) -> StepOutput:
        """One optimizer step over this rank's share of the global batch."""
        lr = lr_at(self.step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=self.ctx.device)
        data_time = 0.0
        for micro in range(self.accum_steps):
            t0 = time.perf_counter()
            batch = self._to_device(self.loader.next_microbatch())
            data_time += time.perf_counter() - t0
            # Gradients are synchronised on the last micro-step only.
            with gradient_sync(self.model, enabled=micro == self.accum_steps - 1):
                with self.precision.autocast():
                    loss = self.recipe.loss(self.model, batch) / self.accum_steps
                self.precision.backward(loss)
            loss_sum += loss.detach()
        self.precision.unscale(self.optimizer)
        grad_norm = clip_grad_norm(self.model, self.cfg.grad_clip)
        self.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        return StepOutput(loss=loss_sum, grad_norm=grad_norm, lr=lr, data_time_s=data_time)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean validation loss over every rank's fixed evaluation batches."""
        model = unwrap(self.model)
        model.eval()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
        count = 0
        for batch in self.recipe.eval_batches(self.ctx.rank, self.ctx.world_size):
            with self.precision.autocast():
                loss = self.recipe.loss(model, self._to_device(batch))
            loss_sum += loss.double() * len(batch[0])
            count += len(batch[0])
        model.train()
        totals = torch.stack([loss_sum, loss_sum.new_tensor(count)])  # (2,) sum, count
        if self.ctx.is_distributed:
            dist.all_reduce(totals)
        return float(totals[0] / totals[1])

    # -- logging -----------------------------------------------------------------------------

    def log_train(self, out: StepOutput) -> float:
        loss = self.ctx.mean_over_ranks(out.loss)
        row: dict[str, Any] = {
            "step": self.step,
            "loss": loss.item(),
            "lr": out.lr,
            "grad_norm": float(out.grad_norm),
            **self.meter.read(),
            "mem_bytes": peak_memory_bytes(self.ctx.device),
            "world_size": self.ctx.world_size,
        }
        self._write(row)
        self.progress.show(row)
        return float(row["loss"])

    def evaluate_and_log(self) -> float:
        val_loss = self.evaluate()
        row = {"step": self.step, "val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 50.0))}
        self._write(row)
        self.progress.show(row)
        return val_loss

    def inference_model(self) -> torch.nn.Module:
        """The model to call for generation/export: unwrapped from DDP, as-is under FSDP2."""
        return unwrap(self.model)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()

    # -- helpers -----------------------------------------------------------------------------

    def _next_eval_step(self) -> int:
        every = self.cfg.eval_every
        if every <= 0:
            return self.cfg.steps
        return min(self.cfg.steps, (self.step // every + 1) * every)

    def _write(self, row: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink.write(row)

    def _to_device(self, batch: Batch) -> Batch:
        return tuple(t.to(self.ctx.device, non_blocking=True) for t in batch)


def _per_item(flops_per_sample: float | None, items_per_sample: int) -> float | None:
    return None if flops_per_sample is None else flops_per_sample / items_per_sample
