"""What a training run guards on its own: train mode after a resume (as after the step-0 evaluation),
no checkpoint of a diverged model, the config's optimizer settings after a resume, and the chaos
variables checked before two ranks start."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import run_cli

from hpcpipe.errors import UserError
from hpcpipe.train.trainer import EVAL_PREEMPTION_CHECK_EVERY

OWN = "tests.recipes_for_tests:EvalModeTiny"
TINY = "tests.recipes_for_tests:Tiny"  # built in eval mode, as from_pretrained returns one


def _train_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    return [row for row in rows if "loss" in row]


def _losses(run_dir: Path) -> list[float]:
    return [row["loss"] for row in _train_rows(run_dir)]


def test_a_resume_without_an_evaluation_trains_with_dropout_bitwise_as_uninterrupted(tmp_path: Path) -> None:
    """Only evaluate() set train mode: a Hugging Face model resumed without one trained in eval mode
    (no dropout, no gradient checkpointing) until its next evaluation."""
    sets = [
        f"run.recipe={OWN}", "recipe.dropout=0.5", f"run.out_dir={tmp_path}", "checkpoint.every_steps=2",
        "train.eval_every=0", "observe.log_every=1",
    ]  # fmt: skip

    def train(name: str, steps: int) -> None:
        args = [a for s in [*sets, f"run.name={name}", f"train.steps={steps}"] for a in ("--set", s)]
        proc = run_cli("train", "tiny", *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]

    train("resumed", 2)
    train("resumed", 4)  # resumes at step 2: its evaluation ran, no new one
    train("uninterrupted", 4)
    assert _losses(tmp_path / "resumed") == _losses(tmp_path / "uninterrupted")


def test_a_diverged_run_stops_before_it_saves_a_nan_checkpoint(tmp_path: Path) -> None:
    """The loss went NaN and the run checkpointed NaN weights at steps 5 and 10, exit 0: through
    keep_last they would push out every good checkpoint."""
    sets = ["train.lr=1e8", "train.grad_clip=0", "checkpoint.every_steps=5", f"run.out_dir={tmp_path}"]
    proc = run_cli("train", "tiny", *[a for s in sets for a in ("--set", s)], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "training diverged: the loss is nan at step" in proc.stderr
    diverged = int(proc.stderr.split(" at step ")[1].split()[0])
    saved = [int(p.name[5:]) for p in (tmp_path / "tiny" / "checkpoints").glob("step-*")]
    assert all(step < diverged for step in saved), (saved, diverged)  # none of NaN weights


def _in_process(tmp_path: Path, *sets: str) -> Any:
    """A Trainer of the tiny regression on this process's CPU (no CLI: a fraction of a second)."""
    import torch

    from hpcpipe.config import load_config
    from hpcpipe.recipes import build_recipe
    from hpcpipe.train.distributed import DistContext
    from hpcpipe.train.trainer import Trainer

    base = [f"run.recipe={TINY}", f"run.out_dir={tmp_path}", "observe.progress=false", "train.eval_every=0"]
    job = load_config("tiny", [*base, *sets])
    job.run_dir.mkdir(parents=True, exist_ok=True)
    cpu = torch.device("cpu")
    ctx = DistContext(rank=0, local_rank=0, world_size=1, local_world_size=1, device=cpu, backend=None)
    return Trainer(job, build_recipe(job), ctx, job.run_dir)


@pytest.mark.parametrize("grad_clip", [1.0, 0.0])
def test_a_finite_loss_with_a_nan_gradient_is_never_checkpointed(tmp_path: Path, grad_clip: float) -> None:
    """The loss checks missed a NaN gradient under a finite loss: its step wrote NaN weights and
    checkpointed them (step 4 here), and every restart resumed that checkpoint and stopped again."""
    clip = f"train.grad_clip={grad_clip}"
    trainer = _in_process(tmp_path, "train.steps=8", "checkpoint.every_steps=2", "observe.log_every=3", clip)
    loss = trainer.recipe.loss

    def nan_gradient_at_step_4(model: Any, batch: Any) -> Any:
        out = loss(model, batch)
        if trainer.step == 4:  # sqrt's derivative at 0 is inf, times 0: NaN; the value stays finite
            w = next(model.parameters())
            out = out + 0.0 * (w - w.detach()).sum().sqrt()
        return out

    trainer.recipe.loss = nan_gradient_at_step_4
    try:
        with pytest.raises(UserError, match=r"the gradient norm is nan at step 4 with a finite loss"):
            trainer.fit()
    finally:
        trainer.close()
    assert sorted(p.name for p in (tmp_path / "tiny" / "checkpoints").glob("step-*")) == ["step-00000002"]


def _fit(tmp_path: Path, *sets: str) -> Any:
    trainer = _in_process(tmp_path, *sets)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return trainer


def test_evaluation_rows_carry_the_time_they_were_logged(tmp_path: Path) -> None:
    """Evaluation rows had no ``time``: `track sync` stamped every val_loss with the sync's."""
    import time

    started = time.time()
    _fit(tmp_path, "train.steps=2", "train.eval_every=2")
    rows = [json.loads(line) for line in (tmp_path / "tiny" / "metrics.jsonl").read_text().splitlines()]
    evals = [row for row in rows if "val_loss" in row]
    assert evals and all(started <= row["time"] <= time.time() for row in evals)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_a_continued_run_trains_with_the_configs_optimizer_settings(tmp_path: Path, optimizer: str) -> None:
    """The checkpoint's param groups were restored as saved: a run continued with a changed
    train.weight_decay / beta2 / momentum kept the old values while config.yaml had the new."""
    _fit(tmp_path, f"train.optimizer={optimizer}", "train.steps=2", "checkpoint.every_steps=2")
    changed = ["train.weight_decay=0.3", "train.beta2=0.99", "train.momentum=0.5"]
    trainer = _in_process(tmp_path, f"train.optimizer={optimizer}", "train.steps=4", *changed)
    trainer.close()
    assert trainer.step == 2  # resumed
    groups = trainer.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.3, 0.0]  # norms and biases: still none
    if optimizer == "adamw":
        assert all(g["betas"] == (0.9, 0.99) for g in groups)
    else:
        assert all(g["momentum"] == 0.5 and g["nesterov"] for g in groups)
    assert trainer.optimizer.state  # the moments were restored


def _events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    rows = (json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines())
    return [row for row in rows if row["event"] == kind]


def test_a_run_continued_with_more_steps_says_its_lr_schedule_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Raising train.steps stretched the schedule: a run that had decayed to its floor LR resumed
    at a much higher one without a word."""
    sets = ["train.warmup_steps=1", "checkpoint.every_steps=2", "train.lr=0.01", "train.min_lr_ratio=0.1"]
    _fit(tmp_path, *sets, "train.steps=4")
    _in_process(tmp_path, *sets, "train.steps=4").close()  # the same schedule: nothing said
    assert "LR schedule" not in capsys.readouterr().out
    assert not _events(tmp_path / "tiny", "lr_schedule_changed")
    _in_process(tmp_path, *sets, "train.steps=10").close()
    out = capsys.readouterr().out
    assert "the LR schedule now spans 10 steps instead of 4: the LR at step 4 was 0.001 and is now" in out
    (event,) = _events(tmp_path / "tiny", "lr_schedule_changed")
    assert (event["step"], event["old_steps"], event["new_steps"]) == (4, 4, 10)
    # The floor, then a third of the way into the stretched cosine.
    assert (event["old_lr"], event["new_lr"]) == pytest.approx((0.001, 0.00775))


def test_a_checkpoint_without_its_schedule_length_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    from hpcpipe.config import TrainConfig
    from hpcpipe.train.resume_state import announce_schedule_change

    emitted: list[str] = []
    announce_schedule_change({"step": 4}, TrainConfig(steps=10), lambda kind, _: emitted.append(kind), True)
    assert not emitted and not capsys.readouterr().out


def test_a_resume_with_changed_lr_settings_says_so_with_the_checkpoints_lr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The LR before was computed under the config's train.lr, not the checkpoint's (0.001 said
    where 0.01 had trained), and a change of train.lr alone said nothing."""
    from hpcpipe.config import TrainConfig
    from hpcpipe.train.resume_state import announce_schedule_change
    from hpcpipe.train.schedule import lr_at

    saved = TrainConfig(steps=10, lr=0.01, warmup_steps=2)
    extra = {"step": 4, "lr": lr_at(4, saved), "schedule_steps": 10}
    emitted: list[dict[str, Any]] = []

    def announced(cfg: TrainConfig) -> tuple[dict[str, Any], str]:
        emitted.clear()
        announce_schedule_change(extra, cfg, lambda _, fields: emitted.append(fields), True)
        return (emitted[0] if emitted else {}), capsys.readouterr().out

    assert announced(saved) == ({}, "")  # the same schedule
    lower = TrainConfig(steps=10, lr=0.001, warmup_steps=2)
    event, out = announced(lower)
    assert (event["old_lr"], event["new_lr"]) == (extra["lr"], lr_at(4, lower))
    assert f"the LR settings changed: the LR at step 4 was {extra['lr']:.6g} and is now" in out
    event, out = announced(TrainConfig(steps=20, lr=0.001, warmup_steps=2))  # both changed
    assert (event["old_steps"], event["new_steps"], event["old_lr"]) == (10, 20, extra["lr"])
    assert f"spans 20 steps instead of 10: the LR at step 4 was {extra['lr']:.6g}" in out


def test_fp16_steps_the_scaler_skips_use_up_no_warm_up_and_a_resume_keeps_their_count(tmp_path: Path) -> None:
    """Skipped steps counted as updates: with a large initial scale the first steps overflowed,
    the warm-up ran out without one update, and the first update came at a decayed LR."""
    from hpcpipe.config import load_config
    from hpcpipe.train.schedule import lr_at

    sets = ["train.precision=fp16", "train.warmup_steps=4", "observe.log_every=1", "checkpoint.every_steps=4"]

    def fit(name: str, steps: int) -> list[tuple[int, float, float, int]]:
        trainer = _in_process(tmp_path, *sets, f"run.name={name}", f"train.steps={steps}")
        if trainer.step == 0:
            trainer.precision.scaler._init_scale = 2.0**20  # fp16 overflows until it backs off
        try:
            trainer.fit()
        finally:
            trainer.close()
        return [(r["step"], r["loss"], r["lr"], r["skipped_steps"]) for r in _train_rows(tmp_path / name)]

    whole = fit("whole", 8)
    skipped = [0] + [row[3] for row in whole]  # skipped[s]: skipped up to step s
    assert skipped[4] > 0 and skipped[8] < 8  # some skipped before the checkpoint, some updates
    cfg = load_config("tiny", [f"run.recipe={TINY}", *sets, "train.steps=8"]).train
    assert [row[2] for row in whole] == [lr_at(max(s - skipped[s - 1], 1), cfg) for s in range(1, 9)]
    fit("resumed", 4)
    assert fit("resumed", 8) == whole  # the count resumed: the same LRs, the same losses


def _nan_gradient(trainer: Any, steps: set[int] | None = None) -> None:
    """The trainer's loss gets a NaN gradient at ``steps`` (None: every step), its value unchanged:
    sqrt's derivative at 0 is inf, times 0: NaN."""
    loss = trainer.recipe.loss

    def nan_gradient(model: Any, batch: Any) -> Any:
        out = loss(model, batch)
        if steps is None or trainer.step in steps:
            w = next(model.parameters())
            out = out + 0.0 * (w - w.detach()).sum().sqrt()
        return out

    trainer.recipe.loss = nan_gradient


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_preemption_after_a_nan_gradient_saves_no_nan_weights(tmp_path: Path, signum: int) -> None:
    """A NaN gradient on an unchecked step (clipped by its NaN norm: NaN weights), then SIGTERM or
    Ctrl-C: the stop's checkpoint held the NaN weights (exit 75), and every restart resumed them."""
    sets = ["train.steps=20", "checkpoint.every_steps=4", "observe.log_every=10"]
    trainer = _in_process(tmp_path, *sets)
    _nan_gradient(trainer, {5})
    loss = trainer.recipe.loss

    def signalled_at_step_6(model: Any, batch: Any) -> Any:
        if trainer.step == 6:
            os.kill(os.getpid(), signum)  # the loop stops after this step
        return loss(model, batch)

    trainer.recipe.loss = signalled_at_step_6
    try:
        with pytest.raises(UserError, match=r"the weights are not finite at step 6, where the run stopped"):
            trainer.fit()
    finally:
        trainer.close()
    # Step 5 neither logged nor saved (unchecked); step 6 not saved: step 4 stays the newest.
    assert sorted(p.name for p in (tmp_path / "tiny" / "checkpoints").glob("step-*")) == ["step-00000004"]
    # The grace timer ran during the check (a rank gone would hold its agreement) and is stopped:
    # firing later, it turned the exit 2 into 75, which is restarted.
    assert trainer.preemption._timer is None


def test_an_fp16_run_whose_scaler_skips_every_step_stops_as_diverged(tmp_path: Path) -> None:
    """A gradient never finite: the GradScaler skipped all 40 steps, the weights never changed,
    and the run finished as a success (exit 0)."""
    sets = ["train.precision=fp16", "train.steps=40", "observe.log_every=10", "checkpoint.every_steps=5"]
    trainer = _in_process(tmp_path, *sets)
    _nan_gradient(trainer)
    try:
        # Checked at logged and saving steps: the first one after 17 skips in a row (from the
        # scale of 2**16 to below 1, divergence.py).
        with pytest.raises(UserError, match=r"the gradient is not finite at any step from 1 to 20 \(20 in a"):
            trainer.fit()
    finally:
        trainer.close()
    assert trainer.step == 20


def test_fp16_skips_between_updates_do_not_stop_a_run(tmp_path: Path) -> None:
    """Skips in a row are counted from the last update: 40 scattered ones are no divergence, though
    they take the scale far below 1."""
    sets = ["train.precision=fp16", "train.steps=60", "observe.log_every=20"]
    trainer = _in_process(tmp_path, *sets)
    _nan_gradient(trainer, {s for s in range(1, 61) if s % 3})
    try:
        trainer.fit()
    finally:
        trainer.close()
    assert trainer.precision.skipped_steps == 40 and trainer.step == 60


def test_a_bad_chaos_variable_under_two_ranks_is_one_line(tmp_path: Path) -> None:
    """The fork server's import of the faults failed: the run ended in 'Aborted.', exit 1."""
    proc = run_cli(
        "train", "tiny", "--nproc", "2", "--set", f"run.out_dir={tmp_path}",
        cwd=tmp_path, env={"HPCPIPE_CHAOS_OOM": "step=10,bogus=1"},
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "HPCPIPE_CHAOS_OOM: unknown key 'bogus'" in proc.stderr


def test_the_first_compiled_step_of_a_process_gets_a_longer_hang_timeout(tmp_path: Path) -> None:
    """Compiling took longer than fault.hang_timeout_s: a healthy run ended as hung (exit 3)."""
    from types import SimpleNamespace

    from hpcpipe.observe.watchdog import Watchdog
    from hpcpipe.train.trainer import COMPILE_ALLOWANCE_S, Trainer

    for compiled, allowed in ((True, [COMPILE_ALLOWANCE_S, 0.0, 0.0]), (False, [0.0, 0.0, 0.0])):
        trainer = SimpleNamespace(
            cfg=SimpleNamespace(compile=compiled), _compiled=False, _compile_allowance_s=COMPILE_ALLOWANCE_S
        )
        trainer.watchdog = Watchdog(60.0, tmp_path, rank=0)
        seen = []
        for _ in range(3):
            with Trainer._compiling(trainer):  # type: ignore[arg-type]
                seen.append(trainer.watchdog._allowed)
        assert seen == allowed  # a longer timeout, not none: a hang there is still caught


def test_a_hang_inside_an_allowed_phase_is_still_caught(tmp_path: Path) -> None:
    import time

    from hpcpipe.observe.watchdog import Watchdog

    reports: list[object] = []
    watchdog = Watchdog(0.1, tmp_path, rank=0, on_hang=reports.append).start()
    try:
        with watchdog.allowing(0.5):
            time.sleep(0.3)
            assert not reports  # over the timeout, within the allowance
            time.sleep(0.6)
        assert reports  # past the allowance: caught
    finally:
        watchdog.stop()


def test_the_evaluation_schedule() -> None:
    """Every train.eval_every steps and at the last; none at 0."""
    from types import SimpleNamespace

    from hpcpipe.train.evaluation import is_evaluation_step, next_eval_step

    cfg = SimpleNamespace(steps=25, eval_every=10)
    assert [s for s in range(0, 26) if is_evaluation_step(s, cfg)] == [10, 20, 25]  # type: ignore[arg-type]
    assert [next_eval_step(s, cfg) for s in (0, 9, 10, 20, 24)] == [10, 10, 20, 25, 25]  # type: ignore[arg-type]
    off = SimpleNamespace(steps=25, eval_every=0)
    assert next_eval_step(3, off) == 25 and not is_evaluation_step(10, off)  # type: ignore[arg-type]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nproc", [1, 2])
def test_a_preemption_during_an_evaluation_stops_it(tmp_path: Path, nproc: int) -> None:
    """The evaluation ran to its end whatever came: a long one outlasted the grace and the agent
    SIGKILLed the ranks (137, nothing saved, no requeue). Every rank now stops after the same
    batch (the check agreed over the ranks every few batches) and exits 75."""
    (tmp_path / "counts").mkdir()
    sets = [
        "run.recipe=tests.recipes_for_tests:SignalledInEval", "recipe.val_samples=400",
        f"run.out_dir={tmp_path}", "checkpoint.every_steps=5",
    ]  # fmt: skip
    proc = run_cli(
        "train", "tiny", "--nproc", str(nproc), *[a for s in sets for a in ("--set", s)],
        cwd=tmp_path, env={"EVAL_BATCHES": str(tmp_path / "counts")},
    )  # fmt: skip
    assert proc.returncode == 75, proc.stderr[-2000:]
    counts = [int(p.read_text()) for p in sorted((tmp_path / "counts").iterdir())]
    every = 1 if nproc == 1 else EVAL_PREEMPTION_CHECK_EVERY
    assert counts == [every] * nproc  # of 100 // nproc batches each
    events = [json.loads(line) for line in (tmp_path / "tiny" / "events.jsonl").read_text().splitlines()]
    # Nothing trained yet: no checkpoint (one at step 0 held an optimizer state of a step never
    # taken, and the resumed run's updates differed from an uninterrupted run's).
    assert [(e["step"], e["checkpointed"]) for e in events if e["event"] == "preempted"] == [(0, False)]
    assert not list((tmp_path / "tiny" / "checkpoints").glob("step-*"))


class _LoaderWithoutClose:
    """A recipe's own loader with nothing to release: no ``close`` (the Protocol's is optional)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def next_microbatch(self) -> Any:
        return self.inner.next_microbatch()

    def state_dict(self) -> dict[str, Any]:
        return dict(self.inner.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def set_micro_batch_size(self, micro_batch_size: int) -> None:
        self.inner.set_micro_batch_size(micro_batch_size)


def test_a_loader_without_close_ends_a_trained_run_cleanly(tmp_path: Path) -> None:
    """A run with its own loader trained, then failed in close() with AttributeError (exit 1)."""
    trainer = _in_process(tmp_path, "train.steps=2", "checkpoint.every_steps=2")
    inner, trainer.loader = trainer.loader, _LoaderWithoutClose(trainer.loader)
    trainer.fit()
    trainer.close()
    inner.close()
    assert trainer.step == 2


def test_a_loader_whose_close_fails_still_closes_the_checkpoint_store(tmp_path: Path) -> None:
    """The loader's error skipped store.close(): the checkpoint in flight was never finished."""
    trainer = _in_process(tmp_path, "train.steps=2")
    store_closed = []
    store_close = trainer.store.close
    trainer.store.close = lambda: store_closed.append(store_close())
    loader_close = trainer.loader.close

    def failing_close() -> None:
        loader_close()
        raise OSError("the loader's files are gone")

    trainer.loader.close = failing_close
    with pytest.raises(OSError, match="the loader's files are gone"):
        trainer.close()
    assert store_closed == [None]
