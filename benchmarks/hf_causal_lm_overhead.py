"""hpcpipe's hf-causal-lm recipe on SmolLM2-135M-Instruct vs a hand-written transformers + peft + DDP
loop, side by side in one run on gloo ranks.

Both train the same base (SmolLM2's GGUF file, de-quantised once) with the same peft LoRA config,
on the same token windows (the standard library's source, tokenized by SmolLM2's tokenizer into
hpcpipe's shards; the raw loop reads the same windows as one tensor), with the same AdamW
(``train/optim.py``), LR schedule, clipping and micro-batch per rank. The hand-written loop is
what the transformers and peft examples do under DDP: DataLoader + DistributedSampler,
``model(input_ids).logits``, cross-entropy, backward, clip, step. Timed blocks alternate on every
rank in lockstep; the ratio of the median tokens/s is the result (target >= 0.95).

    .venv/bin/python benchmarks/hf_causal_lm_overhead.py [--nproc 2] [--repeats 5] [--steps 3]

Needs ``make fc-assets`` (SmolLM2's GGUF file). ``--model tiny`` runs the same path on a random
2-layer Llama (a quick check).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ddp_harness import (
    SampledBatches,
    compare_on_rank,
    ranks_fork_from_here,
    raw_steps,
    spawn,
    timing_overrides,
)
from harness import block_parser, parse_with_smoke, report_pair
from hpcpipe.config import JobConfig, load_config
from hpcpipe.netutil import free_port
from hpcpipe.train.optim import build_optimizer

PRESETS = {"smollm2": "hf-causal-lm-smollm2", "tiny": "hf-causal-lm-tiny"}


def job_for(args: argparse.Namespace, out: Path) -> JobConfig:
    return load_config(
        PRESETS[args.model],
        [
            f"run.out_dir={out}",
            f"data.prepared_dir={args.prepared or out / 'prepared'}",
            f"data.max_bytes={args.max_bytes}",
            f"model.seq_len={args.seq_len}",
            "model.base_dtype=fp32",
            *timing_overrides(args.steps, args.batch, args.nproc),
        ],
    )


class RawLoop:
    """transformers + peft + DDP by hand, over the same windows and the same base and adapters."""

    def __init__(self, job: JobConfig, recipe: Any, ctx: Any) -> None:
        from peft import LoraConfig, get_peft_model
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import TensorDataset

        from hpcpipe.models.hf_lm import load_base_model

        base = load_base_model(recipe.source, "fp32")  # the same weights, loaded as hpcpipe does
        lora = job.lora
        config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
        )
        self.model = DistributedDataParallel(get_peft_model(base, config))
        self.optimizer = build_optimizer(self.model, job.train, ctx.device)
        windows = _windows(recipe.dataset, job.model.seq_len)  # (N, T+1)
        data = TensorDataset(windows[:, :-1], windows[:, 1:])
        self.batches = SampledBatches(
            data, job.train.micro_batch_size, ctx.rank, ctx.world_size, job.run.seed
        )
        self.job, self.step = job, 0

    def loss(self) -> torch.Tensor:
        x, y = self.batches.next()  # (B, T) each; y is x shifted by one token
        logits = self.model(input_ids=x).logits  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    def run(self, steps: int) -> None:
        self.step = raw_steps(self.model, self.optimizer, self.job, self.step, steps, self.loss)


def _windows(dataset: Any, seq_len: int) -> torch.Tensor:
    """The training split's tokens as non-overlapping windows of seq_len + 1: (N, T+1) int64."""
    import numpy as np

    tokens = np.concatenate([np.fromfile(p, dtype=dataset.dtype) for p in dataset.shard_paths("train")])
    n = (len(tokens) - 1) // seq_len
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    return torch.from_numpy(tokens[idx].astype(np.int64))


def worker(rank: int, args: argparse.Namespace, port: int, out: Path) -> None:
    job = job_for(args, out)
    compare_on_rank(rank, job, port, out, RawLoop, args.batch * args.nproc * args.seq_len, args, warmup=1)


def main() -> None:
    parser = block_parser(__doc__, repeats=5, steps=3)
    parser.add_argument("--model", choices=sorted(PRESETS), default="smollm2")
    parser.add_argument("--nproc", type=int, default=2, help="DDP ranks (gloo on CPU)")
    parser.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument(
        "--prepared",
        default="data/prepared",
        help="data.prepared_dir (the shards and the de-quantised model are kept there)",
    )
    parser.add_argument(
        "--max-bytes", type=int, default=400_000, help="source text tokenized (data.max_bytes)"
    )
    # --smoke: the random 2-layer Llama on 20 kB of text, prepared in the temporary directory
    toy = {"model": "tiny", "repeats": 1, "steps": 1, "batch": 1, "seq_len": 32}
    args = parse_with_smoke(parser, {**toy, "max_bytes": 20_000, "prepared": None})
    ranks_fork_from_here()

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        result = spawn(worker, (args, free_port(), out), args.nproc, out)
    print(
        f"{args.nproc} gloo ranks x {result['threads']} threads, hf-causal-lm {args.model} LoRA, "
        f"{args.batch}x{args.seq_len} tokens/rank/step, {args.repeats} x {args.steps} steps, interleaved"
    )
    fields = {
        "model": args.model,
        "nproc": args.nproc,
        "batch_per_rank": args.batch,
        "seq_len": args.seq_len,
        "repeats": args.repeats,
        "steps": args.steps,
    }
    report_pair("hf_causal_lm_overhead", result, ("tok/s", "tokens_per_s"), 0.95, fields)


if __name__ == "__main__":
    main()
