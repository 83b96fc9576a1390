"""Tensor and pipeline layouts against FSDP2 on the same model, and the pipeline bubble measured
against its formula.

1. Layouts: the same GPT, global batch and steps under ``hpcpipe train`` on 4 gloo CPU ranks:
   FSDP2 over 4 data-parallel ranks (the reference), dp 2 x tp 2, and pp 2 x dp 2. Runs alternate
   (A B C, B C A, ...) so drift on a shared machine hits each; the result is the ratio of median
   tokens/s to FSDP2's. On CPU this is not what a GPU cluster sees: gloo moves tensor-parallel
   activations through the kernel's loopback at memory speed, where NVLink does it in
   microseconds, and 4 ranks share the machine's cores.
2. Bubble: pipeline parallel 2 (``parallel.pp=2``, 2 ranks, one thread each) against one process
   with one thread on the same global batch, for m micro-batches: the measured idle share is
   ``1 - (T_one / 2) / T_pp`` (each stage does half the work of one process), set beside
   ``(p - 1) / (m + p - 1)``. Point-to-point sends and the tied embedding's all-reduce count in
   the measured share, not in the formula.

    .venv/bin/python benchmarks/parallel_layouts.py [--repeats 3] [--steps 30]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from harness import emit, side_by_side

MODEL = ["model.variant=llama", "model.n_layers=4", "model.n_heads=4", "model.d_model=256"]
MODEL += ["model.seq_len=128"]
LAYOUTS = {
    "fsdp_dp4": ["parallel.strategy=fsdp", "train.micro_batch_size=4"],
    "dp2_tp2": ["parallel.tp=2", "train.micro_batch_size=8"],
    "pp2_dp2": ["parallel.pp=2", "train.micro_batch_size=4"],  # 2 micro-batches per pipeline
}


def train(out: Path, name: str, nproc: int, steps: int, sets: list[str]) -> list[dict[str, float]]:
    """One ``hpcpipe train`` run; its metrics rows with a throughput."""
    args = [
        f"run.name={name}",
        f"run.out_dir={out}",
        f"data.prepared_dir={out}/prepared",
        "data.max_bytes=2000000",
        f"train.steps={steps}",
        "train.eval_every=0",
        "train.warmup_steps=2",
        "checkpoint.every_steps=0",
        "observe.progress=false",
        "observe.log_every=5",
        *MODEL,
        *sets,
    ]
    command = [sys.executable, "-m", "hpcpipe", "train", "tiny", "--nproc", str(nproc)]
    command += [part for value in args for part in ("--set", value)]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "tokens_per_s" in r and r["step"] > 10]  # after warm-up


def median_rate(rows: list[dict[str, float]]) -> float:
    return statistics.median(r["tokens_per_s"] for r in rows)


def median_step(rows: list[dict[str, float]]) -> float:
    return statistics.median(r["step_time_s"] for r in rows)


def layout_rate(out: Path, name: str, runs: Iterator[int], steps: int) -> float:
    """Median tokens/s of one run of the layout ``name`` on 4 ranks (``runs`` numbers its directory)."""
    sets = [*LAYOUTS[name], "train.global_batch_size=32", "parallel.threads_per_rank=1"]
    return median_rate(train(out, f"{name}-{next(runs)}", 4, steps, sets))


def layouts(out: Path, repeats: int, steps: int) -> dict[str, list[float]]:
    runs = itertools.count()
    return side_by_side({name: partial(layout_rate, out, name, runs, steps) for name in LAYOUTS}, repeats)


def bubble_arms(out: Path, m: int, runs: Iterator[int], steps: int) -> dict[str, Callable[[], float]]:
    """Median step time of one run of one process, and of pipeline 2, on m micro-batches of 4."""
    common = [f"train.global_batch_size={4 * m}", "train.micro_batch_size=4", "parallel.threads_per_rank=1"]

    def one() -> float:
        return median_step(train(out, f"one-m{m}-{next(runs)}", 1, steps, common))

    def pp2() -> float:
        return median_step(train(out, f"pp2-m{m}-{next(runs)}", 2, steps, [*common, "parallel.pp=2"]))

    return {"one": one, "pp2": pp2}


def bubble(out: Path, repeats: int, steps: int, micro_batches: tuple[int, ...]) -> list[dict[str, float]]:
    rows = []
    runs = itertools.count()
    for m in micro_batches:
        times = side_by_side(bubble_arms(out, m, runs, steps), repeats)
        t_one, t_pp = statistics.median(times["one"]), statistics.median(times["pp2"])
        rows.append({"m": m, "measured": 1 - (t_one / 2) / t_pp, "formula": 1 / (m + 1)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        rates = layouts(out, args.repeats, args.steps)
        bubbles = bubble(out, args.repeats, args.steps, (2, 4, 8))
    reference = statistics.median(rates["fsdp_dp4"])
    print(f"{'layout (4 gloo CPU ranks)':<28}{'median tokens/s':>16}{'vs FSDP2 dp 4':>15}")
    ratios = {}
    for name, xs in rates.items():
        ratios[name] = statistics.median(xs) / reference
        print(f"{name:<28}{statistics.median(xs):>16,.0f}{ratios[name]:>15.3f}")
    print(f"\n{'pipeline 2, micro-batches':<28}{'bubble measured':>16}{'formula':>15}")
    for row in bubbles:
        print(f"{row['m']:<28}{row['measured']:>16.3f}{row['formula']:>15.3f}")
    emit({"benchmark": "parallel_layouts", "ratios_vs_fsdp_dp4": ratios, "bubble": bubbles})


if __name__ == "__main__":
    main()
