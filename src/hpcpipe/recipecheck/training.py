"""The properties that need the trainer: real ``hpcpipe train`` runs compared step by step, the
checkpoint store's round trip, the exports loaded back, the evaluation's metrics, and the refusal
of bad recipe arguments."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from hpcpipe.chaos.jobs import last_line, losses, run_hpcpipe
from hpcpipe.config import JobConfig, apply_values
from hpcpipe.errors import ConfigError
from hpcpipe.layout import RunLayout
from hpcpipe.observe.metrics import read_metrics
from hpcpipe.recipecheck.job import KILL_STEP, STEPS
from hpcpipe.recipes.base import Recipe, close_loader
from hpcpipe.recipes.registry import recipe_class

RUN_TIMEOUT_S = 600.0


def train(
    work: Path,
    name: str,
    nproc: int,
    strategy: str,
    env: dict[str, str] | None = None,
    restarts: int = 0,
    preload: tuple[str, ...] = (),
) -> Path:
    """``hpcpipe train work/job.yaml`` as run ``name``; its run directory. RunFailed when it fails,
    with what a worker raised (else the run's last line of output) and the log that holds the
    rest. ``preload``: what the recipe's workers import (the runs are forked from a zygote that
    imports it once, ``launch/zygote.py``)."""
    sets = [f"run.name={name}", f"parallel.strategy={strategy}"]
    args = ["train", str(work / "job.yaml"), "--nproc", str(nproc), "--max-restarts", str(restarts)]
    args += [a for s in sets for a in ("--set", s)]
    # From this process's directory: the job's relative paths (data.prepared_dir) and a recipe
    # named by an import path resolve as they did here; the logs go to the work directory.
    proc = run_hpcpipe(args, Path.cwd(), RUN_TIMEOUT_S, env=env, log=name, log_dir=work, preload=preload)
    if proc.returncode != 0:
        what = worker_raised(proc.stderr) or last_line(proc.stderr)
        raise RunFailed(f"{name} run exited {proc.returncode}: {what} (log: {work / name}.err)")
    return work / "runs" / name


def worker_raised(stderr: str) -> str | None:
    """The exception line of the last traceback in a run's output (``RuntimeError: Expected to
    have finished reduction ...``): the launcher's last line says only that a worker failed."""
    lines = stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return None
    for line in lines[starts[-1] + 1 :]:
        if line.strip() and not line[0].isspace():  # the frames are indented; the exception is not
            raised = line.strip()
            return raised if len(raised) <= 300 else raised[:300] + "..."
    return None


def train_here(work: Path, name: str) -> Path:
    """The 1-process run in this process, as ``hpcpipe train`` runs one process without restarts
    (no interpreter to start; a process that has computed may start others: subprocesses exec)."""
    from hpcpipe.config import load_config
    from hpcpipe.launch.job import run_job

    return run_job(load_config(work / "job.yaml", [f"run.name={name}", "parallel.strategy=single"]))


def compare_series(
    reference: dict[int, float], other: dict[int, float], rtol: float, what: str = "loss"
) -> tuple[float, str | None]:
    """The largest relative difference of a per-step series (the training ``loss``, or the
    ``grad_norm``), and what is wrong (a missing step, a difference over ``rtol``, a non-finite
    value) or None."""
    worst = 0.0
    for step in range(1, STEPS + 1):
        want, have = reference.get(step), other.get(step)
        if want is None or have is None:
            return worst, f"no training {what} at step {step}"
        if not (math.isfinite(want) and math.isfinite(have)):
            return worst, f"a non-finite {what} at step {step}"
        worst = max(worst, abs(have - want) / max(abs(want), 1e-12))
        if worst > rtol:
            detail = f"{have:.8g} against {want:.8g} (relative {worst:.2g} > {rtol:g})"
            return worst, f"step {step}: {what} {detail}"
    return worst, None


def check_parity(single: Path, other: Path, what: str, rtol: float, against: str = "1 process") -> str:
    """The losses, and the gradient norms that clipping would use, of every step within ``rtol``
    of the reference run (1 process, or 2 DDP ranks where the data order depends on the world
    size). The check's runs do not clip (job.py): the norm is the one thing the layouts compute
    in another order, so it is compared here on its own rather than fed back into the weights,
    where a chaotic start amplifies its rounding."""
    _same_data(single, other, what, against)
    loss, problem = compare_series(losses(single), losses(other), rtol)
    norm, norm_problem = (
        (0.0, None) if problem else compare_series(_grad_norms(single), _grad_norms(other), rtol, "grad_norm")
    )
    if problem or norm_problem:
        raise AssertionError(f"{what} against {against}: {problem or norm_problem}")
    return (
        f"losses of {STEPS} steps within relative {loss:.1e} of {against}, gradient norms within "
        f"{norm:.1e} (tolerance {rtol:g})"
    )


def _same_data(single: Path, other: Path, what: str, against: str) -> None:
    """The two runs' processes built the same datasets (lineage's fingerprint): a recipe whose
    data differ between processes failed parity, blamed on DDP or FSDP2."""
    from hpcpipe.fsutil import read_json_object
    from hpcpipe.layout import RunLayout

    key = "dataset_manifest_sha256"
    mine, theirs = (read_json_object(RunLayout(run).lineage).get(key) for run in (single, other))
    if mine and theirs and mine != theirs:
        raise AssertionError(
            f"the {what} run built other data than {against} (dataset fingerprint {theirs[:12]} against "
            f"{mine[:12]}): datasets() must build the same data in every process (seed random data; "
            "no order taken from a set of strings)"
        )


def _grad_norms(run_dir: Path) -> dict[int, float]:
    rows = read_metrics(run_dir)
    return {int(r["step"]): float(r["grad_norm"]) for r in rows if r.get("grad_norm") is not None}


def killed_env(work: Path) -> dict[str, str]:
    """SIGKILL rank 1 at step KILL_STEP, once (the marker directory holds it back after)."""
    markers = work / "kill-markers"
    markers.mkdir(exist_ok=True)
    return {"HPCPIPE_CHAOS_KILL": f"step={KILL_STEP},rank=1", "HPCPIPE_CHAOS_DIR": str(markers)}


def check_resume(recipe: Recipe, reference: Path, killed: Path) -> str:
    """The killed run's group restarted, resumed from its checkpoint before the kill and trained
    the same steps and the same final weights as the uninterrupted run, bit for bit."""
    resumed = [e for e in _events(killed) if e.get("event") == "resumed"]
    if not resumed:
        raise AssertionError(f"the run killed at step {KILL_STEP} did not resume from a checkpoint")
    _, problem = compare_series(losses(reference), losses(killed), 0.0)
    if problem:
        raise AssertionError(f"after the restart: {problem}")
    final = f"step-{STEPS:08d}"
    a, b = (
        _weights(recipe, RunLayout(reference).checkpoints / final),
        _weights(recipe, RunLayout(killed).checkpoints / final),
    )
    for name, tensor in a.items():
        if not torch.equal(tensor, b[name]):
            raise AssertionError(f"the final checkpoints differ at {name}")
    step = resumed[0].get("step")
    return f"rank 1 killed at step {KILL_STEP}, resumed at {step}: losses, {len(a)} tensors bitwise equal"


def _events(run_dir: Path) -> list[dict[str, Any]]:
    from hpcpipe.observe.metrics import read_events

    return read_events(run_dir)


def _weights(recipe: Recipe, ckpt: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's model tensors, loaded into a freshly built model (in this process)."""
    from hpcpipe.checkpoint.export import load_weights

    model = recipe.build_model()
    load_weights(ckpt, model, trainable_only=recipe.checkpoint_trainable_only)
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def check_round_trip(recipe: Recipe, job: JobConfig, work: Path) -> str:
    """Model and optimizer saved through the checkpoint store, restored into a model built from
    another seed: every tensor equal, the trainer's state back."""
    from hpcpipe.checkpoint.store import CheckpointStore
    from hpcpipe.train.optim import build_optimizer

    torch.manual_seed(job.run.seed)
    model = recipe.build_model()
    optimizer = build_optimizer(model, job.train, torch.device("cpu"))
    _one_step(recipe, model, optimizer)
    root = work / "round-trip"
    cfg = job.checkpoint.model_copy(update={"async_save": False})
    store = CheckpointStore(cfg, root, trainable_only=recipe.checkpoint_trainable_only)
    store.save(1, model, optimizer, {"step": 1})
    store.close()
    torch.manual_seed(job.run.seed + 1)
    fresh = recipe.build_model()
    fresh_optimizer = build_optimizer(fresh, job.train, torch.device("cpu"))
    _one_step(recipe, fresh, fresh_optimizer)  # optimizer state exists, and differs
    restored = CheckpointStore(cfg, root, trainable_only=recipe.checkpoint_trainable_only)
    extra = restored.restore(fresh, fresh_optimizer)
    restored.close()
    if extra is None or extra.get("step") != 1:
        raise AssertionError("the saved checkpoint was not restored")
    saved = _checkpointed(model, recipe.checkpoint_trainable_only)
    back = _checkpointed(fresh, recipe.checkpoint_trainable_only)
    for name, tensor in saved.items():
        if not torch.equal(tensor, back[name]):
            raise AssertionError(f"{name} differs after a save and restore")
    moments = _optimizer_tensors(optimizer), _optimizer_tensors(fresh_optimizer)
    if len(moments[0]) != len(moments[1]) or not all(
        torch.equal(a, b) for a, b in zip(*moments, strict=True)
    ):
        raise AssertionError("the optimizer's state differs after a save and restore")
    return f"{len(saved)} tensors and {len(moments[0])} optimizer tensors equal"


def _one_step(recipe: Recipe, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    loader = recipe.train_loader(0, 1)
    try:
        batch = loader.next_microbatch()
    finally:
        close_loader(loader)
    recipe.loss(model, batch).backward()
    optimizer.step()
    optimizer.zero_grad()


MEAN_RATIO_BOUND = 1.25  # a sum over the micro-batch reads 2.0; a mean 1, or near it (token weighting)


def check_loss_is_a_mean(recipe: Recipe, job: JobConfig) -> str:
    """The loss of a micro-batch against the mean of its two halves' (the same samples): an OOM
    recovery halves the micro-batch and gradient accumulation weighs micro-batches alike, so a
    loss summed over the micro-batch changed every update's size without a word."""
    micro = job.train.micro_batch_size
    if micro < 2 or micro % 2:
        raise Skip(f"train.micro_batch_size {micro} of the check's job is not even")
    torch.manual_seed(job.run.seed)
    model = recipe.build_model().eval()  # eval: no dropout noise between the two forwards
    with torch.no_grad():
        whole = float(recipe.loss(model, _first_microbatches(recipe, micro, 1)[0]))
        halves = [float(recipe.loss(model, b)) for b in _first_microbatches(recipe, micro // 2, 2)]
    ratio = whole / (sum(halves) / 2) if sum(halves) else math.nan
    if not 1 / MEAN_RATIO_BOUND <= ratio <= MEAN_RATIO_BOUND:
        raise AssertionError(
            f"the loss of a micro-batch of {micro} is {ratio:.2f}x the mean of its halves' losses: return "
            "the mean over the micro-batch (an OOM recovery halves it; accumulation weighs micro-batches "
            "alike)"
        )
    return f"a micro-batch's loss is {ratio:.4f}x the mean of its halves' (a sum would read 2)"


def _first_microbatches(recipe: Recipe, micro: int, count: int) -> list[Any]:
    loader = recipe.train_loader(0, 1)
    try:
        loader.set_micro_batch_size(micro)
        return [loader.next_microbatch() for _ in range(count)]
    finally:
        close_loader(loader)


def _checkpointed(model: torch.nn.Module, trainable_only: bool) -> dict[str, torch.Tensor]:
    if trainable_only:
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    state = optimizer.state_dict()["state"]
    return [v for key in sorted(state) for _, v in sorted(state[key].items()) if isinstance(v, torch.Tensor)]


def check_exports(recipe: Recipe, run_dir: Path, work: Path) -> str:
    """Every export format of the run's final checkpoint written, then loaded back."""
    from hpcpipe.recipes.export import export_checkpoint

    if not recipe.export_formats:
        raise Skip("the recipe declares no export_formats")
    ckpt = RunLayout(run_dir).checkpoints / f"step-{STEPS:08d}"
    loaded = []
    for fmt in recipe.export_formats:
        out = export_checkpoint(ckpt, fmt, work / "exports" / fmt)
        try:
            recipe.load_export(fmt, out)
        except NotImplementedError as exc:
            raise Skip(str(exc)) from None
        loaded.append(fmt)
    return f"{', '.join(loaded)} written and loaded"


def check_eval_metrics(recipe: Recipe, run_dir: Path) -> str:
    """The final evaluation row holds val_loss, finite, and every metric the recipe declares."""
    rows = [r for r in read_metrics(run_dir) if "val_loss" in r]
    if not rows:
        raise AssertionError("no evaluation row with val_loss in metrics.jsonl")
    last = rows[-1]
    missing = [m for m in recipe.metric_goals if m not in last]
    if missing:
        raise AssertionError(f"the evaluation rows lack {', '.join(missing)} (declared in metric_goals)")
    if not math.isfinite(float(last["val_loss"])):
        raise AssertionError(f"val_loss is {last['val_loss']}")
    return ", ".join(f"{m} {float(last[m]):.4g}" for m in recipe.metric_goals)


def check_bad_args(job: JobConfig) -> str:
    """An unknown ``recipe.<key>`` is refused naming it; so is a value of the wrong type."""
    from hpcpipe.recipes.args import args_fields

    cls = recipe_class(job.run.recipe)
    _refused(job, {"recipe.no_such_key": 1}, "recipe.no_such_key")
    fields = list(args_fields(cls.Args)) if cls.Args is not None else []
    if not fields:
        return "an unknown key refused (the recipe takes no arguments)"
    for key in fields:
        for wrong in ("not a value", ["a", "list"], {"a": "mapping"}):
            try:
                apply_values(job, {f"recipe.{key}": wrong})
            except ConfigError as exc:
                if f"recipe.{key}" not in str(exc):
                    raise AssertionError(
                        f"recipe.{key}={wrong!r} refused without naming the key: {exc}"
                    ) from None
                return f"an unknown key and recipe.{key}={wrong!r} refused"
    raise AssertionError(f"no argument refuses a value of the wrong type ({', '.join(fields)})")


def _refused(job: JobConfig, values: dict[str, Any], key: str) -> None:
    try:
        apply_values(job, values)
    except ConfigError as exc:
        if key not in str(exc):
            raise AssertionError(f"{key} refused without naming it: {exc}") from None
        return
    raise AssertionError(f"{key} was accepted")


class Skip(Exception):
    """The property does not apply to this recipe (the report says why)."""


class RunFailed(Exception):
    """A run a property needs failed: its last line and log (a run in another process), or, as
    its ``__cause__``, the exception the recipe's code raised in this one."""
