"""hpcpipe's training-step throughput vs a hand-written PyTorch loop, side by side in one process.

Both train the same GPT (same config, same initial weights), on the same in-memory token
tensors, with AdamW at the same hyper-parameters, clipping and LR schedule, on the same number of
threads. Timed blocks alternate (hpcpipe, raw, raw, hpcpipe, ...) so drift on a shared machine
hits both; the ratio of medians is the result (target >= 0.98).

    .venv/bin/python benchmarks/trainer_overhead.py [--repeats 11] [--steps 15]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from harness import block_parser, compare_loops, parse_with_smoke, report_pair, trainer_loop
from hpcpipe.config import load_config
from hpcpipe.models.gpt import GPT
from hpcpipe.train.distributed import init_distributed
from hpcpipe.train.environment import DistEnv
from hpcpipe.train.optim import build_optimizer
from hpcpipe.train.schedule import lr_at
from hpcpipe.train.trainer import Trainer
from in_memory_gpt import TensorLoader, in_memory_trainer, quickstart_job, random_tokens


def build(args: argparse.Namespace, tokens: torch.Tensor, run_dir: Path) -> tuple[Trainer, Any]:
    retain = f"parallel.retain_host_memory={not args.no_retain_host_memory}"
    job = quickstart_job(run_dir, 1, args.batch, args.vocab, [retain])
    env = DistEnv(kind="single", rank=0, local_rank=0, world_size=1, local_world_size=1)
    ctx = init_distributed(job.parallel, env)
    trainer = in_memory_trainer(job, tokens, args.vocab, ctx, run_dir)

    torch.manual_seed(job.run.seed)  # the raw loop starts from the same weights
    model = GPT(job.model, args.vocab)
    raw = RawLoop(model, build_optimizer(model, job.train, ctx.device), TensorLoader(tokens, args.batch), job)
    return trainer, raw


class RawLoop:
    """What a researcher writes by hand: forward, loss, backward, clip, step."""

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: TensorLoader, job: Any
    ) -> None:
        self.model, self.optimizer, self.loader, self.job = model, optimizer, loader, job
        self.step = 0

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step += 1
            for group in self.optimizer.param_groups:
                group["lr"] = lr_at(self.step, self.job.train)
            x, y = self.loader.next_microbatch()
            logits = self.model(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.job.train.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.step % self.job.observe.log_every == 0:
                loss.item()  # a hand-written loop prints its loss now and then, too


def main() -> None:
    parser = block_parser(__doc__, repeats=11, steps=15)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument(
        "--no-retain-host-memory",
        action="store_true",
        help="parallel.retain_host_memory=false (the process-wide glibc setting; affects both loops)",
    )
    args = parse_with_smoke(parser, {"repeats": 1, "steps": 2, "batch": 2, "vocab": 256})

    job_seq = load_config("quickstart").model.seq_len
    tokens = random_tokens(args.vocab, job_seq)
    tokens_per_step = args.batch * job_seq
    with tempfile.TemporaryDirectory() as tmp:
        trainer, raw = build(args, tokens, Path(tmp))
        loops = {"hpcpipe": trainer_loop(trainer), "raw": raw.run}
        # warm-up of 3 steps each: allocator, kernels, first optimizer state
        runs = compare_loops(loops, args.repeats, args.steps, tokens_per_step, warmup=3)
        trainer.close()

    print(
        f"threads={torch.get_num_threads()} batch={args.batch}x{job_seq} tokens, "
        f"{args.repeats} repeats x {args.steps} steps, interleaved"
    )
    fields = {
        "repeats": args.repeats,
        "steps": args.steps,
        "retain_host_memory": not args.no_retain_host_memory,
    }
    report_pair("trainer_overhead", runs, ("tok/s", "tokens_per_s"), 0.98, fields, decimals=0)


if __name__ == "__main__":
    main()
