"""Faults around checkpoints: a save killed or preempted between its shard writes and its
commit, the newest checkpoint corrupted, the disk filling up during a save.

Recovery means: the newest *visible* checkpoint verifies, the resumed run's losses equal the
uninterrupted reference bitwise, and no committed checkpoint is lost.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from hpcpipe.chaos import jobs
from hpcpipe.chaos.checks import Checks
from hpcpipe.chaos.scenario import TrialContext, TrialResult
from hpcpipe.checkpoint.manifest import MANIFEST_NAME, read_manifest, verify_dir
from hpcpipe.checkpoint.tiers import Tier
from hpcpipe.layout import RunLayout
from hpcpipe.train.fault_injection import SAVE_POINTS
from hpcpipe.train.preempt import PREEMPT_EXIT_CODE


def _visible(ckpt_root: Path) -> list[tuple[int, Path]]:
    """Committed checkpoints (newest first), as resume would list them."""
    return Tier("fast", ckpt_root).committed()


def _unverified(ckpt_root: Path) -> list[str]:
    """``step-N: problem`` for every visible checkpoint that does not verify."""
    bad = []
    for step, path in _visible(ckpt_root):
        _, problems = verify_dir(path)
        if problems:
            bad.append(f"step {step}: {problems[0]}")
    return bad


def _save_steps(ctx: TrialContext) -> tuple[int, int]:
    job = jobs.job_config(ctx)
    if job.checkpoint.every_steps < 1:
        raise ValueError(
            f"scenario {ctx.scenario.name}: set checkpoint.every_steps (its saves are the target)"
        )
    return job.checkpoint.every_steps, job.train.steps


def _resume_and_compare(
    ctx: TrialContext, checks: Checks
) -> tuple[int, float | None, dict[str, float] | None]:
    """Start the run again, as a scheduler's requeue would; (steps lost against the reference,
    time to recover, its phases). These scenarios recover by a new ``hpcpipe train``: the time to
    recover runs from its start to its first step (choosing, verifying and loading a checkpoint
    included). From the fault it counted the first run's own next step (a SIGTERM inside a save
    takes effect a step later), the harness's checks and, in a run's first trial, the reference."""
    reference = jobs.reference_losses(ctx)  # before the clock: trained once per chaos run
    relaunched = time.time()
    again = jobs.train(ctx, "run", log="run-resumed")
    checks.exit_code(again, 0, "the resumed run")
    run = ctx.work / "run"
    lost = len(jobs.lost_steps(reference, jobs.losses(run)))
    return lost, jobs.time_to_recover(run, relaunched), jobs.recovery_phases(run, relaunched)


def _resumed_from_newest(checks: Checks, run: Path, visible: list[int]) -> None:
    """The next start resumed from the newest visible checkpoint (a start from scratch also
    reproduces the reference bitwise, so lost steps alone cannot tell)."""
    resumed = [e.get("step") for e in jobs.events(run, "resumed")]
    checks.check(
        resumed[-1:] == visible[:1], f"resumed from {resumed[-1:]}, expected the newest {visible[:1]}"
    )


def _train_with_save_fault(
    ctx: TrialContext, signal: str
) -> tuple[subprocess.CompletedProcess[str], tuple[int, int, str]]:
    """Train with ``signal`` sent inside a drawn save: a step that saves, a point, a rank
    (rank 0 for ``manifest``: only it writes one). The run and (step, rank, point)."""
    every, steps = _save_steps(ctx)
    step = every * ctx.rng.randint(1, max(1, (steps - 1) // every))
    point = ctx.rng.choice(SAVE_POINTS)
    rank = 0 if point == "manifest" else ctx.rng.randrange(ctx.scenario.nproc)
    env = jobs.chaos_env(ctx, save=f"step={step},rank={rank},point={point},signal={signal}")
    return jobs.train(ctx, "run", env=env), (step, rank, point)


def kill_during_save(ctx: TrialContext) -> TrialResult:
    """SIGKILL a rank inside a save (after its shards, or rank 0 before the rename)."""
    first, (step, rank, point) = _train_with_save_fault(ctx, "KILL")
    place = {"step": step, "rank": rank, "point": point}
    checks, ckpts = Checks(), RunLayout(ctx.work / "run").checkpoints
    checks.check(first.returncode != 0, "the killed run exited 0")
    visible = [s for s, _ in _visible(ckpts)]
    checks.check(step not in visible, f"the interrupted save of step {step} is visible: {visible}")
    earlier = step - _save_steps(ctx)[0]  # committed before the kill: it must survive it
    checks.check(earlier < 1 or earlier in visible, f"the committed step {earlier} was lost: {visible}")
    checks.check(not _unverified(ckpts), f"a visible checkpoint does not verify: {_unverified(ckpts)}")
    lost, ttr, phases = _resume_and_compare(ctx, checks)
    _resumed_from_newest(checks, ctx.work / "run", visible)
    return checks.result(
        f"killed rank {rank} in the save of step {step} at {point}; resumed bitwise", place, lost, ttr, phases
    )


def sigterm_during_save(ctx: TrialContext) -> TrialResult:
    """SIGTERM inside a save: the save commits, the run exits 75, the next start resumes bitwise."""
    first, (step, rank, point) = _train_with_save_fault(ctx, "TERM")
    place = {"step": step, "rank": rank, "point": point}
    checks, run = Checks(), ctx.work / "run"
    checks.exit_code(first, PREEMPT_EXIT_CODE, "the preempted run")
    ckpts = RunLayout(run).checkpoints
    visible = [s for s, _ in _visible(ckpts)]
    checks.check(bool(visible) and visible[0] >= step, f"newest checkpoint {visible[:1]}, expected >= {step}")
    checks.check(not _unverified(ckpts), f"does not verify: {_unverified(ckpts)}")
    checks.check(bool(jobs.events(run, "preempted")), "no preempted event")
    lost, ttr, phases = _resume_and_compare(ctx, checks)
    _resumed_from_newest(checks, run, visible)
    return checks.result(
        f"SIGTERM to rank {rank} in the save of step {step} at {point}; exit 75, resumed",
        place,
        lost,
        ttr,
        phases,
    )


CORRUPTIONS = ("truncate", "flip", "no_manifest", "delete_shard")


def corrupt_checkpoint(ctx: TrialContext) -> TrialResult:
    """Preempt a run, damage its newest checkpoint: resume falls back to the previous one, bitwise."""
    every, steps = _save_steps(ctx)
    stop = ctx.rng.randint(2 * every, steps - 1)  # two checkpoints at least: one to fall back to
    rank = ctx.rng.randrange(ctx.scenario.nproc)
    first = jobs.train(ctx, "run", env=jobs.chaos_env(ctx, sigterm=f"step={stop},rank={rank}"))
    checks, ckpts = Checks(), RunLayout(ctx.work / "run").checkpoints
    if not checks.exit_code(first, PREEMPT_EXIT_CODE, "the preempted run"):
        return checks.result("", {"stop": stop, "rank": rank})
    (newest, path), (previous, _) = _visible(ckpts)[:2]
    mode = ctx.rng.choice(CORRUPTIONS)
    place = {"stop": stop, "rank": rank, "mode": mode, **_corrupt(path, mode, ctx)}
    lost, ttr, phases = _resume_and_compare(ctx, checks)
    run = ctx.work / "run"
    fallbacks = [e.get("step") for e in jobs.events(run, "checkpoint_fallback")]
    checks.check(newest in fallbacks, f"no checkpoint_fallback event for step {newest} ({fallbacks})")
    resumed = [e.get("step") for e in jobs.events(run, "resumed")]
    checks.check(resumed[-1:] == [previous], f"resumed from {resumed[-1:]}, expected [{previous}]")
    return checks.result(
        f"{mode} on step {newest}: fell back to {previous}, resumed bitwise", place, lost, ttr, phases
    )


def _corrupt(ckpt: Path, mode: str, ctx: TrialContext) -> dict[str, object]:
    """Damage ``ckpt`` as ``mode`` says; what was damaged, for the placement."""
    if mode == "no_manifest":
        (ckpt / MANIFEST_NAME).unlink()
        return {"file": MANIFEST_NAME}
    names = sorted(read_manifest(ckpt).files)
    if mode == "delete_shard":
        name = ctx.rng.choice([n for n in names if n.endswith(".distcp")])
        (ckpt / name).unlink()
        return {"file": name}
    name = ctx.rng.choice(names)
    data = bytearray((ckpt / name).read_bytes())
    if mode == "truncate":
        size = ctx.rng.randrange(len(data))
        (ckpt / name).write_bytes(bytes(data[:size]))
        return {"file": name, "size": size}
    offset, bit = ctx.rng.randrange(len(data)), ctx.rng.randrange(8)
    data[offset] ^= 1 << bit
    (ckpt / name).write_bytes(bytes(data))
    return {"file": name, "offset": offset, "bit": bit}


def disk_full(ctx: TrialContext) -> TrialResult:
    """Checkpoints on a small tmpfs that fills up: one clear line naming the path, exit 2, and
    every checkpoint committed before it still verifies."""
    every, steps = _save_steps(ctx)
    size = _checkpoint_bytes(ctx)
    fits = ctx.rng.uniform(1.3, max(1.4, min(3.7, steps / every - 0.3)))
    place = {"checkpoint_bytes": size, "tmpfs_checkpoints": round(fits, 2)}
    with _tmpfs(ctx.work / "disk", int(size * fits)) as disk:
        sets = (f"checkpoint.dir={disk}", "checkpoint.keep_last=1000")
        proc = jobs.train(ctx, "run", *sets)
        checks = Checks()
        checks.exit_code(proc, 2, "the run whose disk filled")
        lines = _worker_errors(proc.stderr)
        checks.check("Traceback" not in proc.stderr, "a traceback was printed")
        checks.check(
            len(lines) == 1 and "No space left" in lines[0] and str(disk) in lines[0],
            f"not one error line naming the path: {lines[:2]}",
        )
        bad, kept = _unverified(disk), len(_visible(disk))
        checks.check(kept >= 1, "no checkpoint was committed before the disk filled")
    line = lines[0][:120] if lines else ""
    return checks.result(f"{kept} checkpoint(s) intact; {line}", place, lost=len(bad))


def _worker_errors(stderr: str) -> list[str]:
    """The distinct ``error:`` lines of the workers (each failing rank prints the same line;
    the launcher's own closing line points at them)."""
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    return list(dict.fromkeys(line for line in lines if "a worker rejected the job" not in line))


def _checkpoint_bytes(ctx: TrialContext) -> int:
    """The size of one checkpoint of this job (saved once per chaos run)."""
    cache = ctx.shared / "checkpoint-bytes" / ctx.scenario.name
    if cache.is_file():
        return int(cache.read_text())
    probe = jobs.train(ctx, "probe", f"train.steps={jobs.job_config(ctx).checkpoint.every_steps}")
    if probe.returncode != 0:
        raise RuntimeError(f"sizing a checkpoint failed: {jobs.last_line(probe.stderr)}")
    step_dir = _visible(RunLayout(ctx.work / "probe").checkpoints)[0][1]
    size = sum(p.stat().st_size for p in step_dir.rglob("*") if p.is_file())
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(str(size))
    return size


@contextlib.contextmanager
def _tmpfs(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes at ``path`` (needs root), unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    size = max(size, 64 * 1024)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)]
    done = subprocess.run(mount, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        reason = done.stderr.strip() or f"exit {done.returncode}"
        raise RuntimeError(f"disk_full mounts a small tmpfs and needs root ({os.geteuid()=}): {reason}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
