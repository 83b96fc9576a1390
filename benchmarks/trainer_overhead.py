"""hpcpipe's training-step throughput vs a hand-written PyTorch loop, side by side in one process.

Both train the same GPT (same config, same initial weights), on the same in-memory token
tensors, with AdamW at the same hyper-parameters, clipping and LR schedule, on the same number of
threads. Timed blocks alternate (hpcpipe, raw, raw, hpcpipe, ...) so drift on a shared machine
hits both; the ratio of medians is the result (target >= 0.98).

    .venv/bin/python benchmarks/trainer_overhead.py [--repeats 11] [--steps 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from hpcpipe.config import load_config
from hpcpipe.models.gpt import GPT
from hpcpipe.recipes.gpt import GPTRecipe
from hpcpipe.train.distributed import init_distributed
from hpcpipe.train.environment import DistEnv
from hpcpipe.train.optim import build_optimizer
from hpcpipe.train.schedule import lr_at
from hpcpipe.train.trainer import Trainer
from run_context import print_rates, run_context


@dataclass
class TensorLoader:
    """Serves micro-batches from one fixed (N, T+1) token tensor, cycling."""

    tokens: torch.Tensor  # (N, T+1) int64
    micro_batch_size: int
    cursor: int = 0

    def next_microbatch(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.tokens.shape[0]
        idx = torch.arange(self.cursor, self.cursor + self.micro_batch_size) % n
        self.cursor = (self.cursor + self.micro_batch_size) % n
        window = self.tokens[idx]  # (B, T+1)
        return window[:, :-1], window[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = int(state["cursor"])

    def set_micro_batch_size(self, micro_batch_size: int) -> None:
        self.micro_batch_size = micro_batch_size

    def close(self) -> None:
        return None  # nothing to release (the Trainer closes its loader at the end)


class InMemoryGPTRecipe(GPTRecipe):
    """The GPT recipe with its dataset replaced by a token tensor (no files involved)."""

    tokens: torch.Tensor
    fixed_vocab: int

    def prepare(self, progress: bool) -> None:
        return None

    @property
    def vocab_size(self) -> int:  # type: ignore[override]
        return self.fixed_vocab

    def train_loader(self, rank: int, world_size: int) -> TensorLoader:  # type: ignore[override]
        return TensorLoader(self.tokens, self.train_cfg.micro_batch_size)


def build(args: argparse.Namespace, tokens: torch.Tensor, run_dir: Path) -> tuple[Trainer, Any]:
    job = load_config(
        "quickstart",
        [
            f"train.steps={10**6}",
            "train.eval_every=0",
            "parallel.nproc=1",
            "observe.progress=false",
            f"train.micro_batch_size={args.batch}",
            f"train.global_batch_size={args.batch}",
            f"model.vocab_size={args.vocab}",
            f"run.out_dir={run_dir}",
            f"parallel.retain_host_memory={not args.no_retain_host_memory}",
        ],
    )
    recipe = InMemoryGPTRecipe.from_job(job)
    recipe.tokens, recipe.fixed_vocab = tokens, args.vocab
    env = DistEnv(kind="single", rank=0, local_rank=0, world_size=1, local_world_size=1)
    ctx = init_distributed(job.parallel, env)
    trainer = Trainer(job, recipe, ctx, run_dir)

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


def timed(fn: Any, steps: int, tokens_per_step: int) -> float:
    start = time.perf_counter()
    fn(steps)
    return tokens_per_step * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--steps", type=int, default=15, help="optimizer steps per timed block")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument(
        "--no-retain-host-memory",
        action="store_true",
        help="parallel.retain_host_memory=false (the process-wide glibc setting; affects both loops)",
    )
    args = parser.parse_args()

    torch.manual_seed(0)
    job_seq = load_config("quickstart").model.seq_len
    tokens = torch.randint(0, args.vocab, (256, job_seq + 1))
    tokens_per_step = args.batch * job_seq
    with tempfile.TemporaryDirectory() as tmp:
        trainer, raw = build(args, tokens, Path(tmp))
        ours = lambda n: trainer.train_until(trainer.step + n)  # noqa: E731
        theirs = raw.run
        ours(3), theirs(3)  # warm-up: allocator, kernels, first optimizer state
        hp, rw = [], []
        for i in range(args.repeats):
            order = [(ours, hp), (theirs, rw)] if i % 2 == 0 else [(theirs, rw), (ours, hp)]
            for fn, out in order:
                out.append(timed(fn, args.steps, tokens_per_step))
        trainer.close()

    hp_med, rw_med = statistics.median(hp), statistics.median(rw)
    ratio = hp_med / rw_med
    print(
        f"threads={torch.get_num_threads()} batch={args.batch}x{job_seq} tokens, "
        f"{args.repeats} repeats x {args.steps} steps, interleaved"
    )
    print_rates("loop", "tok/s", {"hpcpipe": hp, "raw": rw}, decimals=0)
    print(f"ratio hpcpipe/raw = {ratio:.3f} (target >= 0.98)")
    print(
        json.dumps(
            {
                "benchmark": "trainer_overhead",
                "hpcpipe_tokens_per_s": round(hp_med, 1),
                "raw_tokens_per_s": round(rw_med, 1),
                "ratio": round(ratio, 4),
                "target": 0.98,
                "repeats": args.repeats,
                "steps": args.steps,
                "retain_host_memory": not args.no_retain_host_memory,
                **run_context(),
            }
        )
    )


if __name__ == "__main__":
    main()
