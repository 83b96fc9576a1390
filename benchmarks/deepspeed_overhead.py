"""hpcpipe's DeepSpeed strategy vs a hand-written ``deepspeed.initialize`` loop, and vs hpcpipe's
FSDP2, on 2 ranks (gloo on CPU, NCCL on GPUs), side by side in one run.

Every rank builds all three on the same GPT (same config and initial weights), the same
in-memory token tensor, AdamW at the same hyper-parameters, clipping and LR schedule:

- ``hpcpipe``: the Trainer with ``parallel.strategy=deepspeed`` (ZeRO stage ``--stage``);
- ``raw``: what the DeepSpeed tutorials write: ``deepspeed.initialize(model, optimizer, config)``
  with the same ZeRO config, then ``loss = engine(x)...; engine.backward(loss); engine.step()``;
- ``fsdp``: the Trainer with ``parallel.strategy=fsdp``.

Timed blocks rotate (hpcpipe, raw, fsdp; raw, fsdp, hpcpipe; ...) so drift on a shared machine
hits all three; the result is the ratio of median tokens/s (target: hpcpipe/raw >= 0.95).

    .venv/bin/python benchmarks/deepspeed_overhead.py [--repeats 7] [--steps 10] [--stage 3]

``--model qwen2-7b-shape`` is not offered here: the LoRA path on GPUs is
``hpcpipe bench throughput lora-fc-qwen2-7b-zero3`` next to ``lora-fc-qwen2-7b`` (FSDP2).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ddp_harness import finish, join_group, ranks_fork_from_here, spawn
from harness import Comparison, block_parser, compare_loops, emit, parse_with_smoke, print_table, trainer_loop
from hpcpipe.config import load_config
from hpcpipe.models.gpt import GPT
from hpcpipe.netutil import free_port
from hpcpipe.train.deepspeed import import_deepspeed
from hpcpipe.train.deepspeed_config import deepspeed_settings
from hpcpipe.train.optim import build_optimizer
from hpcpipe.train.schedule import lr_at
from in_memory_gpt import TensorLoader, in_memory_trainer, quickstart_job, random_tokens

WORLD = 2


def job_for(args: argparse.Namespace, strategy: str, out: Path) -> Any:
    sets = [f"parallel.strategy={strategy}", f"parallel.zero_stage={args.stage}", f"run.name={strategy}"]
    return quickstart_job(out, WORLD, args.batch, args.vocab, sets)


class RawDeepSpeedLoop:
    """``deepspeed.initialize`` and the tutorial loop, with the same config hpcpipe derives."""

    def __init__(self, job: Any, tokens: torch.Tensor, vocab: int, ctx: Any) -> None:
        deepspeed = import_deepspeed(ctx.device)
        torch.manual_seed(job.run.seed)  # the same initial weights as the Trainer's
        model = GPT(job.model, vocab).to(ctx.device)
        optimizer = build_optimizer(model, job.train, ctx.device)
        config = deepspeed_settings(job, WORLD, accum=1).config
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=config, dist_init_required=False
        )
        self.loader = TensorLoader(tokens, job.train.micro_batch_size)
        self.job, self.step = job, 0

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step += 1
            for group in self.engine.optimizer.param_groups:
                group["lr"] = lr_at(self.step, self.job.train)
            x, y = self.loader.next_microbatch()
            logits = self.engine(x)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
            self.engine.backward(loss)
            self.engine.step()
            if self.step % self.job.observe.log_every == 0:
                loss.item()


def rank_main(rank: int, port: int, args: argparse.Namespace, out: Path) -> None:
    # Here, not in main: main forks the ranks' server before anything touches CUDA.
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")
    jobs = {
        name: job_for(args, strategy, out) for name, strategy in (("hpcpipe", "deepspeed"), ("fsdp", "fsdp"))
    }
    ctx = join_group(rank, WORLD, port, jobs["hpcpipe"].parallel)
    seq = jobs["hpcpipe"].model.seq_len
    tokens = random_tokens(args.vocab, seq)
    trainers = {
        name: in_memory_trainer(job, tokens, args.vocab, ctx, out / job.run.name)
        for name, job in jobs.items()
    }
    raw = RawDeepSpeedLoop(jobs["hpcpipe"], tokens, args.vocab, ctx)
    loops = {
        "hpcpipe": trainer_loop(trainers["hpcpipe"]),
        "raw": raw.run,
        "fsdp": trainer_loop(trainers["fsdp"]),
    }
    # warm-up of 2 steps each: allocator, first optimizer state, ZeRO's partitions
    rates = compare_loops(loops, args.repeats, args.steps, args.batch * seq * WORLD, warmup=2)
    for trainer in trainers.values():
        trainer.close()
    finish(rank, rates, out)


def main() -> None:
    parser = block_parser(__doc__, repeats=7, steps=10)
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--stage", type=int, default=3, choices=(0, 1, 2, 3))
    args = parse_with_smoke(parser, {"repeats": 1, "steps": 1, "batch": 1, "vocab": 256})
    ranks_fork_from_here()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        rates = spawn(rank_main, (free_port(), args, out), WORLD, out)

    versus_raw, versus_fsdp = Comparison.of(rates, "hpcpipe", "raw"), Comparison.of(rates, "hpcpipe", "fsdp")
    seq = load_config("quickstart").model.seq_len
    print(f"{WORLD} ranks, batch {args.batch}x{seq} tokens per rank, ZeRO-{args.stage}, "
          f"{args.repeats} repeats x {args.steps} steps, rotated")  # fmt: skip
    print_table("loop", "tok/s", rates, decimals=0)
    print(f"deepspeed: {versus_raw.summary(0.95)}")
    print(f"deepspeed/fsdp: {versus_fsdp.summary()}")
    emit(
        {
            "benchmark": "deepspeed_overhead",
            "zero_stage": args.stage,
            "world_size": WORLD,
            "hpcpipe_tokens_per_s": round(versus_raw.top_median, 1),
            "raw_deepspeed_tokens_per_s": round(versus_raw.bottom_median, 1),
            "fsdp_tokens_per_s": round(versus_fsdp.bottom_median, 1),
            "ratio": round(versus_raw.ratio, 4),
            "paired_ratio": round(versus_raw.paired, 4),
            "ratio_vs_fsdp": round(versus_fsdp.ratio, 4),
            "target": 0.95,
            "repeats": args.repeats,
            "steps": args.steps,
        }
    )


if __name__ == "__main__":
    main()
