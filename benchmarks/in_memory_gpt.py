"""The GPT that the throughput benchmarks train: hpcpipe's GPT recipe on a token tensor in memory
(no files, no tokenizer), so a timed block measures training and nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpcpipe.config import JobConfig, load_config
from hpcpipe.recipes.gpt import GPTRecipe
from hpcpipe.train.trainer import Trainer


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


def random_tokens(vocab: int, seq_len: int, rows: int = 256) -> torch.Tensor:
    """(rows, seq_len + 1) tokens drawn with seed 0: every arm and every rank trains on the same."""
    torch.manual_seed(0)
    return torch.randint(0, vocab, (rows, seq_len + 1))


def quickstart_job(out: Path, nproc: int, batch: int, vocab: int, extra: list[str]) -> JobConfig:
    """The quickstart's GPT as a job that only trains while timed (no end, no evaluation), with
    ``batch`` sequences per rank on ``nproc`` ranks, writing under ``out``; ``extra`` overrides."""
    return load_config(
        "quickstart",
        [
            f"train.steps={10**6}",
            "train.eval_every=0",
            f"parallel.nproc={nproc}",
            "observe.progress=false",
            f"train.micro_batch_size={batch}",
            f"train.global_batch_size={batch * nproc}",
            f"model.vocab_size={vocab}",
            f"run.out_dir={out}",
            "checkpoint.every_steps=0",  # the preset saves every 100 steps: inside one timed block only
            *extra,
        ],
    )


def in_memory_trainer(job: JobConfig, tokens: torch.Tensor, vocab: int, ctx: Any, run_dir: Path) -> Trainer:
    """hpcpipe's Trainer for ``job`` on ``tokens`` (a ``vocab``-token vocabulary), in ``run_dir``."""
    recipe = InMemoryGPTRecipe.from_job(job)
    recipe.tokens, recipe.fixed_vocab = tokens, vocab
    run_dir.mkdir(parents=True, exist_ok=True)
    return Trainer(job, recipe, ctx, run_dir)
