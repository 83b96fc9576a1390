"""The ``model:`` section: which model a recipe builds and its shape."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from hpcpipe.config.section import Section


class ModelConfig(Section):
    """The model the recipe builds: its variant, size (for hpcpipe's own transformer) or source (a
    Hugging Face directory or GGUF file)."""

    variant: str = Field(
        "gpt2",
        min_length=1,
        description="Which model the recipe builds, for recipes that read it (each declares its "
        "variants: `hpcpipe recipes show NAME`). gpt: gpt2 (LayerNorm + learned positions + GELU "
        "MLP) or llama (RMSNorm + RoPE + SwiGLU, no biases). resnet-cifar: resnet18 (torchvision "
        "ResNet-18 with a small-image stem: 3x3 conv, stride 1, no max-pool) or resnet18-imagenet "
        "(the original 7x7 stride-2 stem + max-pool, 16x fewer FLOPs on small images). "
        "lora-function-calling and hf-causal-lm: hf-causal-lm, a Hugging Face AutoModelForCausalLM "
        "from model.name_or_path (n_layers, n_heads and d_model are then the checkpoint's own).",
    )
    name_or_path: str | None = Field(
        None,
        min_length=1,
        description="hf-causal-lm: a local model directory, a hub id already in the local "
        "Hugging Face cache (nothing is downloaded), a directory holding model.gguf_file, or "
        "'@tiny-llama' (a 2-layer Llama pre-trained on raw generated Glaive text; it ships with "
        "hpcpipe, and is pre-trained again, once per machine, only after a change to what builds it), "
        "'@tiny-llama-random' (the same, random weights: mechanics tests), "
        "or '@random:<shape>' (random weights of a real shape, e.g. @random:qwen2-7b: throughput).",
    )
    gguf_file: str | None = Field(
        None,
        min_length=1,
        description="hf-causal-lm: a GGUF file name inside model.name_or_path (or a path to "
        "one); transformers de-quantises it (needs the gguf and accelerate packages: the lora extra).",
    )
    base_dtype: Literal["auto", "fp32", "bf16"] = Field(
        "fp32",
        description="hf-causal-lm: dtype of the frozen base weights (bf16 halves their memory; "
        "LoRA adapters follow lora.adapter_dtype). auto: bf16 where the device multiplies bf16 "
        "in hardware (a CUDA GPU that supports it; a CPU with AVX512-BF16 or AMX), fp32 "
        "elsewhere: an AVX2-only CPU runs bf16 matmuls ~80x slower than fp32.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="hf-causal-lm: recompute each decoder layer's activations in backward "
        "(non-reentrant), trading ~1/3 more compute for memory.",
    )
    n_layers: int = Field(4, ge=1, description="Transformer blocks.")
    n_heads: int = Field(4, ge=1, description="Attention heads per block.")
    n_kv_heads: int | None = Field(
        None,
        ge=1,
        description="llama: key/value heads (grouped-query attention: each serves n_heads / n_kv_heads "
        "query heads; Llama 3 70B and 405B use 8). null: n_heads (multi-head attention).",
    )
    d_model: int = Field(128, ge=8, description="Residual stream width.")
    seq_len: int = Field(128, ge=2, description="Context length in tokens.")
    vocab_size: int | None = Field(
        None, ge=2, description="Vocabulary; null takes the prepared tokenizer's size."
    )
    ffn_mult: float = Field(
        4.0, gt=0, description="MLP hidden width / d_model (llama: 2/3 of this, rounded to 64)."
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on residual branches.")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base (llama variant).")
    norm_eps: float = Field(1e-5, gt=0, description="LayerNorm / RMSNorm epsilon.")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})"
            )
        if self.variant == "llama" and (self.d_model // self.n_heads) % 2 != 0:
            raise ValueError("model.d_model / model.n_heads must be even for RoPE (llama variant)")
        kv = self.n_kv_heads
        if kv is not None and (self.n_heads % kv or (self.variant != "llama" and kv != self.n_heads)):
            raise ValueError(
                f"model.n_kv_heads ({kv}) must divide model.n_heads ({self.n_heads}); grouped-query "
                "attention is the llama variant's (gpt2: null)"
            )
        return self

    @property
    def kv_heads(self) -> int:
        """Key/value heads: model.n_kv_heads, or n_heads."""
        return self.n_kv_heads or self.n_heads
