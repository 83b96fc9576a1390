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
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from harness import emit, parse_with_smoke, side_by_side
from hpcpipe.launch import zygote

LAYOUTS = {
    "fsdp_dp4": ["parallel.strategy=fsdp", "train.micro_batch_size=4"],
    "dp2_tp2": ["parallel.tp=2", "train.micro_batch_size=8"],
    "pp2_dp2": ["parallel.pp=2", "train.micro_batch_size=4"],  # 2 micro-batches per pipeline
}


def model_sets(args: argparse.Namespace) -> list[str]:
    """The GPT every run trains: a Llama of ``--layers`` x ``--d-model``, 4 heads, ``--seq-len`` tokens."""
    return [
        "model.variant=llama",
        f"model.n_layers={args.layers}",
        "model.n_heads=4",
        f"model.d_model={args.d_model}",
        f"model.seq_len={args.seq_len}",
    ]


def train(
    out: Path, name: str, nproc: int, args: argparse.Namespace, sets: list[str]
) -> list[dict[str, float]]:
    """One ``hpcpipe train`` run of ``args.steps`` steps; its metrics rows with a throughput after
    the first ``args.warmup`` steps."""
    overrides = [
        f"run.name={name}",
        f"run.out_dir={out}",
        f"data.prepared_dir={out}/prepared",
        f"data.max_bytes={args.max_bytes}",
        f"train.steps={args.steps}",
        "train.eval_every=0",
        "train.warmup_steps=2",
        "checkpoint.every_steps=0",
        "recipe.sample_tokens=0",  # no end-of-run text sample: a run's tokens/s is all it is for
        "observe.progress=false",
        f"observe.log_every={args.log_every}",
        *model_sets(args),
        *sets,
    ]
    command = ["train", "tiny", "--nproc", str(nproc)]
    command += [part for value in overrides for part in ("--set", value)]
    # Forked from this process's zygote (torch and the trainer imported once, not per run): the
    # figures are tokens/s after the warm-up steps, which a run's start-up does not touch.
    proc = zygote.run_hpcpipe(command, Path.cwd(), dict(os.environ))
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if "tokens_per_s" in r and r["step"] > args.warmup]
    if not timed:
        raise SystemExit(f"{name}: no metrics row after step {args.warmup} (--steps, --log-every)")
    return timed


def median_rate(rows: list[dict[str, float]]) -> float:
    return statistics.median(r["tokens_per_s"] for r in rows)


def median_step(rows: list[dict[str, float]]) -> float:
    return statistics.median(r["step_time_s"] for r in rows)


def layout_rate(out: Path, name: str, runs: Iterator[int], args: argparse.Namespace) -> float:
    """Median tokens/s of one run of the layout ``name`` on 4 ranks (``runs`` numbers its directory)."""
    sets = [*LAYOUTS[name], "train.global_batch_size=32", "parallel.threads_per_rank=1"]
    return median_rate(train(out, f"{name}-{next(runs)}", 4, args, sets))


def layouts(out: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    runs = itertools.count()
    arms = {name: partial(layout_rate, out, name, runs, args) for name in LAYOUTS}
    return side_by_side(arms, args.repeats)


def bubble_arms(
    out: Path, m: int, runs: Iterator[int], args: argparse.Namespace
) -> dict[str, Callable[[], float]]:
    """Median step time of one run of one process, and of pipeline 2, on m micro-batches of 4."""
    common = [f"train.global_batch_size={4 * m}", "train.micro_batch_size=4", "parallel.threads_per_rank=1"]

    def one() -> float:
        return median_step(train(out, f"one-m{m}-{next(runs)}", 1, args, common))

    def pp2() -> float:
        return median_step(train(out, f"pp2-m{m}-{next(runs)}", 2, args, [*common, "parallel.pp=2"]))

    return {"one": one, "pp2": pp2}


def bubble(out: Path, args: argparse.Namespace) -> list[dict[str, float]]:
    rows = []
    runs = itertools.count()
    for m in args.micro_batches:
        times = side_by_side(bubble_arms(out, m, runs, args), args.repeats)
        t_one, t_pp = statistics.median(times["one"]), statistics.median(times["pp2"])
        rows.append({"m": m, "measured": 1 - (t_one / 2) / t_pp, "formula": 1 / (m + 1)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the figures")
    parser.add_argument(
        "--log-every", type=int, default=5, help="observe.log_every: a metrics row every N steps"
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (model.seq_len)")
    parser.add_argument(
        "--max-bytes", type=int, default=2_000_000, help="source text tokenized (data.max_bytes)"
    )
    parser.add_argument(
        "--micro-batches", type=int, nargs="+", default=[2, 4, 8], help="pipeline 2's micro-batch counts"
    )
    # --smoke: every layout and one bubble point, once each, 3 steps of a 2-layer, 32-wide model
    # on 32 tokens (the end-of-run sample is as long as the context: one forward per token)
    toy = {"repeats": 1, "steps": 3, "warmup": 1, "log_every": 1, "layers": 2, "d_model": 32, "seq_len": 32}
    args = parse_with_smoke(parser, {**toy, "max_bytes": 50_000, "micro_batches": [2]})
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    zygote.prestart()  # before anything computes: this process becomes the runs' zygote
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        rates = layouts(out, args)
        bubbles = bubble(out, args)
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
