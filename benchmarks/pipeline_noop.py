"""What `hpcpipe run` costs when nothing changed: the quickstart run once in full, then again
several times, each skipping every step.

Side by side in one run: the full pipeline's wall time (the work), the no-op CLI's wall time
(interpreter, imports, config, deciding), and the in-process decision alone (hashing the dataset
manifest, the newest checkpoint's manifest, the export and report files against lineage.json).
Ratios: no-op / full, and decision / no-op. Medians of ``--repeats`` no-op runs.

    .venv/bin/python benchmarks/pipeline_noop.py [--repeats 5] [--set train.steps=100 ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

from harness import emit, parse_with_smoke
from hpcpipe.config import load_config
from hpcpipe.observe.lineage import read_lineage
from hpcpipe.pipeline.engine import StepContext, decide
from hpcpipe.pipeline.steps import STEPS


def cli_run(job: str, sets: list[str]) -> tuple[float, str]:
    args = [a for s in sets for a in ("--set", s)]
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "hpcpipe", "run", job, *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"hpcpipe run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start, proc.stdout


def decision_time(job: str, sets: list[str]) -> float:
    """Every step's decide(), in process, against the recorded lineage (what a no-op run does)."""
    cfg = load_config(job, sets)
    start = time.perf_counter()
    ctx = StepContext(cfg, cfg.run_dir, say=lambda _: None)
    records = read_lineage(cfg.run_dir).get("steps") or {}
    actions = [decide(step, ctx, records, forced=False).action for step in STEPS]
    elapsed = time.perf_counter() - start
    if set(actions) != {"skip"}:
        raise SystemExit(f"expected every step to be skipped, got {actions}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--job", default="quickstart")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--set", dest="sets", action="append", default=[], help="config override (repeatable)"
    )
    # --smoke: the tiny preset's pipeline, 2 training steps on 50 kB of text, one no-op run
    toy = {"job": "tiny", "repeats": 1, "sets": ["train.steps=2", "data.max_bytes=50000"]}
    args = parse_with_smoke(parser, toy)
    with tempfile.TemporaryDirectory() as tmp:
        sets = [f"run.out_dir={tmp}", *args.sets]
        full, _ = cli_run(args.job, sets)
        noop, decide_s = [], []
        for _ in range(args.repeats):
            seconds, out = cli_run(args.job, sets)
            if out.count("skip ") != len(STEPS):
                raise SystemExit(f"a no-op run ran something:\n{out}")
            noop.append(seconds)
            decide_s.append(decision_time(args.job, sets))
        steps = load_config(args.job, sets).train.steps
    cli, dec = statistics.median(noop), statistics.median(decide_s)
    print(f"{args.job} ({steps} steps): full run {full:.1f} s; no-op run median {cli:.2f} s "
          f"(min {min(noop):.2f}, max {max(noop):.2f}); deciding alone {dec * 1000:.0f} ms")  # fmt: skip
    print(f"ratio no-op/full = {cli / full:.4f}; deciding/no-op = {dec / cli:.3f}")
    emit({
        "benchmark": "pipeline_noop", "job": args.job, "train_steps": steps, "repeats": args.repeats,
        "full_s": round(full, 2), "noop_s": round(cli, 3), "decide_s": round(dec, 4),
        "ratio_noop_full": round(cli / full, 5), "ratio_decide_noop": round(dec / cli, 4),
    })  # fmt: skip


if __name__ == "__main__":
    main()
