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
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from hpcpipe.config import load_config
from hpcpipe.models.gpt import GPT
from hpcpipe.netutil import free_port
from hpcpipe.train.deepspeed import import_deepspeed
from hpcpipe.train.deepspeed_config import deepspeed_settings
from hpcpipe.train.distributed import init_distributed
from hpcpipe.train.environment import DistEnv
from hpcpipe.train.optim import build_optimizer
from hpcpipe.train.schedule import lr_at
from hpcpipe.train.trainer import Trainer
from run_context import print_rates, run_context
from trainer_overhead import InMemoryGPTRecipe, TensorLoader

WORLD = 2


def job_for(args: argparse.Namespace, strategy: str, run_dir: Path) -> Any:
    return load_config(
        "quickstart",
        [
            f"train.steps={10**6}",
            "train.eval_every=0",
            "observe.progress=false",
            f"parallel.nproc={WORLD}",
            f"parallel.strategy={strategy}",
            f"parallel.zero_stage={args.stage}",
            f"train.micro_batch_size={args.batch}",
            f"train.global_batch_size={args.batch * WORLD}",
            f"model.vocab_size={args.vocab}",
            f"run.out_dir={run_dir}",
            f"run.name={strategy}",
        ],
    )


def trainer_for(job: Any, tokens: torch.Tensor, vocab: int, ctx: Any) -> Trainer:
    recipe = InMemoryGPTRecipe.from_job(job)
    recipe.tokens, recipe.fixed_vocab = tokens, vocab
    run_dir = Path(job.run.out_dir) / job.run.name
    run_dir.mkdir(parents=True, exist_ok=True)
    return Trainer(job, recipe, ctx, run_dir)


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


def timed(fn: Any, steps: int, tokens_per_step: int) -> float:
    dist.barrier()  # every rank starts the block together: the slowest rank sets the time
    start = time.perf_counter()
    fn(steps)
    dist.barrier()
    return tokens_per_step * steps / (time.perf_counter() - start)


def rank_main(rank: int, port: int, args: argparse.Namespace, tmp: str, out: str) -> None:
    env = DistEnv("torchrun", rank, rank, WORLD, WORLD, "127.0.0.1", port)
    jobs = {
        name: job_for(args, strategy, Path(tmp))
        for name, strategy in (("hpcpipe", "deepspeed"), ("fsdp", "fsdp"))
    }
    ctx = init_distributed(jobs["hpcpipe"].parallel, env)
    torch.manual_seed(0)
    seq = jobs["hpcpipe"].model.seq_len
    tokens = torch.randint(0, args.vocab, (256, seq + 1))
    trainers = {name: trainer_for(job, tokens, args.vocab, ctx) for name, job in jobs.items()}
    raw = RawDeepSpeedLoop(jobs["hpcpipe"], tokens, args.vocab, ctx)
    loops = {
        "hpcpipe": lambda n: trainers["hpcpipe"].train_until(trainers["hpcpipe"].step + n),
        "raw": raw.run,
        "fsdp": lambda n: trainers["fsdp"].train_until(trainers["fsdp"].step + n),
    }
    tokens_per_step = args.batch * seq * WORLD
    for fn in loops.values():
        fn(2)  # warm-up: allocator, first optimizer state, ZeRO's partitions
    rates: dict[str, list[float]] = {name: [] for name in loops}
    names = list(loops)
    for i in range(args.repeats):
        for name in names[i % 3 :] + names[: i % 3]:
            rates[name].append(timed(loops[name], args.steps, tokens_per_step))
    for trainer in trainers.values():
        trainer.close()
    if rank == 0:
        Path(out).write_text(json.dumps(rates))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # gloo may abort at interpreter exit


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per timed block")
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--stage", type=int, default=3, choices=(0, 1, 2, 3))
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rates.json"
        mp.start_processes(rank_main, (free_port(), args, tmp, str(out)), nprocs=WORLD, start_method="spawn")
        rates = json.loads(out.read_text())

    med = {name: statistics.median(xs) for name, xs in rates.items()}
    seq = load_config("quickstart").model.seq_len
    print(f"{WORLD} ranks, batch {args.batch}x{seq} tokens per rank, ZeRO-{args.stage}, "
          f"{args.repeats} repeats x {args.steps} steps, rotated")  # fmt: skip
    print_rates("loop", "tok/s", rates, decimals=0)
    print(f"ratio hpcpipe/raw deepspeed = {med['hpcpipe'] / med['raw']:.3f} (target >= 0.95)")
    print(f"ratio hpcpipe deepspeed/fsdp = {med['hpcpipe'] / med['fsdp']:.3f}")
    print(
        json.dumps(
            {
                "benchmark": "deepspeed_overhead",
                "zero_stage": args.stage,
                "world_size": WORLD,
                "hpcpipe_tokens_per_s": round(med["hpcpipe"], 1),
                "raw_deepspeed_tokens_per_s": round(med["raw"], 1),
                "fsdp_tokens_per_s": round(med["fsdp"], 1),
                "ratio": round(med["hpcpipe"] / med["raw"], 4),
                "ratio_vs_fsdp": round(med["hpcpipe"] / med["fsdp"], 4),
                "target": 0.95,
                "repeats": args.repeats,
                "steps": args.steps,
                **run_context(),
            }
        )
    )


if __name__ == "__main__":
    main()
