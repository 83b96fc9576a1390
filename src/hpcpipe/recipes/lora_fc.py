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
  gradients), 6N with gradient checkpointing (one more forward); 6N (8N) for the adapters.
  Attention score FLOPs are left out.
- Checkpoints hold the adapters and their optimizer state only (the base is rebuilt from its
  source); ``on_train_end`` exports the adapter (peft format, full tensors gathered on every rank)
  and writes ``lora_summary.json``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hpcpipe.config import DataConfig, JobConfig, LoraConfig, ModelConfig, TrainConfig
from hpcpipe.data.function_calling.tokens import IGNORE
from hpcpipe.layout import RunLayout
from hpcpipe.models.hf_lm import ModelSource, ParamCounts
from hpcpipe.recipes.base import Batch, TrainLoader

ADAPTER_DIR = f"{RunLayout.EXPORT}/{RunLayout.ADAPTER}"  # relative to the run directory


def packed_attention(doc_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """doc_ids (B, T) -> a boolean mask (B, 1, T, T) and positions (B, T), for a model that
    attends with a mask (the raw loop of benchmarks/lora_overhead.py); the recipe itself runs
    each conversation's span alone (``models/packed_attention.py``).

    Token i may attend to token j when both belong to the same conversation and j <= i; padding
    (doc -1) attends to itself only, so no row of the mask is empty (SDPA returns NaN for those).
    Positions restart at 0 at every conversation.
    """
    from hpcpipe.models.packed_attention import packed_positions

    t = doc_ids.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=doc_ids.device).tril()
    same = doc_ids[:, :, None] == doc_ids[:, None, :]  # (B, T, T)
    eye = torch.eye(t, dtype=torch.bool, device=doc_ids.device)
    mask = (same & causal & (doc_ids[:, :, None] >= 0)) | eye
    return mask[:, None], packed_positions(doc_ids)


def opening_targets(targets: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the supervised targets that follow an unsupervised one, the first token of
    each assistant turn."""
    supervised = targets != IGNORE
    return supervised & F.pad(~supervised[:, :-1], (1, 0), value=True)


def text_openings(targets: torch.Tensor, opens: torch.Tensor, call_open: Sequence[int]) -> torch.Tensor:
    """(B, T) bool: the ``opens`` of assistant turns that make no call, the turns (supervised runs
    of ``targets``, B, T) in which the token ids of ``call_open`` ("<tool_call>") never follow
    one another. A call after a preamble ("Sure, one moment.") still makes its turn a call."""
    supervised = targets != IGNORE
    turn = torch.cumsum(opens.long(), dim=1) * supervised  # (B, T): 1, 2, ... per turn; 0 between
    starts = supervised.clone()  # positions t with targets[t + i] == call_open[i] for every i
    for i, token in enumerate(call_open):
        starts &= F.pad(targets[:, i:], (0, i), value=IGNORE) == token
    calls = torch.zeros(turn.shape[0], turn.shape[1] + 1, dtype=torch.long, device=targets.device)
    calls.scatter_add_(1, turn, starts.long())  # (B, T + 1): call openers per turn id
    return opens & (calls.gather(1, turn) == 0)


def supervised_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    opens: torch.Tensor,
    decision_weight: float,
    text_opens: torch.Tensor | None = None,
    no_call_weight: float = 1.0,
) -> torch.Tensor:
    """Mean cross-entropy over the supervised targets (B, K) of ``logits`` (B, K, V); with
    ``decision_weight`` != 1, the tokens that open an assistant turn (``opens``, B, K) weigh that
    much in a weighted mean: one token in ~40 of a reply decides call or no call. Those that open
    a turn without a call (``text_opens``, B, K) weigh ``no_call_weight`` times more again."""
    flat, labels = logits.flatten(0, 1).float(), targets.flatten()
    if decision_weight == 1 and (text_opens is None or no_call_weight == 1):
        supervised = (labels != IGNORE).sum()
        return F.cross_entropy(flat, labels, ignore_index=IGNORE, reduction="sum") / supervised.clamp(min=1)
    per_token = F.cross_entropy(flat, labels, ignore_index=IGNORE, reduction="none")  # (B*K,), 0 if ignored
    weights = torch.where(opens.flatten(), decision_weight, 1.0) * (labels != IGNORE)
    if text_opens is not None:
        weights = torch.where(text_opens.flatten(), weights * no_call_weight, weights)
    return (per_token * weights).sum() / weights.sum().clamp(min=1)


def _kept(targets: torch.Tensor) -> torch.Tensor:
    """(K,) the positions whose target is supervised in some row of targets (B, T); one position
    for an all-padding batch, which keeps the graph alive."""
    keep = (targets != IGNORE).any(dim=0).nonzero().squeeze(1)
    return keep if keep.numel() else torch.zeros(1, dtype=torch.long, device=targets.device)


@dataclass
class LoraFCRecipe:
    model_cfg: ModelConfig
    lora_cfg: LoraConfig
    data_cfg: DataConfig
    train_cfg: TrainConfig
    seed: int
    name: str = "lora-function-calling"
    throughput_unit: str = "tokens"
    broadcasts_buffers: bool = False  # rotary tables only: identical on every rank
    checkpoint_trainable_only: bool = True
    counts: ParamCounts | None = None
    _interval: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def from_job(cls, job: JobConfig) -> LoraFCRecipe:
        return cls(job.model, job.lora, job.data, job.train, job.run.seed)

    @property
    def items_per_sample(self) -> int:
        return self.model_cfg.seq_len

    @property
    def fsdp_param_dtype(self) -> torch.dtype | None:
        """FSDP2 gathers a unit's parameters in one dtype: with a bf16 base the fp32 adapters are
        gathered in bf16 too (their fp32 shards stay the optimizer's master copy)."""
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
        tok = self.chat.tokenizer
        backend = (
            tok.backend_tokenizer.to_str() if hasattr(tok, "backend_tokenizer") else repr(tok.get_vocab())
        )
        return hashlib.sha256((backend + str(tok.chat_template)).encode()).hexdigest()

    # -- data --------------------------------------------------------------------------------

    @cached_property
    def data_dir(self) -> Path:
        from hpcpipe.data.function_calling.prepare import fingerprint, prepared_path

        key = fingerprint(self.data_cfg, self.model_cfg.seq_len, self._tokenizer_key(), self.seed)
        return prepared_path(self.data_cfg.prepared_dir, key)

    def prepare(self, progress: bool) -> None:
        from hpcpipe.data.function_calling.prepare import prepare, read_split
        from hpcpipe.models.hf_lm import check_source

        check_source(self.source, self.lora_cfg)

        if not (self.data_dir / "data_report.json").is_file():
            data = read_split(self.data_cfg, self.seed)
            prepare(self.data_cfg, data, self.chat, self.model_cfg.seq_len, self.data_dir)

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
        """Logits (B, K, V) at the K positions that predict a supervised token; their targets (B, K);
        which of those targets open an assistant turn (B, K), where the model decides between a
        call and text; and which open a turn that makes no call (B, K)."""
        from hpcpipe.models.packed_attention import document_spans, packed_positions

        input_ids, labels, doc_ids, context = batch  # (B, T) each
        targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE)  # (B, T): position t predicts token t+1
        opens = opening_targets(targets)  # (B, T)
        text_opens = text_openings(targets, opens, self.call_open)  # (B, T)
        if self.lora_cfg.frozen_context and context.any():
            return self._logits_after_context(model, batch, targets, opens, text_opens)
        keep = _kept(targets)  # (K,)
        out = model(
            input_ids=input_ids,
            position_ids=packed_positions(doc_ids),
            spans=document_spans(doc_ids),  # each conversation attends within its own span
            logits_to_keep=keep,
        )
        return out.logits, targets[:, keep], opens[:, keep], text_opens[:, keep]

    def _logits_after_context(
        self,
        model: nn.Module,
        batch: Batch,
        targets: torch.Tensor,
        opens: torch.Tensor,
        text_opens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``_logits`` with the system prompts run first without gradients (``lora.frozen_context``,
        models/context_split.py); targets, opens and text_opens (B, T) in the row's order."""
        from hpcpipe.models.context_split import context_cache, split_context

        input_ids, _, doc_ids, context = batch
        split = split_context(input_ids, doc_ids, context, int(self.chat.tokenizer.pad_token_id))
        cache = context_cache(model, split)

        def in_suffix(x: torch.Tensor, fill: int | bool) -> torch.Tensor:  # (B, T) -> (B, S), suffix order
            padded = torch.cat([x, torch.full_like(x[:, :1], fill)], dim=1)  # index T: padding
            return padded.gather(1, split.suffix_index)

        targets, opens, text_opens = (
            in_suffix(targets, IGNORE),
            in_suffix(opens, False),
            in_suffix(text_opens, False),
        )
        keep = _kept(targets)
        out = model(
            input_ids=split.suffix_ids,
            position_ids=split.suffix_positions,
            past_key_values=cache,
            context_spans=split.suffix_spans,
            logits_to_keep=keep,
        )
        return out.logits, targets[:, keep], opens[:, keep], text_opens[:, keep]

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        logits, targets, opens, text_opens = self._logits(model, batch)
        supervised = (targets != IGNORE).sum()
        self._count("real_tokens", (batch[2] >= 0).sum())
        self._count("supervised_tokens", supervised)
        cfg = self.lora_cfg
        return supervised_loss(logits, targets, opens, cfg.decision_weight, text_opens, cfg.no_call_weight)

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
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
        if self.counts is None:
            return None
        recompute = 2.0 if self.model_cfg.gradient_checkpointing else 0.0
        per_token = (4.0 + recompute) * self.counts.frozen + (6.0 + recompute) * self.counts.trainable
        return per_token * self.model_cfg.seq_len

    # -- artifacts ---------------------------------------------------------------------------

    def on_train_start(self, run_dir: Path) -> None:
        """The data report (rows kept, malformed and dropped rows by reason, packing) up front."""
        shutil.copyfile(self.data_dir / "data_report.json", RunLayout(run_dir).data_report)

    def on_train_end(self, model: nn.Module, is_main: bool, run_dir: Path) -> None:
        """Adapter export (every rank gathers; the main rank writes) and the run's summary files."""
        from hpcpipe.models.hf_lm import resolve_base_dtype
        from hpcpipe.models.lora_export import full_adapter_state, save_adapter

        state = full_adapter_state(model)  # collective under FSDP2
        if not is_main:
            return
        adapter = save_adapter(model, state, RunLayout(run_dir).adapter, tokenizer=self.chat.tokenizer)
        calibration = self._calibrate(adapter, run_dir) if self.lora_cfg.calibration_cases else None
        counts = self.counts or ParamCounts(0, 0)
        summary = {
            "model": self.model_cfg.name_or_path,
            "gguf_file": self.model_cfg.gguf_file,
            "params": {"trainable": counts.trainable, "frozen": counts.frozen, "fraction": counts.fraction},
            "lora": self.lora_cfg.model_dump(),
            "flops_per_token": "6N frozen + 8N adapters (gradient checkpointing)"
            if self.model_cfg.gradient_checkpointing
            else "4N frozen + 6N adapters",
            "adapter": ADAPTER_DIR,
            "dataset": self.data_dir.name,
            "base_dtype": resolve_base_dtype(self.model_cfg.base_dtype),
            "call_threshold": calibration.threshold if calibration else None,
        }
        RunLayout(run_dir).lora_summary.write_text(json.dumps(summary, indent=2) + "\n")

    def _calibrate(self, adapter: Path, run_dir: Path) -> Any:  # evaluate.calibrate.Calibration
        """The call threshold, from the exported adapter loaded as evaluation loads it (fp32,
        SDPA), saved beside it (``lora.calibration_cases``; evaluate/calibrate.py)."""
        from hpcpipe.evaluate.calibrate import calibrate
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
        found.save(adapter)
        append_event(
            run_dir, "calls_calibrated", threshold=found.threshold, cases=found.cases, target=found.target
        )
        return found
