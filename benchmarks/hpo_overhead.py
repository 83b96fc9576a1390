"""What driving trials through `hpcpipe hpo` costs, against plain Optuna driving the same training.

Side by side in one run, ``--trials`` trials of the same job and the same seeded random sampler:

- **hpcpipe**: ``hpcpipe hpo run JOB`` (SQLite, one worker): every trial a ``hpcpipe train``
  subprocess with its own run directory, heartbeat and tell.
- **plain Optuna**: ``study.optimize`` in this process, whose objective trains the same config
  in-process (``hpcpipe.launch.job.run_job`` on one process) and returns the last ``val_loss``.

Printed: the per-trial overhead (a trial's wall time in the study minus the training inside it,
from the run's ``group_start`` to ``run_finished`` events; median over trials), the study's wall
time for all trials in both drivers and their ratio (medians over ``--repeats``), and a JSON line.

    .venv/bin/python benchmarks/hpo_overhead.py [--trials 4] [--repeats 3] [--job tiny-hpo]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import optuna

from harness import emit, measure_round, parse_with_smoke
from hpcpipe.config import load_config
from hpcpipe.hpo.space import suggest, trial_config
from hpcpipe.hpo.study import plan_study
from hpcpipe.hpo.worker import final_metric
from hpcpipe.observe.metrics import read_events
from hpcpipe.train.trial import open_storage

FIXED = ["hpo.sampler.name=random", "hpo.pruner.name=none", "hpo.seed=0", "hpo.storage=null"]  # SQLite


def hpcpipe_study(job: str, sets: list[str], trials: int, overheads: list[float]) -> float:
    """Wall time of `hpcpipe hpo run`; each trial's overhead (its wall time minus training)
    appended to ``overheads``."""
    args = [a for s in [*sets, f"hpo.n_trials={trials}"] for a in ("--set", s)]
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "hpcpipe", "hpo", "run", job, *args],
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"hpcpipe hpo run failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    plan = plan_study(load_config(job, sets))
    study = optuna.load_study(study_name=plan.name, storage=open_storage(plan.storage_url))
    for trial in study.get_trials():
        events = {e["event"]: e["time"] for e in read_events(Path(trial.user_attrs["run_dir"]))}
        trained = events["run_finished"] - events["group_start"]
        overheads.append((trial.datetime_complete - trial.datetime_start).total_seconds() - trained)
    return wall


def plain_study(job: str, sets: list[str], trials: int, out: Path) -> float:
    """The same trials driven by study.optimize, training in this process."""
    from hpcpipe.launch.job import run_job

    base = load_config(job, sets)

    def objective(trial: optuna.Trial) -> float:
        cfg = trial_config(base, suggest(trial, base.hpo.space), f"plain-{trial.number:04d}", str(out))
        run_job(cfg)
        return final_metric(cfg.run_dir, base.hpo.metric) or float("inf")

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    start = time.perf_counter()
    study.optimize(objective, n_trials=trials)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--job", default="tiny-hpo")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--set", dest="sets", action="append", default=[], help="config override (repeatable)"
    )
    # --smoke: one trial per driver of 2 steps (evaluated at the last) on 50 kB of text
    toy = {"trials": 1, "repeats": 1, "sets": ["train.steps=2", "train.eval_every=2", "data.max_bytes=50000"]}
    args = parse_with_smoke(parser, toy)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    walls: dict[str, list[float]] = {"hpcpipe": [], "plain": []}
    overheads: list[float] = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            sets = [f"run.out_dir={tmp}", *FIXED, *args.sets]
            arms = {
                "hpcpipe": partial(hpcpipe_study, args.job, sets, args.trials, overheads),
                "plain": partial(plain_study, args.job, sets, args.trials, Path(tmp) / "plain"),
            }
            measure_round(arms, repeat, walls)
        ours, plain = walls["hpcpipe"], walls["plain"]
        print(f"repeat {repeat + 1}: hpcpipe {ours[-1]:.1f} s, plain Optuna {plain[-1]:.1f} s", flush=True)
    over, o, p = statistics.median(overheads), statistics.median(ours), statistics.median(plain)
    print(f"{args.job}, {args.trials} trials: per-trial overhead median {over:.2f} s "
          f"(min {min(overheads):.2f}, max {max(overheads):.2f})")  # fmt: skip
    print(
        f"study wall time: hpcpipe {o:.1f} s, plain Optuna in-process {p:.1f} s; "
        f"ratio hpcpipe/plain = {o / p:.3f}"
    )
    emit({
        "benchmark": "hpo_overhead", "job": args.job, "trials": args.trials, "repeats": args.repeats,
        "trial_overhead_s": round(over, 3), "hpcpipe_s": round(o, 2), "plain_optuna_s": round(p, 2),
        "ratio_hpcpipe_plain": round(o / p, 4),
    })  # fmt: skip


if __name__ == "__main__":
    main()
