"""A recipe from outside hpcpipe trained by hpcpipe vs a hand-written DDP loop of the same model and
data, side by side in one run on gloo ranks.

The recipe is examples/recipes/stdlib-classifier (a byte-level CNN telling which standard-library
package a snippet of Python comes from), named by import path, as a user's package would be.
Both loops train the same model from the same weights on the same dataset (the recipe's own
``datasets()``), with the same AdamW (``train/optim.py``), LR schedule and clipping, the same
micro-batch per rank, 1 optimizer step per micro-batch. hpcpipe's side is its Trainer with the
recipe's DatasetRecipe loader (shuffled, rank-sharded, resumable, each sample's RNG seeded); the
hand-written side is what a DDP tutorial writes: DataLoader + DistributedSampler, DDP, forward,
cross-entropy, backward, clip, step. Timed blocks alternate on every rank in lockstep; the ratio of
the median samples/s is the result (target >= 0.98).

    .venv/bin/python benchmarks/example_recipe_overhead.py [--nproc 2] [--repeats 7] [--steps 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "recipes" / "stdlib-classifier"
sys.path.insert(0, str(EXAMPLE / "src"))  # the example is named by import path, not installed

from ddp_harness import (  # noqa: E402
    SampledBatches,
    compare_on_rank,
    ranks_fork_from_here,
    raw_steps,
    spawn,
    timing_overrides,
)
from harness import block_parser, parse_with_smoke, report_pair  # noqa: E402
from hpcpipe.config import JobConfig, load_config  # noqa: E402
from hpcpipe.netutil import free_port  # noqa: E402
from hpcpipe.train.optim import build_optimizer  # noqa: E402

RECIPE = "stdlib_classifier.recipe:StdlibClassifier"


def job_for(args: argparse.Namespace, out: Path) -> JobConfig:
    return load_config(
        EXAMPLE / "job.yaml",
        [
            f"run.recipe={RECIPE}",
            f"run.out_dir={out}",
            *timing_overrides(args.steps, args.batch, args.nproc),
            *([f"recipe.train_per_class={args.per_class}"] if args.per_class else []),
        ],
    )


class RawLoop:
    """A hand-written DDP loop over the recipe's model and training dataset."""

    def __init__(self, job: JobConfig, recipe: Any, ctx: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel

        torch.manual_seed(job.run.seed)
        self.model = DistributedDataParallel(recipe.build_model())
        self.optimizer = build_optimizer(self.model, job.train, ctx.device)
        micro = job.train.micro_batch_size
        self.batches = SampledBatches(recipe.data.train, micro, ctx.rank, ctx.world_size, job.run.seed)
        self.job, self.step = job, 0

    def loss(self) -> torch.Tensor:
        x, y = self.batches.next()  # (B, T) int64 bytes, (B,) labels
        return F.cross_entropy(self.model(x).float(), y)

    def run(self, steps: int) -> None:
        self.step = raw_steps(self.model, self.optimizer, self.job, self.step, steps, self.loss)


def worker(rank: int, args: argparse.Namespace, port: int, out: Path) -> None:
    job = job_for(args, out)
    compare_on_rank(rank, job, port, out, RawLoop, args.batch * args.nproc, args)


def main() -> None:
    parser = block_parser(__doc__, repeats=7, steps=20)
    parser.add_argument("--nproc", type=int, default=2, help="DDP ranks (gloo on CPU)")
    parser.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    parser.add_argument(
        "--per-class", type=int, default=None, help="recipe.train_per_class (default: the job's)"
    )
    args = parse_with_smoke(parser, {"repeats": 1, "steps": 2, "batch": 4, "per_class": 8})
    ranks_fork_from_here()

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        result = spawn(worker, (args, free_port(), out), args.nproc, out)
    print(
        f"{args.nproc} gloo ranks x {result['threads']} threads, stdlib-classifier (byte CNN), "
        f"{args.batch} samples/rank/step, {args.repeats} repeats x {args.steps} steps, interleaved"
    )
    fields = {"nproc": args.nproc, "batch_per_rank": args.batch, "repeats": args.repeats, "steps": args.steps}
    report_pair("example_recipe_overhead", result, ("samples/s", "samples_per_s"), 0.98, fields)


if __name__ == "__main__":
    main()
