"""The `lora-function-calling` recipe: LoRA fine-tuning of a Hugging Face causal LM on tool calls.

- Model: ``AutoModelForCausalLM`` from a directory, the local hub cache or a GGUF file
  (``hpcpipe.models.hf_lm``), frozen, with peft LoRA adapters on ``lora.target_modules``; LoRA is
  applied here, before the trainer wraps the model in DDP or FSDP2 (decoder layers are the units).
- Data: conversations in Glaive v2, OpenAI or Hermes form (or ``@synthetic``), rendered with the
  model's chat template, loss on assistant turns only, packed with per-conversation boundaries
  (``hpcpipe.data.function_calling.prepare``). Batches are ``(input_ids, labels, doc_ids)`` (B, T);
  attention runs on each conversation's span of a row alone (``hpcpipe.models.packed_attention``).
- Loss: logits are computed only at positions whose next token is supervised (``logits_to_keep``):
  with a 150k vocabulary, full (B, T, V) logits would dominate memory.
- Throughput: all tokens per step (``tokens_per_s``) and, separately, the real (non-padding) and
  supervised tokens (``real_tokens_per_s_per_device``, ``supervised_tokens_per_s_per_device``).
- FLOPs per token for MFU: 4N for the frozen base (forward 2N + input gradients 2N, no weight
  gradients), 6N for the adapters, N over matmul weights (an untied input embedding is a lookup);
  gradient checkpointing's recomputation is not credited (model FLOPs, as PaLM counts them).
  Attention score FLOPs are left out.
- Checkpoints hold the adapters and their optimizer state only (the base is rebuilt from its
  source); ``on_train_end`` gathers the adapter's full tensors on every rank; ``on_run_end`` (the
  main rank alone, past the group's last barrier) exports it (peft format), calibrates the call
  threshold and writes ``lora_summary.json``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from hpcpipe.config import DataConfig, JobConfig, LoraConfig, ModelConfig, TrainConfig
from hpcpipe.config.data import FUNCTION_CALLING_FORMATS
from hpcpipe.layout import RunLayout
from hpcpipe.recipes.base import Batch, DataSummary, ExportRequest, Goal, Recipe, TrainLoader

if TYPE_CHECKING:
    import torch
    from torch import nn

    from hpcpipe.models.hf_lm import ModelSource, ParamCounts

ADAPTER_DIR = f"{RunLayout.EXPORT}/{RunLayout.ADAPTER}"  # relative to the run directory
# How long the end of training waits for a register uploading the earlier adapter (an upload of
# a few hundred MB takes seconds to minutes); a reader still there after it fails the run.
ADAPTER_WAIT_S = 300.0


@dataclass
class LoraFCRecipe(Recipe):
    name = "lora-function-calling"
    summary = "LoRA fine-tuning of a Hugging Face causal LM on function-calling conversations"
    metric_goals: ClassVar[dict[str, Goal]] = {"val_loss": "min", "val_token_acc": "max"}
    model_variants = ("hf-causal-lm",)
    data_formats = FUNCTION_CALLING_FORMATS
    needs_model_source = True
    export_formats = ("adapter", "merged")
    evaluations = ("function-calling",)
    worker_imports = (
        "hpcpipe.data.function_calling.loader",
        "hpcpipe.recipes.lora_fc_loss",
        "transformers",
        "peft",
    )
    sample_noun = "sequences"
    check_preset = "lora-fc-tiny"

    model_cfg: ModelConfig
    lora_cfg: LoraConfig
    data_cfg: DataConfig
    train_cfg: TrainConfig
    seed: int
    throughput_unit: str = "tokens"
    broadcasts_buffers: bool = False  # rotary tables only: identical on every rank
    checkpoint_trainable_only: bool = True
    counts: ParamCounts | None = None
    _interval: dict[str, torch.Tensor] = field(default_factory=dict)
    _gathered: tuple[nn.Module, dict[str, torch.Tensor]] | None = None  # the main rank's adapter, to write

    @classmethod
    def from_job(cls, job: JobConfig) -> LoraFCRecipe:
        return cls(job.model, job.lora, job.data, job.train, job.run.seed)

    @classmethod
    def check_overrides(cls, work: Path) -> dict[str, Any]:
        """The tiny Llama with random weights on a few generated conversations."""
        return {
            "model.name_or_path": "@tiny-llama-random",
            "model.seq_len": 256,
            "data.synthetic_rows": 48,
            "train.micro_batch_size": 2,
            "train.global_batch_size": 4,
            "train.eval_batches": 2,
            "data.prepared_dir": str(work / "prepared"),
        }

    @classmethod
    def describe_model(cls, job: JobConfig) -> str:
        return f"LoRA r{job.lora.r} on {job.model.name_or_path}"

    @property
    def items_per_sample(self) -> int:
        return self.model_cfg.seq_len

    @property
    def fsdp_param_dtype(self) -> torch.dtype | None:
        """FSDP2 gathers a unit's parameters in one dtype: with a bf16 base the fp32 adapters are
        gathered in bf16 too (their fp32 shards stay the optimizer's master copy)."""
        import torch

        from hpcpipe.models.hf_lm import resolve_base_dtype

        return torch.bfloat16 if resolve_base_dtype(self.model_cfg.base_dtype) == "bf16" else None

    # -- model source and tokenizer ------------------------------------------------------------

    @cached_property
    def source(self) -> ModelSource:
        from hpcpipe.models.hf_lm import resolve_source

        return resolve_source(self.model_cfg, self.data_cfg.prepared_dir)

    @cached_property
    def chat(self):  # type: ignore[no-untyped-def]  # ChatFormat
        from hpcpipe.data.function_calling.tokens import ChatFormat
        from hpcpipe.models.hf_lm import load_tokenizer

        return ChatFormat(load_tokenizer(self.source))

    def _tokenizer_key(self) -> str:
        from hpcpipe.models.hf_lm import tokenizer_identity

        return tokenizer_identity(self.chat.tokenizer)

    # -- data --------------------------------------------------------------------------------

    @cached_property
    def data_dir(self) -> Path:
        from hpcpipe.data.function_calling.prepare import fingerprint, prepared_path

        key = fingerprint(self.data_cfg, self.model_cfg.seq_len, self._tokenizer_key(), self.seed)
        return prepared_path(self.data_cfg.prepared_dir, key)

    def prepare(self, progress: bool) -> DataSummary:
        from hpcpipe.data.function_calling.prepare import (
            REPORT_FILE,
            prepare,
            prepared_summary,
            read_split,
            verify_prepared,
        )
        from hpcpipe.models.hf_lm import check_source

        check_source(self.source, self.lora_cfg)
        reused = (self.data_dir / REPORT_FILE).is_file()
        if reused:
            verify_prepared(self.data_dir, older_ok=True)  # a damaged file is named before training
        else:
            data = read_split(self.data_cfg, self.seed)
            prepare(self.data_cfg, data, self.chat, self.model_cfg.seq_len, self.data_dir)
        return prepared_summary(self.data_dir, reused, self.dataset_hash() or "")

    @cached_property
    def rows(self) -> dict[str, Any]:
        from hpcpipe.data.function_calling.pack import Packed

        return {split: Packed.load(self.data_dir / f"{split}.npz") for split in ("train", "eval")}

    def dataset_hash(self) -> str | None:
        return self.data_dir.name.removeprefix("fc-")

    def samples_per_epoch(self) -> int | None:
        return len(self.rows["train"])

    def train_loader(self, rank: int, world_size: int) -> TrainLoader:
        from hpcpipe.data.function_calling.loader import PackedTrainLoader

        cfg = self.train_cfg
        return PackedTrainLoader(
            self.rows["train"], cfg.micro_batch_size, cfg.global_batch_size, rank, world_size, self.seed
        )

    def eval_batches(self, rank: int, world_size: int) -> Iterable[Batch]:
        from hpcpipe.data.function_calling.loader import PackedEvalBatches

        cfg = self.train_cfg
        return PackedEvalBatches(self.rows["eval"], cfg.micro_batch_size, rank, world_size, cfg.eval_batches)

    # -- model -------------------------------------------------------------------------------

    def build_model(self) -> nn.Module:
        from hpcpipe.models.hf_lm import (
            apply_lora,
            enable_gradient_checkpointing,
            load_base_model,
            param_counts,
        )
        from hpcpipe.models.packed_attention import use_packed_attention

        base = load_base_model(self.source, self.model_cfg.base_dtype)
        use_packed_attention(base)  # _logits passes each row's conversation spans
        for param in base.parameters():
            param.requires_grad_(False)
        model = apply_lora(base, self.lora_cfg)
        if self.model_cfg.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.counts = param_counts(model)
        return model

    def shard_units(self, model: nn.Module) -> Sequence[nn.Module]:
        from hpcpipe.models.hf_lm import decoder_layers

        return decoder_layers(model)

    @cached_property
    def call_open(self) -> list[int]:
        """The token ids of "<tool_call>", which opens every call an assistant turn writes."""
        from hpcpipe.data.function_calling.tokens import CALL_OPEN

        return list(self.chat.tokenizer(CALL_OPEN, add_special_tokens=False)["input_ids"])

    def _logits(
        self, model: nn.Module, batch: Batch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits (B, K, V) at the K positions that predict a supervised token, their targets, and
        which of those open an assistant turn / a turn without a call (B, K each)."""
        from hpcpipe.recipes.lora_fc_loss import supervised_logits

        pad_id = int(self.chat.tokenizer.pad_token_id)
        return supervised_logits(model, batch, self.call_open, self.lora_cfg.frozen_context, pad_id)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        from hpcpipe.data.function_calling.tokens import IGNORE
        from hpcpipe.recipes.lora_fc_loss import supervised_loss

        logits, targets, opens, text_opens = self._logits(model, batch)
        supervised = (targets != IGNORE).sum()
        self._count("real_tokens", (batch[2] >= 0).sum())
        self._count("supervised_tokens", supervised)
        cfg = self.lora_cfg
        return supervised_loss(logits, targets, opens, cfg.decision_weight, text_opens, cfg.no_call_weight)

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        import torch.nn.functional as F

        from hpcpipe.data.function_calling.tokens import IGNORE

        logits, targets, _, _ = self._logits(model, batch)
        valid = targets != IGNORE
        flat = logits.flatten(0, 1).float()
        return {
            "loss": F.cross_entropy(flat, targets.flatten(), ignore_index=IGNORE, reduction="sum"),
            "correct": ((logits.argmax(dim=-1) == targets) & valid).sum(),
            "count": valid.sum(),
        }

    def eval_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        count = max(totals["count"], 1.0)
        return {"val_loss": totals["loss"] / count, "val_token_acc": totals["correct"] / count}

    def _count(self, key: str, value: torch.Tensor) -> None:
        # Tensors, summed on the device: reading them back only when a metrics row is written.
        self._interval[key] = self._interval[key] + value if key in self._interval else value.detach()

    def interval_counts(self) -> dict[str, torch.Tensor]:
        counts, self._interval = self._interval, {}
        return counts

    def flops_per_sample(self) -> float | None:
        """The model's training FLOPs per token (``ParamCounts.training_flops_per_token``) x seq_len."""
        if self.counts is None:
            return None
        per_token = self.counts.training_flops_per_token()
        return per_token * self.model_cfg.seq_len

    # -- artifacts ---------------------------------------------------------------------------

    def on_train_start(self, run_dir: Path) -> None:
        """The data report (rows kept, malformed and dropped rows by reason, packing) up front."""
        from hpcpipe.data.function_calling.prepare import REPORT_FILE

        shutil.copyfile(self.data_dir / REPORT_FILE, RunLayout(run_dir).data_report)

    def on_train_end(self, model: nn.Module, is_main: bool, run_dir: Path) -> None:
        """The adapter's full tensors, gathered on every rank (a collective under FSDP2) for the
        main rank to write in ``on_run_end``: writing it waits for a register reading the
        adapter, which no other rank must wait for in the group's last barrier (nor be left in,
        should it fail)."""
        from hpcpipe.models.lora_export import full_adapter_state

        state = full_adapter_state(model)
        if is_main:
            self._gathered = (model, state)

    def on_run_end(self, run_dir: Path) -> None:
        """The adapter export, the call threshold (``lora.calibration_cases``: minutes of
        generation, which no other rank waits for) and the run's summary file."""
        from hpcpipe.models.hf_lm import ParamCounts, resolve_base_dtype

        adapter = RunLayout(run_dir).adapter
        self._export_adapter(adapter)
        calibration = self._calibrate(adapter, run_dir) if self.lora_cfg.calibration_cases else None
        counts = self.counts or ParamCounts(0, 0)
        summary = {
            "model": self.model_cfg.name_or_path,
            "gguf_file": self.model_cfg.gguf_file,
            "params": {"trainable": counts.trainable, "frozen": counts.frozen, "fraction": counts.fraction},
            "lora": self.lora_cfg.model_dump(),
            "flops_per_token": "4N frozen + 6N adapters",  # matmul weights; recomputation not credited
            "adapter": ADAPTER_DIR,
            "dataset": self.data_dir.name,
            "base_dtype": resolve_base_dtype(self.model_cfg.base_dtype),
            "call_threshold": calibration.threshold if calibration else None,
        }
        RunLayout(run_dir).lora_summary.write_text(json.dumps(summary, indent=2) + "\n")

    def _export_adapter(self, adapter: Path) -> None:
        """What ``on_train_end`` gathered, written as ``hpcpipe ckpt export`` writes an export:
        staged, moved in, and recorded with the step it was trained to, so a register compares it
        with the checkpoints' exports and never takes one a kill cut short. A register uploading
        the earlier adapter holds it for a while: waited for (``ADAPTER_WAIT_S``), not refused."""
        from hpcpipe.models.lora_export import save_adapter
        from hpcpipe.recipes.export_folder import export_folder

        if self._gathered is None:
            return
        (model, state), self._gathered = self._gathered, None
        record = {"format": "adapter", "step": self.trained_step}
        with export_folder(adapter, record, keep_out_of=(), flag=None, wait_s=ADAPTER_WAIT_S) as staging:
            save_adapter(model, state, staging, tokenizer=self.chat.tokenizer)

    def _calibrate(self, adapter: Path, run_dir: Path) -> Any:  # evaluate.calibrate.Calibration
        """The call threshold, from the exported adapter loaded as evaluation loads it (fp32,
        SDPA), saved beside it (``lora.calibration_cases``; evaluate/calibrate.py)."""
        import dataclasses

        import torch

        from hpcpipe.evaluate.calibrate import adapter_sha256, calibrate
        from hpcpipe.models.lora_export import load_with_adapter
        from hpcpipe.observe.metrics import append_event

        cfg = self.lora_cfg
        model = load_with_adapter(self.source, adapter)
        if torch.cuda.is_available():  # the main rank's GPU; evaluation's own device otherwise
            model.to(torch.device("cuda", torch.cuda.current_device()))
        found = calibrate(
            model,
            self.chat,
            self.data_cfg.synthetic_mix,
            self.seed,
            cfg.calibration_cases,
            cfg.calibration_target,
        )
        found = dataclasses.replace(found, adapter_sha256=adapter_sha256(adapter))  # what it was set on
        found.save(adapter)
        append_event(
            run_dir, "calls_calibrated", threshold=found.threshold, cases=found.cases, target=found.target
        )
        return found

    def export(self, request: ExportRequest) -> Path:
        """The adapters of the checkpoint on a base rebuilt from the model source (fp32): a peft
        adapter directory, or a merged transformers model in ``request.dtype``."""
        from hpcpipe.checkpoint.export import load_weights
        from hpcpipe.models.hf_lm import apply_lora, load_base_model, load_tokenizer
        from hpcpipe.models.lora_export import write_lora_export

        model = apply_lora(load_base_model(self.source, "fp32"), self.lora_cfg)
        load_weights(request.checkpoint, model, trainable_only=True)
        return write_lora_export(model, request.fmt, request.out, request.dtype, load_tokenizer(self.source))

    def load_export(self, fmt: str, path: Path) -> Any:
        from hpcpipe.models.lora_export import load_with_adapter

        if fmt == "adapter":
            return load_with_adapter(self.source, path)
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path)
