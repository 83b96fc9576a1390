"""Faults in a running group of 2+ ranks: a killed rank, a rank that always fails, an OOM, a
stalled rank, a slow rank. Each trial draws the step and rank from its seed, trains for real
(``hpcpipe train --nproc N``) and compares against the uninterrupted reference run."""

from __future__ import annotations

from pathlib import Path

from hpcpipe.chaos import jobs, nodes
from hpcpipe.chaos.checks import Checks
from hpcpipe.chaos.kinds import STALL_HANG_TIMEOUT_S
from hpcpipe.chaos.scenario import TrialContext, TrialResult
from hpcpipe.layout import RunLayout
from hpcpipe.observe.metrics import read_metrics


def _place(ctx: TrialContext, first: int = 2) -> tuple[int, int, int]:
    """(step, rank, steps): a step in [first, steps - 1] and a rank, from the trial's seed."""
    steps = jobs.job_config(ctx).train.steps
    return ctx.rng.randint(first, max(first, steps - 1)), ctx.rng.randrange(ctx.scenario.nproc), steps


def kill_rank(ctx: TrialContext) -> TrialResult:
    """SIGKILL one rank at a step; restarts on: the run finishes with the reference's losses, bitwise."""
    step, rank, _ = _place(ctx)
    place = {"step": step, "rank": rank}
    reference = jobs.reference_losses(ctx)
    env = jobs.chaos_env(ctx, kill=f"step={step},rank={rank}")
    proc = jobs.train(ctx, "run", env=env, max_restarts=ctx.param("max_restarts", 1))
    run, checks = ctx.work / "run", Checks()
    checks.exit_code(proc, 0, "the restarted run")
    checks.check(bool(jobs.events(run, "restart")), "no restart event")
    _check_resumed(ctx, checks, run, step)
    lost = jobs.lost_steps(reference, jobs.losses(run))
    fault = jobs.fault_time(ctx.work / "markers")
    _check_memory_restore(checks, run, fault)
    ttr, phases = jobs.time_to_recover(run, fault), jobs.recovery_phases(run, fault)
    return checks.result(f"killed rank {rank} at step {step}; resumed bitwise", place, len(lost), ttr, phases)


def _check_resumed(ctx: TrialContext, checks: Checks, run: Path, fault_step: int) -> None:
    """The restart resumed from the newest checkpoint before the fault (not from step 0)."""
    every = jobs.job_config(ctx).checkpoint.every_steps
    want = (fault_step - 1) // every * every if every > 0 else 0
    resumed = [e.get("step") for e in jobs.events(run, "resumed")]
    if want > 0:
        checks.check(resumed[-1:] == [want], f"resumed from {resumed[-1:]}, expected step {want}")


def _check_memory_restore(checks: Checks, run: Path, fault: float | None) -> None:
    """When rank 0's copy of the resumed step was in the node's memory tier before the fault, the
    restart read it from there (the bitwise check above covers what it read)."""
    restored = jobs.events(run, "checkpoint_restored")
    if not restored or fault is None:
        return
    step = restored[-1].get("step")
    kept = [e for e in jobs.events(run, "checkpoint_memory_kept") if e.get("step") == step]
    if kept and float(kept[0]["time"]) < fault:
        files = restored[-1].get("memory_files", 0)
        checks.check(files > 0, f"step {step} was in the memory tier, but the restart read none of it there")


def always_fail(ctx: TrialContext) -> TrialResult:
    """A rank that fails every attempt: exactly max_restarts + 1 attempts, then the rank is named."""
    step, rank, _ = _place(ctx, first=1)
    restarts = ctx.rng.randint(0, ctx.param("max_restarts", 2))
    place = {"step": step, "rank": rank, "max_restarts": restarts}
    proc = jobs.train(
        ctx, "run", env=jobs.chaos_env(ctx, fail=f"step={step},rank={rank}"), max_restarts=restarts
    )
    run, checks = ctx.work / "run", Checks()
    checks.check(proc.returncode == 1, f"exit {proc.returncode}, expected 1 ({jobs.last_line(proc.stderr)})")
    attempts = len(jobs.events(run, "group_start"))
    checks.check(attempts == restarts + 1, f"{attempts} attempts, expected {restarts + 1}")
    named = f"agent: worker rank {rank} "
    checks.check(named in proc.stderr, f"the failed rank is not named ({named.strip()!r} not in stderr)")
    return checks.result(f"rank {rank} failed {attempts} attempt(s); named; gave up", place)


def oom(ctx: TrialContext) -> TrialResult:
    """A (simulated) CUDA OOM on one rank: every rank halves its micro-batch, same update."""
    step, rank, _ = _place(ctx, first=1)
    place = {"step": step, "rank": rank}
    reference = jobs.reference_losses(ctx)
    proc = jobs.train(ctx, "run", env=jobs.chaos_env(ctx, oom=f"step={step},rank={rank},micro=0"))
    run, checks = ctx.work / "run", Checks()
    checks.exit_code(proc, 0, "the run with an OOM")
    recovered = jobs.events(run, "oom_recovered")
    checks.check([e.get("rank") for e in recovered] == [rank], f"oom_recovered events: {recovered}")
    # Halved, not retried as it was (the simulated OOM fires once: a plain retry also succeeds).
    splits = [(e.get("new_micro_batch_size"), e.get("new_accum_steps")) for e in recovered]
    halved = [(e.get("old_micro_batch_size", 0) // 2, 2 * e.get("old_accum_steps", 0)) for e in recovered]
    checks.check(
        splits == halved and all(m >= 1 for m, _ in halved), f"not a halved micro-batch: {recovered}"
    )
    # Same global batch, accumulated in two halves: equal up to float summation order.
    lost = jobs.lost_steps(reference, jobs.losses(run), rel=ctx.param("rel_tolerance", 1e-4))
    ttr = jobs.time_to_recover(run, jobs.fault_time(ctx.work / "markers"))
    return checks.result(f"OOM on rank {rank} at step {step}; recovered, same losses", place, len(lost), ttr)


def stall(ctx: TrialContext) -> TrialResult:
    """A stalled rank, drawn as SIGSTOPped (every thread frozen: a peer's watchdog must name it)
    or stuck in Python (its own watchdog dumps the stuck frame): detected within the watchdog
    timeout, stacks dumped, the rank named, the group restarted, and the run resumes bitwise."""
    step, rank, _ = _place(ctx)
    how = ctx.rng.choice(["stop", "hang"])
    timeout = ctx.param("hang_timeout_s", STALL_HANG_TIMEOUT_S)
    place = {"step": step, "rank": rank, "how": how}
    reference = jobs.reference_losses(ctx)
    env = jobs.chaos_env(ctx, **{how: f"step={step},rank={rank}"})
    proc = jobs.train(ctx, "run", f"fault.hang_timeout_s={timeout}", env=env, max_restarts=1)
    run, checks = ctx.work / "run", Checks()
    checks.exit_code(proc, 0, "the restarted run")
    hangs = jobs.events(run, "hang")
    named = [e for e in hangs if _names_rank(e, rank, how)]
    checks.check(
        bool(named), f"no hang event names rank {rank}: {[(e.get('rank'), e.get('peers')) for e in hangs]}"
    )
    if named:  # the stuck rank's own stack shows where; a stopped rank is named in a peer's dump
        stacks = RunLayout(run).hang_dump(named[0]["rank"])
        want = "_chaos_hang_forever" if how == "hang" else f"peers behind or silent: {named[0]['peers']}"
        checks.check(
            stacks.is_file() and want in stacks.read_text(), f"{stacks.name}: no stack dump naming it"
        )
    # Detection: the watchdog's own count from the last completed step (just before the fault).
    detected = float(named[0]["stalled_s"]) if named else None
    late = detected is not None and detected > timeout + max(2.0, timeout / 2)  # the poll is timeout/10
    checks.check(not late, f"detected after {detected} s, timeout {timeout} s")
    fault = jobs.fault_time(ctx.work / "markers")
    checks.check(bool(jobs.events(run, "restart")), "no restart event")
    _check_resumed(ctx, checks, run, step)
    lost = jobs.lost_steps(reference, jobs.losses(run))
    ttr, phases = jobs.time_to_recover(run, fault), jobs.recovery_phases(run, fault)
    how_text = "SIGSTOPped" if how == "stop" else "stuck"
    passed = f"rank {rank} {how_text} at step {step}; named after {detected or 0:.1f} s, restarted, bitwise"
    return checks.result(passed, {**place, "detected_s": detected}, len(lost), ttr, phases)


def _names_rank(event: dict[str, object], rank: int, how: str) -> bool:
    """A stuck rank's own watchdog names itself; a stopped rank is named by a peer's."""
    if how == "hang":
        return event.get("rank") == rank
    return event.get("rank") != rank and f"rank {rank} " in str(event.get("peers") or "")


SLOW_SETS = (
    "train.steps=40",
    "observe.log_every=10",  # each check compares 10-step means
    "observe.imbalance.every_steps=10",
    "observe.imbalance.warmup_steps=10",
)


def slow_rank(ctx: TrialContext) -> TrialResult:
    """One rank slowed in its data path or its compute: the imbalance event names it and the phase.

    Its ``ttr_s`` is the time to detect: from the first slowed step to the event.
    """
    rank = ctx.rng.randrange(ctx.scenario.nproc)
    where = ctx.rng.choice(["data", "forward"])
    seconds = ctx.param("seconds", 0.08)
    place = {"rank": rank, "where": where, "seconds": seconds}
    env = {"HPCPIPE_CHAOS_SLOW": f"rank={rank},where={where},seconds={seconds}"}
    proc = jobs.train(ctx, "run", *SLOW_SETS, env=env)
    run, checks = ctx.work / "run", Checks()
    checks.exit_code(proc, 0, "the slowed run")
    found = jobs.events(run, "imbalance")
    named = [e for e in found if (e.get("slowest_rank"), e.get("phase")) == (rank, where)]
    checks.check(bool(found), "no imbalance event")
    checks.check(
        len(named) == len(found), f"events name {[(e.get('slowest_rank'), e.get('phase')) for e in found]}"
    )
    ttr = named[0]["time"] - _first_step_began(run) if named else None
    return checks.result(f"rank {rank} slowed in {where}; named with its phase", place, ttr_s=ttr)


def _first_step_began(run: Path) -> float:
    """When step 1, the first slowed one, began: the first logged row (step N, every
    ``observe.log_every``) less its N steps at the row's mean step time. Its own time left the
    first N slowed steps out of the time to detect."""
    rows = [r for r in read_metrics(run) if "loss" in r and "time" in r and "step_time_s" in r]
    if not rows:
        return 0.0
    first = min(rows, key=lambda r: float(r["time"]))
    return float(first["time"]) - int(first["step"]) * float(first["step_time_s"])


def lost_node(ctx: TrialContext) -> TrialResult:
    """Two local agents (``--nnodes 1:2``, a "node" each) train one job; at a drawn step the
    second node's worker stops and the node (agent and workers) is SIGKILLed. The first agent
    restarts its group at the smaller world size, resumes from the last checkpoint and finishes
    with the reference's losses (the global batch is unchanged; accumulation order differs).
    """
    every, steps = jobs.job_config(ctx).checkpoint.every_steps, jobs.job_config(ctx).train.steps
    step = ctx.rng.randint(every + 1, max(every + 1, steps - 3))
    place = {"step": step, "node": 1}
    reference = jobs.reference_losses(ctx, nproc=2 * ctx.scenario.nproc)
    with nodes.two_agents(ctx, hang_second_at=step) as agents:
        killed_at = agents.kill_second_when_stuck()
        code = agents.wait_first()
    run, checks = ctx.work / "run", Checks()
    checks.check(code == 0, f"the surviving agent: exit {code} ({agents.first_log_tail()})")
    changes = [
        (e.get("old_world_size"), e.get("new_world_size")) for e in jobs.events(run, "membership_change")
    ]
    world = 2 * ctx.scenario.nproc
    # The last change counts: on a loaded host the first round may form before the second agent joins.
    shrink = (world, world // 2)
    checks.check(changes[-1:] == [shrink], f"membership changes {changes}, the last one is not {shrink}")
    _check_resumed(ctx, checks, run, step)
    rows = [r for r in read_metrics(run) if "loss" in r]
    last = rows[-1] if rows else {}
    checks.check(last.get("step") == steps, f"last step {last.get('step')}, expected {steps}")
    checks.check(last.get("world_size") == world // 2, f"finished at world size {last.get('world_size')}")
    lost = jobs.lost_steps(reference, jobs.losses(run), rel=ctx.param("rel_tolerance", 1e-3))
    ttr, phases = jobs.time_to_recover(run, killed_at), jobs.recovery_phases(run, killed_at)
    return checks.result(
        f"node 1 lost at step {step}; finished on 1 node, same losses", place, len(lost), ttr, phases
    )
