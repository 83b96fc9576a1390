"""The ``lora:`` section: LoRA adapters (peft) for recipes that fine-tune a frozen base."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hpcpipe.config.section import Section


class LoraConfig(Section):
    """LoRA adapters (peft) for recipe lora-function-calling; the base model stays frozen."""

    r: int = Field(16, ge=1, description="Adapter rank.")
    alpha: float = Field(32.0, gt=0, description="Scale numerator: updates are scaled by alpha / r.")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the adapter input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
        description="Names of the Linear modules that get adapters (suffixes of module names, as peft "
        "matches them); every name must match at least one module of the model.",
    )
    top_layers: int | None = Field(
        None,
        ge=1,
        description="Adapt only the last N decoder layers (null: every layer). Backward then stops "
        "below them, since nothing beneath needs a gradient: on SmolLM2 (30 layers) on 2 CPU "
        "cores, 20 layers trained at 1.29x the tokens/s of 30 (AMD EPYC, 2026-11-27: benchmarks/README.md).",
    )
    frozen_context: bool = Field(
        False,
        description="Run each conversation's system prompt (with the tool schemas: 64-78% of the "
        "tokens of generated conversations, by mix) forward without gradients first, then the rest "
        "attending to its cached keys and values (models/context_split.py): the same forward, "
        "backward over the rest only. The adapters then learn to read the schemas, not to encode "
        "them.",
    )
    decision_weight: float = Field(
        1.0,
        ge=1,
        le=100,
        description="Loss weight of the first token of each assistant turn, where the model decides "
        "between a call and a text reply, relative to the other supervised tokens (1: a plain mean).",
    )
    no_call_weight: float = Field(
        1.0,
        gt=0,
        le=100,
        description="Further factor on the first token of an assistant turn that makes no call (a "
        "refusal, an answer, a question), over decision_weight: a class weight on the decision. Above "
        "1 moves the call/no-call boundary toward declining, below 1 toward calling, with the "
        "training rows unchanged.",
    )
    calibration_cases: int = Field(
        0,
        ge=0,
        le=5000,
        description="After training, score this many generated near-miss requests (a single "
        "request whose matching function is swapped out, evaluate/calibrate.py) and save the call "
        "threshold at which calibration_target of them decline beside the adapter "
        "(call_threshold.json); `hpcpipe eval function-calling` then decides call or no call by "
        "it. 0: no calibration, greedy decoding decides. Nothing of a benchmark is used.",
    )
    calibration_target: float = Field(
        0.95,
        gt=0,
        le=1,
        description="The share of the calibration's near misses that must decline at the threshold.",
    )
    adapter_dtype: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Dtype of the trainable adapter weights (and their optimizer state): fp32 "
        "keeps small updates from rounding away under a bf16 base; FSDP2 then gathers them in bf16 "
        "for compute and reduces their gradients in fp32.",
    )
