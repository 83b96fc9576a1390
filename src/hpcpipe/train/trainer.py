"""The training loop: one code path for a single process, DDP and FSDP2.

Read it top to bottom: ``Trainer.__init__`` builds the model, wraps it for the strategy, makes
the optimizer and loader, and resumes from the newest verified checkpoint; ``fit`` evaluates,
then runs ``train_step`` until ``train.steps``, logging, evaluating and checkpointing on
schedule, and stops cleanly when preempted. Everything workload-specific lives in the Recipe;
the fault-tolerance mechanisms live in their own modules (checkpoint/, train/oom.py,
train/preempt.py, observe/watchdog.py) and are only called from here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch

from hpcpipe.checkpoint.manifest import CheckpointError
from hpcpipe.checkpoint.store import CheckpointStore
from hpcpipe.checkpoint.tiers import fast_root
from hpcpipe.config import JobConfig, ParallelConfig, grad_accum_steps
from hpcpipe.config.changes import describe_changes
from hpcpipe.layout import RunLayout
from hpcpipe.observe.flops import has_convolutions
from hpcpipe.observe.metrics import EventLog, MetricsSink
from hpcpipe.observe.peers import peer_beats
from hpcpipe.observe.phases import PhaseTimer
from hpcpipe.observe.progress import TrainProgress
from hpcpipe.observe.prometheus import end_of_run_summary
from hpcpipe.observe.telemetry import RankInfo, Telemetry
from hpcpipe.observe.throughput import ThroughputMeter, peak_memory_bytes
from hpcpipe.observe.watchdog import Watchdog
from hpcpipe.recipes.base import Batch, PaddingBatch, Recipe, checked_loss, close_loader
from hpcpipe.track.sinks import Trackers
from hpcpipe.train import evaluation
from hpcpipe.train.deepspeed import deepspeed_engine
from hpcpipe.train.distributed import DistContext
from hpcpipe.train.divergence import host_values, require_finite_weights, require_healthy
from hpcpipe.train.environment import node_name
from hpcpipe.train.faults import NO_FAULTS, FaultInjector
from hpcpipe.train.mesh import build_layout, data_parallel_context, dropout_seed, same_rank_places
from hpcpipe.train.oom import OOMGuard, OOMNotRecoverable, agreement_all_reduce, oom_recovery_on
from hpcpipe.train.oom_restart import remember_halved_split, take_remembered_split
from hpcpipe.train.optim import build_optimizer, config_settings_kept
from hpcpipe.train.parallel import (
    GradNorm,
    gradient_sync,
    optimizer_step,
    resolve_strategy,
    shared_buffers,
    sync_buffers,
    time_gradient_sync,
    unwrap,
)
from hpcpipe.train.parallelize import parallelize
from hpcpipe.train.precision import Precision
from hpcpipe.train.preempt import Preempted, PreemptionHandler
from hpcpipe.train.resume_state import announce_schedule_change, capture_trainer_state, restore_trainer_state
from hpcpipe.train.schedule import resolve_steps, set_lr
from hpcpipe.train.trial import ENDED, Pruned, TrialLink

COMPILE_ALLOWANCE_S = 3600.0  # the first compiled step's hang timeout at most (below parallel.timeout_s)
# Evaluation batches between two preemption checks (one all-reduce each): an evaluation of many
# batches outlasted the agent's grace, which SIGKILLed the ranks with nothing checkpointed.
EVAL_PREEMPTION_CHECK_EVERY = 8


@dataclass
class StepOutput:
    loss: torch.Tensor  # () mean training loss of this rank's share of the global batch
    grad_norm: torch.Tensor | None  # () global gradient norm before clipping; None: not measured
    lr: float
    data_time_s: float


@dataclass
class FitResult:
    steps: int
    final_loss: float | None = None
    val_losses: dict[int, float] = field(default_factory=dict)


class Trainer:
    def __init__(
        self,
        job: JobConfig,
        recipe: Recipe,
        ctx: DistContext,
        run_dir: Path,
        faults: FaultInjector = NO_FAULTS,
    ) -> None:
        """Build the run in this order (each step may use what the previous ones made): the layout
        of the ranks, the model, its optimizer and precision, the data, the fault-tolerance guards,
        telemetry, the checkpoint store, the resume, then what reports progress."""
        self.cfg = resolve_steps(job.train, recipe.samples_per_epoch())  # train.epochs -> steps
        self.observe = job.observe
        self.recipe = recipe
        self.run_dir = run_dir
        self.events = EventLog(run_dir, enabled=ctx.is_main)
        accum = self._lay_out_ranks(job.parallel, ctx)
        units = self._build_model(job, accum)
        engine = self._build_optimizer(job, accum)
        self.loader = recipe.train_loader(self.layout.dp_rank, self.layout.dp)
        torch.manual_seed(dropout_seed(job.run.seed, self.layout))
        self.step = 0
        self._compiled = False  # this process ran its first (compiling) step
        # Below the process group's timeout, so the watchdog's stacks still come before it.
        self._compile_allowance_s = min(COMPILE_ALLOWANCE_S, 0.9 * job.parallel.timeout_s)
        self._guard_faults(job, units, accum)
        self._start_telemetry(job)
        self._open_store(job, engine, faults)
        try:
            self.resume(job)
            self.started_at_step = self.step
            self._take_oom_restart_split()
        except BaseException:
            self.telemetry.close()  # its exporter, GPU sampler and tracer would outlive the error
            raise
        self._start_reporting(job)

    def _lay_out_ranks(self, p: ParallelConfig, ctx: DistContext) -> int:
        """world = pp x dp x tp (train/mesh.py): the tp ranks of a group and the stages of a
        pipeline share data, loss and metrics. Returns the gradient-accumulation micro-steps."""
        self.layout = build_layout(p.tp, ctx, p.pp)
        self.ctx = data_parallel_context(ctx, self.layout)
        self.strategy = resolve_strategy(p.strategy, self.layout.dp, max(p.tp, p.pp))
        self.events.emit("layout", {"strategy": self.strategy, **self.layout.describe()})
        return grad_accum_steps(self.cfg, self.ctx.world_size, p.tp, p.pp)

    def _build_model(self, job: JobConfig, accum: int) -> Sequence[torch.nn.Module]:
        """The recipe's model, parallelized; returns its shard units (blocks)."""
        # Same seed on every rank: identical initial weights without a broadcast.
        torch.manual_seed(job.run.seed)
        model = self.recipe.build_model().to(self.ctx.device)
        units = self.recipe.shard_units(model)
        placed = (self.layout, self.strategy, self.ctx)
        self.model, self.pipeline = parallelize(
            self.recipe, model, units, job.parallel, self.cfg, placed, accum
        )
        self.grad_norm = GradNorm.of(self.layout, self.pipeline)
        self.sync_gradients = job.parallel.sync_gradients
        # Phase times; under DDP a hook marks the end of backward compute (exposed comm after it).
        self.phases = PhaseTimer(self.ctx.device)
        time_gradient_sync(self.model, self.phases.compute_done)
        # Rank 0's BatchNorm statistics before every evaluation and checkpoint (only where any).
        self.syncs_buffers = self.ctx.world_size > 1 and bool(shared_buffers(self.model))
        return units

    def _build_optimizer(self, job: JobConfig, accum: int) -> Any:
        """The optimizer and the precision policy; returns DeepSpeed's engine (None without it)."""
        self.optimizer = build_optimizer(self.model, self.cfg, self.ctx.device)
        engine = None
        if self.strategy == "deepspeed":  # DeepSpeed wraps model and optimizer together
            self.model, self.optimizer, _ = deepspeed_engine(self.model, self.optimizer, job, self.ctx, accum)
            engine = self.model
        self.precision = Precision(
            self.cfg.precision,
            self.ctx.device,
            sharded=self.strategy == "fsdp" or self.layout.tp > 1,
            engine=engine,
        )
        return engine

    def _guard_faults(self, job: JobConfig, units: Sequence[torch.nn.Module], accum: int) -> None:
        """OOM recovery, preemption and hang detection."""
        ctx = self.ctx
        recovers = oom_recovery_on(
            job.fault.oom_recovery, self.strategy, self.pipeline is not None, self.layout.tp > 1
        )
        self.oom = OOMGuard(self.cfg.micro_batch_size, accum, recovers, rank=ctx.rank)
        self.oom.attach(self.model, units)
        self.agree_max = agreement_all_reduce(ctx)
        self.preemption = PreemptionHandler(job.fault.preempt_grace_s, exit_code=job.fault.preempt_exit_code)
        # The OOM guard's agreement (every micro-step) carries the preemption flag: one
        # synchronisation per step, not two (train/preempt.py).
        self.step_agreement = None if self.agree_max is None else self.preemption.carried_by(self.agree_max)
        peers = peer_beats(ctx.rank, ctx.world_size, job.fault.hang_timeout_s)  # names a stopped peer
        self.watchdog = Watchdog(job.fault.hang_timeout_s, self.run_dir, ctx.rank, peers=peers)

    def _start_telemetry(self, job: JobConfig) -> None:
        """Prometheus exporter, GPU telemetry, imbalance checks, profiler window, NVTX and tracing
        (observe/); before the resume, whose events become trace spans."""
        ctx, recipe = self.ctx, self.recipe
        who = RankInfo(ctx.rank, ctx.local_rank, ctx.world_size, ctx.device, node_name())
        self.telemetry = Telemetry(
            self.observe, who, self.run_dir, job.run.name, recipe.name, recipe.throughput_unit, self.events
        )
        self.events.listeners.append(self.telemetry.on_event)
        self.phases.listeners.extend(self.telemetry.phase_listeners())

    def _open_store(self, job: JobConfig, engine: Any, faults: FaultInjector) -> None:
        """The checkpoint store (temporaries of an interrupted save removed) and the chaos faults."""
        self.ckpt_every = job.checkpoint.every_steps
        self.store = CheckpointStore(
            job.checkpoint,
            fast_root(job.checkpoint.dir, self.run_dir),
            self.ctx.rank,
            self.ctx.world_size,
            job.config_hash(),
            events=self.events.emit,
            trainable_only=self.recipe.checkpoint_trainable_only,
            engine="deepspeed" if engine is not None else "dcp",
            layout=self.layout.describe() if self.layout.mesh is not None else None,
        )
        self.faults = faults  # a no-op unless a chaos job installed one (train/faults.py)
        self.store.save_point = faults.at_save
        self.store.cleanup_temporaries()

    def _start_reporting(self, job: JobConfig) -> None:
        """Throughput, metrics.jsonl, the progress bar, trackers and the HPO trial: from the resumed step."""
        ctx, recipe = self.ctx, self.recipe
        self.meter = ThroughputMeter(
            items_per_step=self.cfg.global_batch_size * recipe.items_per_sample,
            unit=recipe.throughput_unit,
            world_size=ctx.world_size,
            flops_per_item=self._flops_per_item(),
            device=ctx.device,
            precision=self.cfg.precision,
            peak_tflops_override=self.observe.peak_tflops,
            convolutions=has_convolutions(self.model),
        )
        self.sink = MetricsSink(self.run_dir, start_step=self.step) if ctx.is_main else None
        self.progress = TrainProgress(total=self.cfg.steps, enabled=ctx.is_main and self.observe.progress)
        if self.layout.mesh is not None:
            self.progress.note(f"layout: {self.layout.summary()}, data parallel by {self.strategy}")
        # TensorBoard and MLflow (track/), rank 0: rows and events; never block or fail training.
        self.trackers = (
            Trackers.open(self.observe, self.run_dir, job.run.name, job.to_dict(), self.step)
            if ctx.is_main
            else Trackers([])
        )
        self.events.listeners.append(self.trackers.on_event)
        # An `hpcpipe hpo` trial (named in the environment): report evaluations, stop when pruned.
        self.trial = TrialLink(job.hpo, ctx.is_main)
        self.last_eval: dict[str, float] = {}

    # -- the loop ----------------------------------------------------------------------------

    def fit(self) -> FitResult:
        """Evaluate, then train and evaluate on schedule until ``train.steps``."""
        result = FitResult(steps=self.cfg.steps)
        self.preemption.install()
        try:
            with self.progress, self.watchdog:
                if self.step == 0 or evaluation.missed(
                    self.step, self.cfg, self.run_dir, self.ctx.is_main, self.agree_max
                ):
                    result.val_losses[self.step] = self.evaluate_and_log()
                    if self.step > 0:
                        self.report_to_study()
                start_step = self.step
                # Train mode whether or not an evaluation ran just now: a Hugging Face model comes
                # from from_pretrained in eval mode (no dropout, no gradient checkpointing).
                unwrap(self.model).train()
                self.telemetry.start(self.step + 1)
                while self.step < self.cfg.steps:
                    result.final_loss = self.train_until(evaluation.next_eval_step(self.step, self.cfg))
                    result.val_losses[self.step] = self.evaluate_and_log()
                    self.report_to_study()
                if self.ckpt_every > 0 and self.step > start_step:
                    self.save_checkpoint(final=True)
        finally:
            self.preemption.uninstall()
        return result

    def train_until(self, stop_step: int) -> float | None:
        """Train up to ``stop_step``, logging every ``observe.log_every``; the last logged loss."""
        last_loss = None
        self.meter.start()  # throughput intervals never include evaluation or start-up
        self.telemetry.after_pause()
        while self.step < stop_step:
            self.step += 1
            logs = self.step % self.observe.log_every == 0 or self.step == stop_step
            saves = self.ckpt_every > 0 and self.step % self.ckpt_every == 0 and self.step < self.cfg.steps
            with self._compiling():  # a step that saves measures its gradient norm: checked below
                out = self.train_step(measure_norm=logs or saves)
            self.meter.add_step(out.data_time_s, self.recipe.interval_counts())
            self.telemetry.on_step(self.meter.items_per_step / self.ctx.world_size)
            self.watchdog.beat(self.step)
            if logs:
                last_loss = self.log_train(out)
            if saves:
                if not logs:  # (a logged step's row was checked)
                    self._require_finite(*host_values(self.ctx.mean_over_ranks(out.loss), out.grad_norm))
                self.save_checkpoint()
            if self.preemption.should_stop(self.agree_max):
                self.stop_for_preemption()
            self.progress.advance(self.step)
        return last_loss

    def train_step(self, measure_norm: bool = True) -> StepOutput:
        """One optimizer step over this rank's share of the global batch (retried after an OOM).

        The gradient norm is computed when clipping needs it or ``measure_norm`` asks for it (a
        logged step): without clipping, reading every gradient once more per step is pure cost.
        """
        self.phases.begin_step(self.step)
        step_start = self.loader.state_dict()
        try:
            while (out := self._pipeline_step() if self.pipeline else self._forward_backward()) is None:
                # Some rank ran out of memory: every rank halves the micro-batch and retries the step
                self.recipe.interval_counts()  # (the cut attempt's counts: its micro-batches run again)
                self.telemetry.on_oom(self.step)
                event = self.oom.recover(self.step, self.optimizer, self.loader, step_start)
                self.events.emit("oom_recovered", event)
        except OOMNotRecoverable:  # the agent restarts every rank: with half the micro-batch
            remember_halved_split(self.oom, RunLayout(self.run_dir).oom_restart_split)
            raise
        loss_sum, data_time = out
        self.phases.begin("optimizer")  # the LR follows the updates taken: fp16 may skip some
        lr = set_lr(self.optimizer, self.step - self.precision.skipped_steps, self.cfg)
        grad_norm = optimizer_step(
            self.model, self.optimizer, self.precision, self.cfg.grad_clip, measure_norm, self.grad_norm
        )
        self.phases.end_step()
        return StepOutput(loss=loss_sum, grad_norm=grad_norm, lr=lr, data_time_s=data_time)

    def _forward_backward(self) -> tuple[torch.Tensor, float] | None:
        """Every micro-step's forward and backward; None when any rank ran out of memory."""
        accum = self.oom.accum_steps
        loss_sum = torch.zeros((), device=self.ctx.device)
        data_time = 0.0
        for micro in range(accum):
            self.phases.begin("data")
            t0 = time.perf_counter()
            batch = self._to_device(self.loader.next_microbatch())
            self.faults.at("data", self.step, micro)
            data_time += time.perf_counter() - t0
            self.phases.begin("forward")

            def forward(batch: Batch = batch, micro: int = micro) -> torch.Tensor:
                with self.precision.autocast():
                    loss = checked_loss(self.recipe.loss(self.model, batch))
                self.faults.at("forward", self.step, micro)
                # Until backward: the OOM guard's agreement when the backward has collectives
                # (DDP's last micro-step, FSDP2); train/oom.py's protocol.
                self.phases.begin("comm")
                return loss / accum if accum > 1 else loss

            # Gradients are synchronised on the last micro-step only (never when benchmarking a
            # step without communication: parallel.sync_gradients=false).
            def backward(loss: torch.Tensor, micro: int = micro) -> None:
                self.faults.at("backward", self.step, micro)  # inside the OOM guard, as a backward's OOM
                self._backward(loss)

            with gradient_sync(self.model, enabled=micro == accum - 1 and self.sync_gradients):
                loss = self.oom.micro_step(
                    forward,
                    backward,
                    final=micro == accum - 1,
                    all_reduce_max=self.step_agreement,
                    step=self.step,
                    micro=micro,
                )
            if loss is None:
                return None
            loss_sum += loss
        return loss_sum, data_time

    def _pipeline_step(self) -> tuple[torch.Tensor, float]:
        """Under pipeline parallelism: this rank's share of the global batch through the schedule
        (the accumulation steps are its micro-batches); the mean loss, on every rank."""
        self.phases.begin("data")
        t0 = time.perf_counter()
        micro = [self._to_device(self.loader.next_microbatch()) for _ in range(self.oom.accum_steps)]
        batch = tuple(torch.cat(parts) for parts in zip(*micro, strict=True))  # (accum x micro, ...)
        self.faults.at("data", self.step, 0)
        data_time = time.perf_counter() - t0
        self.phases.begin("forward")  # forward, backward and the stages' sends, interleaved
        self.faults.at("forward", self.step, 0)  # the chaos suite's sites: once per step here
        with self.precision.autocast():
            loss = self.pipeline.train_step(batch)  # type: ignore[union-attr]
        self.faults.at("backward", self.step, 0)  # after the schedule's last backward
        return loss, data_time

    def _backward(self, loss: torch.Tensor) -> None:
        self.phases.begin("backward")  # split at the DDP hook's mark: backward compute, then comm
        self.precision.backward(loss)
        # Until the next phase: the agreement when the backward has none (DDP's accumulation
        # micro-steps, one process); exposed communication either way.
        self.phases.begin("comm")

    @torch.no_grad()
    def evaluate(self) -> dict[str, float] | None:
        """The recipe's metrics (``val_loss``, ...) over every rank's evaluation batches; None when
        the ranks agreed to stop for a preemption part-way (a pipeline's schedule, which runs
        every batch in one call, is not stopped)."""
        if self.syncs_buffers:
            with self.phases.region("broadcast_buffers"):
                sync_buffers(self.model)  # every rank evaluates rank 0's BatchNorm statistics, as saved
        model = unwrap(self.model)
        model.eval()
        if self.pipeline is not None:  # the loss, through the stages in order, in train.precision
            with self.precision.autocast():
                batches = evaluation.device_eval_batches(self._eval_items(), self._to_device)
                totals = self.pipeline.evaluate_all(batches, self.ctx.dp_group)
            model.train()
            return self.recipe.eval_metrics(totals)
        should_stop = self.preemption.checked_every(EVAL_PREEMPTION_CHECK_EVERY, self.agree_max)
        sums = evaluation.eval_sums(
            model, self.recipe, self._eval_items(), self.precision.autocast, self._to_device, should_stop
        )
        model.train()
        if sums is None:
            return None
        with self.phases.region("all_reduce_eval"):  # the tp ranks of a group computed the same sums
            totals = evaluation.summed_over_ranks(sums, self.ctx.dp_group, self.layout.dp)
        return self.recipe.eval_metrics(totals)

    # -- checkpoints, resume, preemption ---------------------------------------------------------

    def save_checkpoint(self, final: bool = False) -> None:
        started = time.perf_counter()
        with self.watchdog.pause(), self.phases.region("checkpoint_save"):
            if self.syncs_buffers:
                with self.phases.region("broadcast_buffers"):
                    sync_buffers(self.model)
            self.store.save(self.step, self.model, self.optimizer, self.trainer_state(), force_durable=final)
            if final:
                self.store.wait()
        self.meter.exclude(time.perf_counter() - started)  # a save is no training: out of the rate
        self.telemetry.after_pause()

    def trainer_state(self) -> dict[str, Any]:
        """Everything beyond weights and optimizer that exact resume needs (this rank's part)."""
        items = self.recipe.items_per_sample
        args = (self.loader, self.oom, self.layout, self.ctx.world_size, self.precision)
        return capture_trainer_state(self.step, self.cfg, items, *args)

    def resume(self, job: JobConfig) -> None:
        """Load the newest verified checkpoint, if any (all ranks load the same step); one that
        refuses this job names the keys changed since the run's config.yaml."""
        started = time.perf_counter()
        try:
            with self.watchdog.pause(), config_settings_kept(self.optimizer):  # not the checkpoint's
                extra = self.store.restore(self.model, self.optimizer)
                if extra is not None and self.pipeline is not None:  # a checkpoint of any layout
                    self.pipeline.tie_copies(self.optimizer)
        except CheckpointError as exc:
            raise CheckpointError(f"{exc}{describe_changes(RunLayout(self.run_dir).config, job)}") from None
        if extra is None:
            return
        self.step = int(extra["step"])
        restored = self.store.restored
        recorded = restored.layout if restored is not None else None  # the manifest's, if any
        same_places = same_rank_places(extra, self.ctx.world_size, self.layout, recorded)
        restore_trainer_state(extra, self.loader, self.oom, self.precision, same_places)
        announce_schedule_change(extra, self.cfg, self.events.emit, self.ctx.is_main)
        self.events.emit(
            "resumed",
            {
                "step": self.step,
                "checkpoint": str(restored.path) if restored else None,
                "saved_world_size": int(extra["world_size"]),
                "world_size": self.ctx.world_size,
                "micro_batch_size": self.oom.micro_batch_size,
                "accum_steps": self.oom.accum_steps,
                "restore_s": time.perf_counter() - started,  # choosing, verifying, loading
            },
        )

    def _take_oom_restart_split(self) -> None:
        """The halved split an unrecoverable OOM left for this restart (train/oom_restart.py)."""
        taken = take_remembered_split(self.oom, RunLayout(self.run_dir).oom_restart_split, self.agree_max)
        if taken is not None:
            self.loader.set_micro_batch_size(self.oom.micro_batch_size)
            self.events.emit("oom_restart_split", {"step": self.step, **taken})

    def stop_for_preemption(self) -> NoReturn:
        """Every rank agreed to stop: checkpoint within the grace period, then exit. A preemption
        checkpoints a step trained since this start; Ctrl-C does where the job checkpoints
        (checkpoint.every_steps > 0). Nothing trained (stopped in the first evaluation): the start's
        own checkpoint stands; one taken at step 0 held an optimizer state of a step never taken.
        NaN weights are never saved: the run stops as diverged (a trial runs on, as in _require_finite)."""
        # Agreed on every rank (Ctrl-C reaches the whole process group, so all ranks saw SIGINT).
        trained = self.step > self.started_at_step
        save = trained and (not self.preemption.interrupted or self.ckpt_every > 0)
        self.preemption.start_grace_timer()  # before any collective: a rank may be gone
        if save and not self.trial.active:  # this step may be one the loop did not check
            require_finite_weights(self.step, self.model, self.agree_max, self.preemption.cancel)
        self.preemption.agree_signal(self.agree_max)  # for the event: which signal, on any rank
        if save:
            self.save_checkpoint(final=True)
        self.preemption.cancel()
        self.events.emit("preempted", {"step": self.step, "checkpointed": save, **self.preemption.describe()})
        raise Preempted(self.step, self.preemption.stop_exit_code, checkpointed=save)

    def report_to_study(self) -> None:
        """In an hpo trial: report this evaluation; every rank stops together when pruned."""
        why = self.trial.should_stop(self.step, self.last_eval, self.agree_max)
        if why is None or self.step >= self.cfg.steps:  # the last report completes the trial
            return
        if why != ENDED:  # ended: the study failed it (its worker went silent); a retry may own the dir
            self.save_checkpoint(final=True)
            metric = self.last_eval.get(self.trial.metric)
            self.events.emit("pruned", {"step": self.step, "why": why, self.trial.metric: metric})
        raise Pruned(self.step, why)

    # -- logging -----------------------------------------------------------------------------

    def log_train(self, out: StepOutput) -> float:
        with self.phases.region("all_reduce_metrics"):  # the loss and the interval's item counts
            loss = self.ctx.mean_over_ranks(out.loss)
            counts = self.ctx.sum_over_ranks(self.meter.take_counts())
        row: dict[str, Any] = {
            "step": self.step,
            "loss": loss.item(),
            "lr": out.lr,
            **self.precision.skipped_row(),  # fp16: steps without an update so far
            "grad_norm": None if out.grad_norm is None else float(out.grad_norm),
            **self.meter.read(counts),
            **self.phases.read(),
            "mem_bytes": peak_memory_bytes(self.ctx.device),
            "world_size": self.ctx.world_size,
            "time": time.time(),  # wall clock: `hpcpipe chaos` measures time to recover with it
        }
        row.update(self.telemetry.on_row(row))  # a collective on check steps: every rank calls it
        samples = self.recipe.samples_per_epoch()
        if samples:
            steps_per_epoch = samples / self.cfg.global_batch_size
            row["epoch"] = self.step / steps_per_epoch
            row["time_per_epoch_s"] = row["step_time_s"] * steps_per_epoch
        self._write(row)
        self.progress.show(row)
        self._require_finite(row["loss"], row["grad_norm"])
        return float(row["loss"])

    def _require_finite(self, loss: float, grad_norm: float | None) -> None:
        """Stop a diverged run before it saves (train/divergence.py; under fp16 also one whose
        loss scaler skips every step). An HPO trial runs on: its non-finite metric is told to the
        study as the worst value."""
        if not self.trial.active:
            require_healthy(self.step, loss, grad_norm, self.cfg.grad_clip, self.precision)

    def evaluate_and_log(self) -> float:
        with self.watchdog.pause(), self.phases.region("evaluate"), evaluation.streams_kept(self.ctx.device):
            metrics = self.evaluate()
        if metrics is None:  # outside streams_kept: the checkpoint holds the training's streams
            self.stop_for_preemption()
        self.last_eval = metrics
        self.telemetry.on_eval(metrics)
        row = {"step": self.step, **metrics, "time": time.time()}  # as train rows: when, for trackers
        self._write(row)
        self.progress.show(row)
        return metrics["val_loss"]

    def _flops_per_item(self) -> float | None:
        # After the resume restored the streams: the recipe may read a sample (an augmentation).
        with evaluation.streams_kept(self.ctx.device):
            flops = self.recipe.flops_per_sample()
        return None if flops is None else flops / self.recipe.items_per_sample

    def inference_model(self) -> torch.nn.Module:
        """The model to call for generation/export: unwrapped from DDP, as-is under FSDP2."""
        return unwrap(self.model)

    def close(self) -> None:
        """Finish a checkpoint in flight and background work; close the metrics files."""
        self.watchdog.stop()
        try:
            try:
                close_loader(self.loader)
            finally:  # a loader's failing close still lets the checkpoint in flight finish
                self.store.close()  # the last checkpoint's verification and durable copy emit events
        finally:  # even when the store raises a failed save: close the trackers after those
            # events (they reach TensorBoard and MLflow), flush spans, stop the GPU sampler
            self.trackers.close(finished=self.step >= self.cfg.steps)
            self.telemetry.close(end_of_run_summary(self.step, self.cfg.steps))
        if self.sink is not None:
            self.sink.close()

    # -- helpers -----------------------------------------------------------------------------

    def _compiling(self) -> contextlib.AbstractContextManager[None]:
        """This process's first compiled step gets COMPILE_ALLOWANCE_S before the watchdog calls it
        hung: compiling takes minutes on large models, and ended healthy runs as hung (exit 3); a
        hang in that step (a collective's first setup) is still caught, later."""
        if self.cfg.compile and not self._compiled:
            self._compiled = True
            return self.watchdog.allowing(self._compile_allowance_s)
        return contextlib.nullcontext()

    def _write(self, row: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink.write(row)
        self.trackers.on_row(row)

    def _eval_items(self) -> Iterable[Batch | PaddingBatch]:
        return self.recipe.eval_batches(self.layout.dp_rank, self.layout.dp)

    def _to_device(self, batch: Batch) -> Batch:
        return tuple(t.to(self.ctx.device, non_blocking=True) for t in batch)
