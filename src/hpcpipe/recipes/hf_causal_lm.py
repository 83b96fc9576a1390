"""The `hf-causal-lm` recipe: any Hugging Face ``AutoModelForCausalLM`` fine-tuned on the user's text.

- Model: ``model.name_or_path`` (a local directory, a hub id in the local cache, a GGUF file, or
  ``@tiny-llama-random`` / ``@random:<shape>``: random weights from a config, for tests),
  ``recipe.finetune: lora`` (peft adapters on ``lora.target_modules``, the base frozen in
  ``model.base_dtype``; checkpoints hold the adapters) or ``full`` (every weight trains, in fp32
  unless ``model.base_dtype`` says otherwise; ``train.precision`` chooses the autocast).
- Data: ``data.sources`` read as ``data.format`` says (``tokens``: text files, directories, JSON
  lines with ``data.text_field``; ``parquet``: its ``data.text_field`` column; ``chat``: JSON
  lines of ``data.messages_field`` rendered with the model's chat template), tokenized with the
  model's own tokenizer into hpcpipe's hashed token shards (``data/tokens/``), the tokenizer
  saved beside them; documents end with the model's EOS and are packed into ``model.seq_len``
  windows (attention spans the window, as in pretraining). The loss covers every token.
- Evaluation: ``val_loss`` and ``val_ppl`` on ``train.eval_batches`` held-out windows.
- Export: ``hf``, a directory ``AutoModelForCausalLM.from_pretrained`` loads (LoRA merged into
  the base), with the tokenizer; ``adapter`` (LoRA only), a peft adapter directory.

Like every recipe module, this one imports torch and transformers only inside its methods.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from hpcpipe.config import DataConfig, JobConfig, LoraConfig, ModelConfig, TrainConfig
from hpcpipe.config.data import TOKEN_FORMATS
from hpcpipe.errors import ConfigError, DataError, UserError
from hpcpipe.recipes.args import parse_args
from hpcpipe.recipes.base import Batch, DataSummary, ExportRequest, Goal, Recipe, TrainLoader, mean_loss_sums

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hpcpipe.models.hf_lm import ModelSource, ParamCounts


EXPORTS: tuple[str, ...] = ("hf", "adapter")  # adapter: LoRA runs only


class HFCausalLMArgs(BaseModel):
    """The ``recipe:`` section of ``hf-causal-lm``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    finetune: Literal["lora", "full"] = Field(
        "lora",
        description="lora: peft adapters on lora.target_modules, the base frozen (needs the lora "
        "extra); full: every weight trains.",
    )


@dataclass
class HFCausalLMRecipe(Recipe):
    name = "hf-causal-lm"
    summary = (
        "Any Hugging Face causal LM, full or LoRA fine-tuning on your text, JSON lines, Parquet or chats"
    )
    Args = HFCausalLMArgs
    metric_goals: ClassVar[dict[str, Goal]] = {"val_loss": "min", "val_ppl": "min"}
    model_variants = ("hf-causal-lm",)
    data_formats = TOKEN_FORMATS
    needs_model_source = True
    export_formats = EXPORTS
    worker_imports = ("hpcpipe.data.tokens.loader", "hpcpipe.models.hf_lm", "transformers", "peft")
    sample_noun = "sequences"
    check_preset = "hf-causal-lm-tiny"

    model_cfg: ModelConfig
    data_cfg: DataConfig
    train_cfg: TrainConfig
    lora_cfg: LoraConfig
    args: HFCausalLMArgs
    seed: int
    throughput_unit: str = "tokens"
    broadcasts_buffers: bool = False  # rotary tables only: identical on every rank
    counts: ParamCounts | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        lora = self.args.finetune == "lora"
        self.checkpoint_trainable_only = lora  # the frozen base is rebuilt from its source
        self.export_formats = EXPORTS if lora else ("hf",)  # what this job exports

    @classmethod
    def from_job(cls, job: JobConfig) -> HFCausalLMRecipe:
        args = parse_args(cls.Args, job.recipe)
        return cls(job.model, job.data, job.train, job.lora, args, job.run.seed)

    @classmethod
    def describe_model(cls, job: JobConfig) -> str:
        how = "full" if job.recipe.get("finetune") == "full" else f"LoRA r{job.lora.r}"
        return f"{job.model.name_or_path} ({how}) on {job.data.format} data"

    @property
    def items_per_sample(self) -> int:
        return self.model_cfg.seq_len

    @property
    def fsdp_param_dtype(self) -> torch.dtype | None:
        """A bf16 frozen base gathers its fp32 adapters in bf16 too (one dtype per FSDP2 unit)."""
        import torch

        from hpcpipe.models.hf_lm import resolve_base_dtype

        lora_bf16 = self.args.finetune == "lora" and resolve_base_dtype(self.model_cfg.base_dtype) == "bf16"
        return torch.bfloat16 if lora_bf16 else None

    # -- model source and tokenizer ------------------------------------------------------------

    @cached_property
    def source(self) -> ModelSource:
        from hpcpipe.models.hf_lm import resolve_source

        return resolve_source(self.model_cfg, self.data_cfg.prepared_dir)

    @cached_property
    def tokenizer(self) -> Any:  # a transformers tokenizer
        from hpcpipe.models.hf_lm import load_tokenizer

        return load_tokenizer(self.source)

    def _render(self, messages: list[dict[str, Any]]) -> str:
        """A conversation as the model reads it (its chat template, no generation prompt)."""
        if not self.tokenizer.chat_template:
            raise DataError(f"{self.source.path}: the tokenizer has no chat template (data.format chat)")
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False))

    # -- data --------------------------------------------------------------------------------

    def _prepared(self, progress: bool, quick: bool = False) -> Any:  # PreparedDataset
        """The user's text tokenized into shards by the model's tokenizer (reused when prepared;
        ``quick``: found by file metadata where the node's preparer recorded it)."""
        from hpcpipe.data.tokens.resolved import prepared
        from hpcpipe.data.tokens.tokenizer import PretrainedTokenizer
        from hpcpipe.models.hf_lm import tokenizer_identity

        tok = self.tokenizer
        if not hasattr(tok, "backend_tokenizer") or tok.eos_token_id is None:
            raise ConfigError(
                f"model.name_or_path: {self.source.path} needs a fast tokenizer with an EOS token"
            )
        name = f"{Path(self.source.path).name}-{len(tok)}"
        pretrained = PretrainedTokenizer(tok.backend_tokenizer, int(tok.eos_token_id), name)
        return prepared(self.data_cfg, progress, pretrained, tokenizer_identity(tok), self._render, quick)

    def prepare(self, progress: bool) -> DataSummary:
        from hpcpipe.data.stage import staged_tokens
        from hpcpipe.data.tokens.summary import dataset_summary
        from hpcpipe.models.hf_lm import check_source

        if self.args.finetune == "lora":
            check_source(self.source, self.lora_cfg)  # target modules exist, before any worker starts
        dataset = self._prepared(progress)
        self.__dict__["dataset"] = staged_tokens(dataset, self.data_cfg.cache_dir, "full")
        return dataset_summary(dataset)

    @cached_property
    def dataset(self):  # type: ignore[no-untyped-def]  # PreparedDataset
        from hpcpipe.data.stage import staged_tokens

        return staged_tokens(self._prepared(False, quick=True), self.data_cfg.cache_dir, "sizes")

    def stage_source(self, progress: bool = False) -> Any:
        from hpcpipe.data.stage import token_dataset_source

        return token_dataset_source(self._prepared(progress).path)

    def dataset_hash(self) -> str | None:
        return str(self.dataset.manifest_sha256)

    def train_loader(self, rank: int, world_size: int) -> TrainLoader:
        from hpcpipe.data.tokens.loader import TokenWindowLoader

        cfg = self.train_cfg
        sizes = {"micro_batch_size": cfg.micro_batch_size, "global_batch_size": cfg.global_batch_size}
        return TokenWindowLoader(
            self.dataset,
            "train",
            self.model_cfg.seq_len,
            **sizes,
            rank=rank,
            world_size=world_size,
            seed=self.seed,
        )

    def eval_batches(self, rank: int, world_size: int) -> Iterable[Batch]:
        from hpcpipe.data.tokens.loader import EvalWindows

        cfg = self.train_cfg
        return EvalWindows(
            self.dataset,
            split="val",
            seq_len=self.model_cfg.seq_len,
            micro_batch_size=cfg.micro_batch_size,
            n_batches=cfg.eval_batches,
            rank=rank,
            world_size=world_size,
        )

    # -- model -------------------------------------------------------------------------------

    def build_model(self) -> nn.Module:
        from hpcpipe.models.hf_lm import (
            apply_lora,
            enable_gradient_checkpointing,
            load_base_model,
            param_counts,
        )

        dtype = self.model_cfg.base_dtype if self.args.finetune == "lora" else self._full_dtype()
        model = load_base_model(self.source, dtype)
        if self.args.finetune == "lora":
            for param in model.parameters():
                param.requires_grad_(False)
            model = apply_lora(model, self.lora_cfg)
        if self.model_cfg.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.counts = param_counts(model)
        return model

    def _full_dtype(self) -> str:
        """Full fine-tuning trains the weights themselves: fp32 unless model.base_dtype is bf16."""
        return "bf16" if self.model_cfg.base_dtype == "bf16" else "fp32"

    def shard_units(self, model: nn.Module) -> Sequence[nn.Module]:
        from hpcpipe.models.hf_lm import decoder_layers

        return decoder_layers(model)

    def tensor_parallel_plan(self, model: nn.Module, tp: int) -> dict[str, Any]:
        """Llama-family models (q/k/v/o_proj, gate/up/down_proj), full fine-tuning only."""
        from hpcpipe.models.hf_parallel import llama_family_plan

        return llama_family_plan(model, list(self.shard_units(model)), tp)

    @classmethod
    def check_job(cls, job: JobConfig) -> None:
        super().check_job(job)
        if job.parallel.tp > 1 and job.recipe.get("finetune", "lora") == "lora":
            raise ConfigError(
                f"parallel.tp={job.parallel.tp}: tensor parallelism splits the base weights, which LoRA "
                "keeps frozen and whole; use recipe.finetune=full, or parallel.tp=1 with LoRA"
            )

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        import torch.nn.functional as F

        x, y = batch  # (B, T) int64 each; y is x shifted left by one token
        logits = model(input_ids=x).logits  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        return mean_loss_sums(self.loss(model, batch), batch)

    def eval_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        val_loss = totals["loss"] / max(totals["count"], 1.0)
        return {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 50.0))}

    def flops_per_sample(self) -> float | None:
        """The model's training FLOPs per token (``ParamCounts.training_flops_per_token``) x seq_len."""
        if self.counts is None:
            return None
        per_token = self.counts.training_flops_per_token()
        return per_token * self.model_cfg.seq_len

    # -- artifacts ---------------------------------------------------------------------------

    def export(self, request: ExportRequest) -> Path:
        """``hf``: a transformers model directory (LoRA merged in) with the tokenizer, in
        ``request.dtype``; ``adapter``: the peft adapter (LoRA runs only)."""
        from hpcpipe.checkpoint.export import load_weights
        from hpcpipe.models.hf_lm import apply_lora, load_base_model
        from hpcpipe.models.lora_export import save_model_dir, write_lora_export

        lora = self.args.finetune == "lora"
        if request.fmt == "adapter" and not lora:
            raise UserError("--format adapter: this run trained every weight (recipe.finetune=full); use hf")
        model = load_base_model(self.source, "fp32")
        if lora:
            model = apply_lora(model, self.lora_cfg)
        load_weights(request.checkpoint, model, trainable_only=lora)
        if lora:
            return write_lora_export(model, request.fmt, request.out, request.dtype, self.tokenizer)
        return save_model_dir(model, request.out, request.dtype, self.tokenizer)

    def load_export(self, fmt: str, path: Path) -> Any:
        if fmt == "adapter":
            from hpcpipe.models.lora_export import load_with_adapter

            return load_with_adapter(self.source, path)
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path)
