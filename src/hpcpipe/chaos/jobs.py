"""Real ``hpcpipe`` jobs for chaos trials: start them, bound them in time, read what they left.

Every job is a subprocess in its own session, so a timeout kills the launcher *and* its workers.
Trials of one chaos run share the prepared data and one uninterrupted reference run per
(job, ranks, overrides), under ``ctx.shared``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from hpcpipe.chaos.scenario import TrialContext
from hpcpipe.config import JobConfig, load_config
from hpcpipe.observe.metrics import read_events, read_metrics

# Never inherited from the caller: a chaos run started inside a job must not join its group.
_DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID")


class TrialTimeout(RuntimeError):
    """A job of the trial outlived ``scenario.timeout_s`` (it was killed with its workers)."""


def job_sets(ctx: TrialContext, name: str, out_dir: Path, *extra: str) -> list[str]:
    """The overrides every trial's run gets: its own run dir, the shared data, a row per step."""
    return [
        f"run.name={name}",
        f"run.out_dir={out_dir}",
        f"data.prepared_dir={ctx.shared / 'prepared'}",
        "observe.progress=false",
        *ctx.scenario.sets,
        # After the scenario's sets: the loss comparison needs every step's row (a scenario's
        # observe.log_every=1000 left the reference with none, and nothing was compared).
        "observe.log_every=1",
        *extra,
    ]


def job_config(ctx: TrialContext, *extra: str) -> JobConfig:
    """The trial's job as the trainer will see it (steps, checkpoint cadence, ...)."""
    return load_config(ctx.scenario.job, job_sets(ctx, "probe", ctx.work, *extra))


def hpcpipe_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS and not k.startswith("HPCPIPE_CHAOS_")}
    return {**env, "PYTHONUNBUFFERED": "1", **(extra or {})}


def run_hpcpipe(
    args: list[str],
    cwd: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    log: str = "hpcpipe",
    log_dir: Path | None = None,
    preload: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """``python -m hpcpipe ARGS`` to completion in its own session; TrialTimeout (its process tree
    killed) past ``timeout_s``. Forked from this process's zygote (``launch/zygote.py``, started on
    first use with ``preload`` imported: the runs' recipe modules), as a fresh interpreter would run.

    Its output is also kept in ``LOG.out`` and ``LOG.err`` in ``log_dir`` (default: ``cwd``): a
    failed trial's directory is its post-mortem."""
    from hpcpipe.launch import zygote

    try:
        how = zygote.Launch(timeout=timeout_s, new_session=True, kill=kill_tree)
        proc = zygote.run_hpcpipe(args, cwd, hpcpipe_env(env), how, preload=preload)
    except subprocess.TimeoutExpired as exc:
        _keep_log(log_dir or cwd, log, _str(exc.output), _str(exc.stderr))
        raise TrialTimeout(f"hpcpipe {' '.join(args[:2])} ran past {timeout_s:.0f} s") from None
    _keep_log(log_dir or cwd, log, proc.stdout, proc.stderr)
    return proc


def _str(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def _keep_log(cwd: Path, log: str, out: str, err: str) -> None:
    (cwd / f"{log}.out").write_text(out)
    (cwd / f"{log}.err").write_text(err)


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL a job started with ``start_new_session`` and everything it started."""
    kill_tree(proc.pid, alive=proc.poll() is None)


def kill_tree(pid: int, alive: bool = True) -> None:
    """SIGKILL the session leader ``pid`` and everything it started: its process group, and every
    descendant (torch's elastic agent starts its workers in their own sessions, so the group alone
    would leave them running). ``alive``: not reaped yet (a reaped pid may be reused: then only its
    group is killed)."""
    # The descendants first, while the leader lives (once it dies, they are re-parented and no
    # longer found), twice: the second pass catches workers started during the first.
    for _ in range(2 if alive else 0):
        for child in descendants(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def train(
    ctx: TrialContext,
    name: str,
    *extra_sets: str,
    env: dict[str, str] | None = None,
    max_restarts: int = 0,
    nproc: int | None = None,
    log: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``hpcpipe train JOB --nproc N`` into ``ctx.work / name``; its output in ``LOG.out|err``
    (default ``NAME``: a second start of the same run names its own, or it would replace the
    first's post-mortem)."""
    sets = job_sets(ctx, name, ctx.work, *extra_sets)
    args = ["train", ctx.scenario.job, "--nproc", str(nproc or ctx.scenario.nproc)]
    args += ["--max-restarts", str(max_restarts), *[a for s in sets for a in ("--set", s)]]
    return run_hpcpipe(args, ctx.work, ctx.scenario.timeout_s, env, log=log or name)


def losses(run_dir: Path) -> dict[int, float]:
    """Each logged step's loss; one that is not a number reads NaN (it matches nothing)."""
    return {int(r["step"]): _number(r["loss"]) for r in read_metrics(run_dir) if "loss" in r}


def _number(value: Any) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else math.nan


def events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir) if e.get("event") == kind]


def reference_losses(ctx: TrialContext, *extra_sets: str, nproc: int | None = None) -> dict[int, float]:
    """Per-step losses of the uninterrupted run of this job, trained once per chaos run for every
    scenario whose job trains the same steps (``JobConfig.training_hash``: checkpoint cadence,
    observers and watchdog settings do not change the losses)."""
    ranks = nproc or ctx.scenario.nproc
    key = job_config(ctx, *extra_sets, f"parallel.nproc={ranks}").training_hash()[:16]
    cache = ctx.shared / "references" / f"{key}.json"
    cached = _cached(cache)
    if cached is not None:
        return cached
    out = ctx.shared / "references" / key
    sets = job_sets(ctx, "reference", out, *extra_sets)
    args = ["train", ctx.scenario.job, "--nproc", str(ranks), *[a for s in sets for a in ("--set", s)]]
    shutil.rmtree(out, ignore_errors=True)  # an interrupted reference would resume: not uninterrupted
    out.mkdir(parents=True)
    proc = run_hpcpipe(args, out, ctx.scenario.timeout_s, log="reference")
    if proc.returncode != 0:
        raise RuntimeError(f"the reference run failed (exit {proc.returncode}): {last_line(proc.stderr)}")
    found = _every_step(losses(out / "reference"), out / "reference")
    partial = cache.with_suffix(".json.tmp")
    partial.write_text(json.dumps(found))
    partial.replace(cache)  # whole or absent
    return found


def _cached(cache: Path) -> dict[int, float] | None:
    """The reference's losses cached in ``cache``; None when there are none to use. One that lacks
    steps was cached by an hpcpipe that let a scenario's observe.log_every thin the reference (the
    key leaves observe out) and is found under --resume: it is removed, to be trained again, or
    every trial of its scenarios would fail."""
    if not cache.is_file():
        return None
    try:
        return _every_step({int(k): v for k, v in json.loads(cache.read_text()).items()}, cache)
    except RuntimeError:
        print(
            f"chaos: {cache}: a cached reference without every step's loss; training it again",
            file=sys.stderr,
        )
        cache.unlink(missing_ok=True)
        return None


def _every_step(found: dict[int, float], where: Path) -> dict[int, float]:
    """``found``, the reference's losses, when it holds every step from 1 on; else RuntimeError
    (the trial fails as a harness error): with steps missing, a resumed run that lost them, or
    logged none, would still match it."""
    steps = sorted(found)
    if not steps or steps != list(range(1, len(steps) + 1)):
        what = f"a loss for steps {steps[:5]}{' ...' if len(steps) > 5 else ''} only" if steps else "no loss"
        raise RuntimeError(f"the reference run ({where}) logged {what}; the comparison needs every step's")
    return found


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def fault_time(marker_dir: Path) -> float | None:
    """When the first chaos fault fired: its marker's mtime (``HPCPIPE_CHAOS_DIR``)."""
    times = [p.stat().st_mtime for p in marker_dir.glob("*.fired")] if marker_dir.is_dir() else []
    return min(times) if times else None


def time_to_recover(run_dir: Path, since: float | None) -> float | None:
    """Seconds from ``since`` (the fault) to the first training step logged after it."""
    if since is None:
        return None
    after = [
        float(r["time"]) for r in read_metrics(run_dir) if "loss" in r and float(r.get("time", 0)) > since
    ]
    return min(after) - since if after else None


def recovery_phases(run_dir: Path, since: float | None) -> dict[str, float] | None:
    """``time_to_recover`` split into phases (``chaos/phases.py``); None where it is None."""
    from hpcpipe.chaos.phases import milestones, split

    if since is None:
        return None
    return split(milestones(read_events(run_dir), read_metrics(run_dir), since), since)


def lost_steps(reference: dict[int, float], got: dict[int, float], rel: float = 0.0) -> list[int]:
    """Reference steps missing from ``got`` or differing (bitwise when ``rel`` is 0). A NaN or
    infinite loss on either side differs: written as ``> tol``, every comparison with NaN was
    False, and a run that diverged to NaN matched."""
    bad = []
    for step, want in reference.items():
        have = got.get(step)
        if have is None or not abs(have - want) <= rel * abs(want) or not math.isfinite(want):
            bad.append(step)
    return bad


def chaos_env(ctx: TrialContext, **faults: str) -> dict[str, str]:
    """``HPCPIPE_CHAOS_<KIND>`` values plus the trial's marker directory."""
    env = {f"HPCPIPE_CHAOS_{kind.upper()}": value for kind, value in faults.items()}
    return {**env, "HPCPIPE_CHAOS_DIR": str(ctx.work / "markers")}
