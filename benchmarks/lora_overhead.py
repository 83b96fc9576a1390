"""hpcpipe's LoRA function-calling training vs a hand-written transformers + peft loop, in one run.

Both train the same base model with the same peft LoRA config, on the same packed rows of the
same conversations (block-diagonal mask, restarted positions), with the same batch, AdamW, LR
schedule and gradient clipping, in one process. The hand-written loop is what the peft examples
do: ``model(input_ids, attention_mask, position_ids, labels=labels).loss``, backward, clip, step.
hpcpipe computes logits only where a supervised token is predicted; the raw loop computes them
everywhere, as transformers does when given ``labels``. Timed blocks alternate (hpcpipe, raw, raw,
hpcpipe, ...) and the ratio of the median tokens/s is the result (target >= 0.95).

    .venv/bin/python benchmarks/lora_overhead.py [--model smollm2|tiny|qwen2-7b-shape] [--repeats 5]

``--model smollm2`` needs ``make fc-assets`` (SmolLM2-135M-Instruct from its GGUF file).
``--model qwen2-7b-shape`` (a GPU machine) uses random weights of Qwen2-7B's shape
(``@random:qwen2-7b``) with the seed's settings: bf16 base and autocast, LoRA r=64 / alpha=128,
gradient checkpointing; try ``--batch 2 --seq-len 4096``. Both loops run on the same device
(CUDA when present) and the figure is tokens/s per GPU. ``qwen2-tiny-shape`` is the same path at
test size, for a CPU check.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from harness import block_parser, compare_loops, parse_with_smoke, report_pair, trainer_loop
from hpcpipe.config import JobConfig, load_config
from hpcpipe.recipes import build_recipe
from hpcpipe.recipes.lora_fc_loss import packed_attention
from hpcpipe.train.distributed import init_distributed
from hpcpipe.train.environment import DistEnv
from hpcpipe.train.schedule import lr_at
from hpcpipe.train.trainer import Trainer

MODELS = {
    "tiny": ["model.name_or_path=@tiny-llama-random"],  # throughput: weights do not matter
    "qwen2-7b-shape": [
        "model.name_or_path=@random:qwen2-7b",
        "model.base_dtype=bf16",
        "model.gradient_checkpointing=true",
        "train.precision=bf16",
        "lora.r=64",
        "lora.alpha=128",
        "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
    ],
    "qwen2-tiny-shape": [
        "model.name_or_path=@random:qwen2-tiny",
        "model.base_dtype=bf16",
        "model.gradient_checkpointing=true",
        "train.precision=bf16",
        "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
    ],
    "smollm2": [
        "model.name_or_path=data/external/smollm2",
        "model.gguf_file=SmolLM2-135M-Instruct.Q4_1.gguf",
        "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
    ],
}


def job_for(args: argparse.Namespace, out: Path) -> JobConfig:
    return load_config(
        "lora-fc-tiny",
        [
            *MODELS[args.model],
            f"model.seq_len={args.seq_len}",
            f"data.synthetic_rows={args.rows}",
            f"data.prepared_dir={out}/prepared",
            "lora.dropout=0.0",
            f"train.steps={10**6}",
            f"train.micro_batch_size={args.batch}",
            f"train.global_batch_size={args.batch}",
            "train.eval_every=0",
            "observe.progress=false",
            f"observe.log_every={10**6}",
            f"run.out_dir={out}",
        ],
    )


class RawLoop:
    """transformers + peft by hand: the model computes its own loss from ``labels``."""

    def __init__(self, job: JobConfig, recipe: Any, device: torch.device) -> None:
        torch.manual_seed(job.run.seed)
        self.device = device
        self.model = recipe.build_model().to(device)
        self.bf16 = job.train.precision == "bf16"
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=job.train.lr, betas=(job.train.beta1, job.train.beta2), weight_decay=0.0
        )
        self.rows, self.job, self.step = recipe.rows["train"], job, 0
        self.batch = job.train.micro_batch_size

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step += 1
            for group in self.optimizer.param_groups:
                group["lr"] = lr_at(self.step, self.job.train)
            at = (self.step * self.batch) % max(len(self.rows) - self.batch, 1)
            ids, labels, docs = (
                torch.from_numpy(rows[at : at + self.batch].astype("int64")).to(self.device)
                for rows in (self.rows.input_ids, self.rows.labels, self.rows.doc_ids)
            )
            mask, positions = packed_attention(docs)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, labels=labels)
            loss = out.loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.job.train.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


def trainer_for(job: JobConfig, out: Path) -> Trainer:
    env = DistEnv("local", 0, 0, 1, 1, "127.0.0.1", 0)
    ctx = init_distributed(job.parallel, env)
    recipe = build_recipe(job)
    recipe.prepare(progress=False)
    (out / "hpcpipe").mkdir(parents=True, exist_ok=True)
    return Trainer(job, recipe, ctx, out / "hpcpipe")


def main() -> None:
    parser = block_parser(__doc__, repeats=5, steps=3)
    parser.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=2, help="packed rows per step")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--rows", type=int, default=600, help="generated conversations (data.synthetic_rows)")
    toy = {"model": "tiny", "repeats": 1, "steps": 1, "batch": 1, "seq_len": 128, "rows": 40}
    args = parse_with_smoke(parser, toy)

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        job = job_for(args, out)
        trainer = trainer_for(job, out)
        raw = RawLoop(job, trainer.recipe, trainer.ctx.device)
        loops = {"hpcpipe": trainer_loop(trainer), "raw": raw.run}
        runs = compare_loops(loops, args.repeats, args.steps, args.batch * args.seq_len, warmup=1)
        trainer.close()

    print(
        f"model {args.model}, {args.batch} x {args.seq_len} tokens/step, "
        f"{args.repeats} repeats x {args.steps} steps"
    )
    fields = {
        "model": args.model,
        "unit": "tokens/s per device",
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "batch": args.batch,
        "seq_len": args.seq_len,
        "repeats": args.repeats,
        "steps": args.steps,
    }
    report_pair("lora_overhead", runs, ("tok/s", "tokens_per_s"), 0.95, fields)


if __name__ == "__main__":
    main()
