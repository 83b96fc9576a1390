"""The `gpt` recipe: decoder-only LM pretraining of hpcpipe's own GPT on prepared token shards.

Its module imports nothing heavy: the config reads the recipe's declaration without torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from hpcpipe.config import DataConfig, JobConfig, ModelConfig, TrainConfig
from hpcpipe.errors import ConfigError
from hpcpipe.layout import RunLayout
from hpcpipe.recipes.args import parse_args
from hpcpipe.recipes.base import Batch, DataSummary, ExportRequest, Goal, Recipe, TrainLoader, mean_loss_sums

if TYPE_CHECKING:
    import torch
    from torch import nn

SAMPLE_PROMPT = "def "
SAMPLE_TOKENS = 200  # at most: a sample is no longer than the model's context (model.seq_len)


class GPTArgs(BaseModel):
    """The ``recipe:`` section of ``gpt``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sample_tokens: int = Field(
        SAMPLE_TOKENS,
        ge=0,
        description="New tokens of the text sample written at the end of training (sample.txt), at "
        "most model.seq_len; 0: no sample. Each token is a full forward of the model (with "
        "collectives when it is split across ranks).",
    )


@dataclass
class GPTRecipe(Recipe):
    name = "gpt"
    summary = "LM pretraining of hpcpipe's own GPT/Llama-style model on token shards"
    Args = GPTArgs
    metric_goals: ClassVar[dict[str, Goal]] = {"val_loss": "min", "val_ppl": "min"}
    model_variants = ("gpt2", "llama")
    data_formats = ("tokens", "parquet")  # chat needs a model's chat template: hf-causal-lm
    export_formats = ("hf", "safetensors")
    worker_imports = ("hpcpipe.data.tokens.loader", "hpcpipe.models.gpt")
    own_transformer = True
    sample_noun = "sequences"
    check_preset = "tiny"

    model_cfg: ModelConfig
    data_cfg: DataConfig
    train_cfg: TrainConfig
    seed: int
    args: GPTArgs = field(default_factory=GPTArgs)
    throughput_unit: str = "tokens"
    broadcasts_buffers: bool = False  # RoPE tables are identical on every rank by construction

    @classmethod
    def from_job(cls, job: JobConfig) -> GPTRecipe:
        args = parse_args(cls.Args, job.recipe)
        return cls(model_cfg=job.model, data_cfg=job.data, train_cfg=job.train, seed=job.run.seed, args=args)

    @classmethod
    def check_job(cls, job: JobConfig) -> None:
        super().check_job(job)
        p = job.parallel
        if p.tp > 1:
            from hpcpipe.models.gpt_parallel import check_tensor_parallel

            check_tensor_parallel(job.model, p.tp)
        stages = p.pp * p.virtual_stages
        if stages > job.model.n_layers or (p.pp_split and p.pp_split[-1] >= job.model.n_layers):
            raise ConfigError(
                f"parallel.pp x virtual_stages = {stages} stages (split {p.pp_split}) for model.n_layers="
                f"{job.model.n_layers}: every stage needs at least one block"
            )

    @classmethod
    def describe_model(cls, job: JobConfig) -> str:
        m = job.model
        shape = f"{m.n_layers} layers, {m.n_heads} heads, width {m.d_model}, context {m.seq_len}"
        return f"{m.variant}, {shape}"

    @classmethod
    def scaling_law_size(cls, job: JobConfig, steps: int) -> tuple[float, float] | None:
        """Kaplan's N, counted on the model itself built on the meta device (the head is tied to
        the token embedding: the vocabulary does not change it), and D = steps x global batch x
        sequence length."""
        import torch

        from hpcpipe.models.gpt import GPT

        with torch.device("meta"):
            net = GPT(job.model, vocab_size=job.model.vocab_size or 2)
        tokens = steps * job.train.global_batch_size * job.model.seq_len
        return float(net.num_params(non_embedding=True)), float(tokens)

    @property
    def items_per_sample(self) -> int:
        return self.model_cfg.seq_len

    # -- data --------------------------------------------------------------------------------

    def prepare(self, progress: bool) -> DataSummary:
        from hpcpipe.data.tokens.resolved import prepared
        from hpcpipe.data.tokens.summary import dataset_summary

        # Fill the cached property: the dataset is hashed once, not again on first use. The
        # node's preparer verifies every hash (corpus, shards, staged copy); the other ranks
        # then find its answer by file metadata and check sizes only (data/tokens/resolved.py).
        dataset = prepared(self.data_cfg, progress=progress)
        self.__dict__["dataset"] = self._staged(dataset, verify="full")
        _ = self.vocab_size  # model.vocab_size vs the tokenizer: fail before any worker starts
        return dataset_summary(dataset)

    def stage_source(self, progress: bool = False) -> Any:
        from hpcpipe.data.stage import token_dataset_source
        from hpcpipe.data.tokens.resolved import prepared

        return token_dataset_source(prepared(self.data_cfg, progress=progress).path)

    @cached_property
    def dataset(self):  # type: ignore[no-untyped-def]  # PreparedDataset
        from hpcpipe.data.tokens.resolved import prepared

        return self._staged(prepared(self.data_cfg, quick=True), verify="sizes")

    def _staged(self, dataset, verify: Literal["full", "sizes"]):  # type: ignore[no-untyped-def]
        """The dataset itself, or its node-local copy when ``data.cache_dir`` is set."""
        from hpcpipe.data.stage import staged_tokens

        return staged_tokens(dataset, self.data_cfg.cache_dir, verify)

    def dataset_hash(self) -> str | None:
        return str(self.dataset.manifest_sha256)

    @cached_property
    def vocab_size(self) -> int:
        tokenizer_vocab = int(self.dataset.vocab_size)
        wanted = self.model_cfg.vocab_size
        if wanted is None:
            return tokenizer_vocab
        if wanted < tokenizer_vocab:
            raise ConfigError(
                f"model.vocab_size ({wanted}) is smaller than the tokenizer's vocabulary "
                f"({tokenizer_vocab}); set it to null or >= {tokenizer_vocab}"
            )
        return wanted

    def train_loader(self, rank: int, world_size: int) -> TrainLoader:
        from hpcpipe.data.tokens.loader import TokenWindowLoader

        return TokenWindowLoader(
            self.dataset,
            split="train",
            seq_len=self.model_cfg.seq_len,
            micro_batch_size=self.train_cfg.micro_batch_size,
            global_batch_size=self.train_cfg.global_batch_size,
            rank=rank,
            world_size=world_size,
            seed=self.seed,
        )

    def samples_per_epoch(self) -> int | None:
        return None  # windows are re-drawn from an endless shuffled stream; count in steps

    def eval_batches(self, rank: int, world_size: int) -> Iterable[Batch]:
        from hpcpipe.data.tokens.loader import EvalWindows

        return EvalWindows(
            self.dataset,
            split="val",
            seq_len=self.model_cfg.seq_len,
            micro_batch_size=self.train_cfg.micro_batch_size,
            n_batches=self.train_cfg.eval_batches,
            rank=rank,
            world_size=world_size,
        )

    # -- model -------------------------------------------------------------------------------

    def build_model(self) -> nn.Module:
        from hpcpipe.models.gpt import GPT, check_fits_in_host_memory

        # Every rank builds the whole model before tensor/pipeline parallelism and FSDP2 shard it:
        # a model larger than the host's memory is refused here, not killed by the OOM killer.
        check_fits_in_host_memory(self.model_cfg, self.vocab_size)
        return GPT(self.model_cfg, self.vocab_size)

    def shard_units(self, model: nn.Module) -> Sequence[nn.Module]:
        return list(model.blocks)  # type: ignore[arg-type]

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch  # (B, T) int64 each; y is x shifted left by one token
        return self.pipeline_loss(model(x), y)  # logits (B, T, V)

    def tensor_parallel_plan(self, model: nn.Module, tp: int) -> dict[str, Any]:
        from hpcpipe.models.gpt_parallel import gpt_tensor_parallel_plan

        model.sequence_multiple = tp  # type: ignore[assignment]  # generation pads its contexts for the sequence-parallel split
        return gpt_tensor_parallel_plan(self.model_cfg, tp)

    def pipeline_stage(self, model: nn.Module, blocks: Sequence[int], first: bool, last: bool) -> nn.Module:
        from hpcpipe.models.gpt_stage import GPTStage

        return GPTStage(model, blocks, first, last)  # type: ignore[arg-type]

    def pipeline_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        return F.cross_entropy(output.flatten(0, 1).float(), target.flatten())  # (B*T, V) vs (B*T,)

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        return mean_loss_sums(self.loss(model, batch), batch)

    def eval_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        val_loss = totals["loss"] / totals["count"]
        return {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 50.0))}

    def flops_per_sample(self) -> float | None:
        from hpcpipe.models.gpt_flops import training_flops_per_token

        return training_flops_per_token(self.model_cfg, self.vocab_size) * self.model_cfg.seq_len

    # -- artifacts ---------------------------------------------------------------------------

    def on_train_end(self, model: nn.Module, is_main: bool, run_dir: Path) -> None:
        """Write a text sample; every rank generates (FSDP2 needs all ranks in each forward).

        ``recipe.sample_tokens`` new tokens (200 by default), or ``model.seq_len`` when that is
        shorter: past its context the model would see a sliding window it never trained on, and
        each token is one full forward (no KV cache), with collectives when the model is split
        across ranks."""
        import torch

        from hpcpipe.data.tokens.shards import load_tokenizer
        from hpcpipe.models.gpt import NotFinite

        if self.args.sample_tokens == 0:
            return
        if not hasattr(model, "generate"):
            return  # a pipeline stage (parallel.pp > 1) holds part of the model: no sample
        tokenizer = load_tokenizer(self.dataset.path)
        device = next(model.parameters()).device
        prompt = torch.tensor([tokenizer.encode(SAMPLE_PROMPT)], dtype=torch.long, device=device)
        generator = torch.Generator(device=device).manual_seed(self.seed)
        model.eval()
        tokens = min(self.args.sample_tokens, self.model_cfg.seq_len)
        try:
            out = model.generate(  # type: ignore[operator]
                prompt, max_new_tokens=tokens, temperature=0.8, top_k=50, generator=generator
            )
            text = tokenizer.decode(out[0].tolist())
        except NotFinite:  # the same on every rank: the loss diverged (metrics.jsonl shows where)
            text = "(no sample: the trained model's outputs are not finite; the loss diverged)"
        model.train()
        if is_main:
            RunLayout(run_dir).sample.write_text(text + "\n")

    def export(self, request: ExportRequest) -> Path:
        from hpcpipe.models.gpt_export import export_gpt

        r = request  # the run's tokenizer (data.prepared_dir) goes into an hf export
        return export_gpt(
            r.checkpoint, r.fmt, r.out, self.model_cfg, self.data_cfg.prepared_dir, r.run_dir, r.torch_dtype()
        )

    def load_export(self, fmt: str, path: Path) -> Any:
        if fmt == "hf":
            from transformers import AutoModelForCausalLM

            return AutoModelForCausalLM.from_pretrained(path)
        from safetensors import safe_open
        from safetensors.torch import load_model

        from hpcpipe.models.gpt import GPT

        file = str(path / "model.safetensors")
        with safe_open(file, "pt") as f:
            vocab_size = int(f.metadata()["hpcpipe.vocab_size"])
        model = GPT(self.model_cfg, vocab_size)
        load_model(model, file)
        return model
