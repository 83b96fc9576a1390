"""A compact decoder-only GPT in two flavours, readable top to bottom (nanoGPT-style).

``GPT(cfg, vocab_size)`` builds either variant from ``cfg.variant``:

- ``gpt2``: learned absolute positions, pre-norm LayerNorm (with bias), biased attention and MLP,
  MLP ``fc -> GELU(tanh) -> proj`` (GPT-2's "gelu_new"), final LayerNorm, LM head tied to the
  token embedding.
- ``llama``: no position embedding; RoPE on q and k in the Hugging Face Llama convention
  (``rotate_half`` over the two halves of the head dimension); RMSNorm; SwiGLU MLP; no biases
  anywhere; final RMSNorm; LM head tied to the token embedding.

Both attend through ``F.scaled_dot_product_attention(is_causal=True)`` (flash / memory-efficient
kernels where available) and apply ``cfg.dropout`` on the residual branches only.

Parallelism is applied outside this file: the transformer blocks live in ``self.blocks``
(an ``nn.ModuleList``) so a trainer can ``fully_shard`` each block and then the root; nothing here
holds parameters outside modules or creates them lazily.

Parameter names and their Hugging Face counterparts (``i`` is the block index; GPT-2's
``Conv1D`` stores weights as (in, out), so every GPT-2 Linear weight is exported transposed)::

    ours                      GPT2LMHeadModel                  LlamaForCausalLM
    tok_emb.weight            transformer.wte.weight           model.embed_tokens.weight
    pos_emb.weight            transformer.wpe.weight           (none: RoPE)
    blocks.i.ln_1.*           transformer.h.i.ln_1.*           model.layers.i.input_layernorm.weight
    blocks.i.attn.{q,k,v}.*   transformer.h.i.attn.c_attn.*    model.layers.i.self_attn.{q,k,v}_proj.weight
                              (cat(q, k, v).T, biases cat)
    blocks.i.attn.proj.*      transformer.h.i.attn.c_proj.*    model.layers.i.self_attn.o_proj.weight
    blocks.i.ln_2.*           transformer.h.i.ln_2.*           model.layers.i.post_attention_layernorm.weight
    blocks.i.mlp.fc.*         transformer.h.i.mlp.c_fc.*       -
    blocks.i.mlp.proj.*       transformer.h.i.mlp.c_proj.*     -
    blocks.i.mlp.gate.weight  -                                model.layers.i.mlp.gate_proj.weight
    blocks.i.mlp.up.weight    -                                model.layers.i.mlp.up_proj.weight
    blocks.i.mlp.down.weight  -                                model.layers.i.mlp.down_proj.weight
    ln_f.*                    transformer.ln_f.*               model.norm.weight
    lm_head.weight            lm_head.weight (tied)            lm_head.weight (tie_word_embeddings)

The rows of ``attn.q``/``k``/``v`` are laid out head after head with the head dimension in the HF
``rotate_half`` order, so the Llama names need no permutation. q, k and v are three projections
rather than one fused matrix so that tensor parallelism can split each by heads (column-wise):
a rank's rows of a fused (3C, C) matrix would hold all of q and half of k. HF config values: GPT-2
``n_embd=d_model, n_layer, n_head, n_positions=seq_len, layer_norm_epsilon=norm_eps,
activation_function="gelu_new"``; Llama ``intermediate_size=mlp_hidden(cfg),
num_key_value_heads=n_heads, rope_theta, rms_norm_eps=norm_eps, hidden_act="silu"``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hpcpipe.config import ModelConfig

__all__ = ["GPT", "apply_rope", "mlp_hidden", "rope_tables"]

# Shape legend: B batch, T sequence length, C = d_model, H heads, D = C // H head dim,
# F MLP hidden width, V vocabulary.


def mlp_hidden(cfg: ModelConfig) -> int:
    """MLP hidden width F.

    gpt2: ``round(ffn_mult * d_model)``. llama: SwiGLU has three matrices instead of two, so the
    width is 2/3 of that (same parameter count), rounded *up* to a multiple of 64 for
    tensor-core-friendly shapes, as Llama's ``multiple_of`` does (Llama uses 256: d_model 4096
    gives 11008 there, 10944 here; export the width as HF ``intermediate_size``).
    """
    width = cfg.ffn_mult * cfg.d_model
    if cfg.variant == "gpt2":
        return round(width)
    return 64 * math.ceil(round(2 / 3 * width) / 64)


# ---------------------------------------------------------------------------------------------
# Rotary position embedding (Hugging Face Llama convention)


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (seq_len, head_dim), in fp32.

    Frequency j (of head_dim / 2) is ``theta ** (-2j / head_dim)``; the table repeats the
    frequencies over both halves of the head dimension (``cat(freqs, freqs)``), which is what
    pairs element j with element j + D/2 in ``rotate_half``.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))  # (D/2,)
    positions = torch.arange(seq_len, dtype=torch.float32)  # (T,)
    freqs = torch.outer(positions, inv_freq)  # (T, D/2)
    angles = torch.cat((freqs, freqs), dim=-1)  # (T, D)
    return angles.cos(), angles.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., D/2) each
    return torch.cat((-x2, x1), dim=-1)  # (..., D)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate q or k: x (B, H, T, D), cos/sin (T, D) -> (B, H, T, D) in x's dtype.

    Computed in fp32 (then cast back) so bf16 activations do not lose the rotation's precision.
    """
    xf = x.float()
    cos, sin = cos.float(), sin.float()  # (T, D), broadcast over B and H
    return (xf * cos + _rotate_half(xf) * sin).type_as(x)


# ---------------------------------------------------------------------------------------------
# Building blocks


def _norm(cfg: ModelConfig) -> nn.Module:
    if cfg.variant == "gpt2":
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=True)
    return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: q, k, v projections, SDPA, output projection.

    Shapes are taken from the tensors, not the config: under tensor parallelism q/k/v hold this
    rank's H/tp heads (C/tp columns) and ``proj`` takes those back to the full width C.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        bias = cfg.variant == "gpt2"
        self.head_dim = cfg.d_model // cfg.n_heads
        kv_width = cfg.kv_heads * self.head_dim  # grouped-query attention: fewer k/v heads
        self.grouped = cfg.kv_heads != cfg.n_heads
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=bias)
        self.k = nn.Linear(cfg.d_model, kv_width, bias=bias)
        self.v = nn.Linear(cfg.d_model, kv_width, bias=bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        B, T, _ = x.shape
        heads = (B, T, -1, self.head_dim)  # -1: this rank's heads (all of them without TP)
        q = self.q(x).view(heads).transpose(1, 2)  # (B, H, T, D)
        k = self.k(x).view(heads).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.v(x).view(heads).transpose(1, 2)  # (B, Hkv, T, D)
        if rope is not None:
            # The tables cover model.seq_len; this sequence is T long (a pipeline stage after the
            # first sees hidden states, not token ids, so the caller does not slice them).
            cos, sin = rope[0][:T], rope[1][:T]  # (T, D) each
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Grouped-query: each k/v head serves H / Hkv consecutive query heads (HF's repeat_kv order).
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.grouped)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, H * D)
        return self.proj(y)  # (B, T, C)


class MLP(nn.Module):
    """GPT-2 MLP: fc -> GELU (tanh approximation, GPT-2's "gelu_new") -> proj."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, mlp_hidden(cfg))
        self.proj = nn.Linear(mlp_hidden(cfg), cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))  # (B, T, C) -> (B, T, F) -> (B, T, C)


class SwiGLU(nn.Module):
    """Llama MLP: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, mlp_hidden(cfg), bias=False)
        self.up = nn.Linear(cfg.d_model, mlp_hidden(cfg), bias=False)
        self.down = nn.Linear(mlp_hidden(cfg), cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))  # (B, T, C) -> (B, T, F) -> (B, T, C)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)). The FSDP2 unit."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = _norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = _norm(cfg)
        self.mlp: nn.Module = MLP(cfg) if cfg.variant == "gpt2" else SwiGLU(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_1(x), rope))  # (B, T, C)
        return x + self.drop(self.mlp(self.ln_2(x)))  # (B, T, C)


# ---------------------------------------------------------------------------------------------
# The model


class GPT(nn.Module):
    """Decoder-only language model: token ids (B, T) -> next-token logits (B, T, V).

    ``vocab_size`` is passed explicitly because ``cfg.vocab_size`` may be None ("take the
    tokenizer's size"); the caller resolves it.
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.seq_len = cfg.seq_len
        # Forward lengths are padded to a multiple of this in generate (sequence-parallel ranks
        # each take T / tp tokens: models/gpt_parallel.py sets it); 1: no padding.
        self.sequence_multiple = 1
        self.head_dim = cfg.d_model // cfg.n_heads
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model) if cfg.variant == "gpt2" else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = _norm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        if cfg.variant == "llama":
            # Non-persistent: derived from the config, so not in the state_dict (nor checkpoints).
            cos, sin = rope_tables(cfg.seq_len, self.head_dim, cfg.rope_theta)
            self.register_buffer("rope_cos", cos, persistent=False)  # (seq_len, D) fp32
            self.register_buffer("rope_sin", sin, persistent=False)  # (seq_len, D) fp32
        self.init_weights()

    def init_weights(self) -> None:
        """(Re-)initialise everything: tie the head, RoPE tables, GPT-2-style weights.

        Public so a model built on the meta device can be materialised with ``to_empty()`` and
        then initialised (``to_empty`` unties shared parameters, so this re-ties them).
        Linear and embedding weights ~ N(0, 0.02); the projections that write into the
        residual stream (attn.proj, mlp.proj / mlp.down) use 0.02 / sqrt(2 * n_layers) so the
        residual's variance does not grow with depth (GPT-2 paper, section 2.3); biases 0,
        norm weights 1.
        """
        if self.lm_head.weight is not self.tok_emb.weight:
            self.lm_head.weight = self.tok_emb.weight  # tie: one (V, C) tensor, two uses
        with torch.no_grad():
            if self.cfg.variant == "llama":
                cos, sin = rope_tables(self.seq_len, self.head_dim, self.cfg.rope_theta)
                self.get_buffer("rope_cos").copy_(cos)
                self.get_buffer("rope_sin").copy_(sin)
            residual_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
            for module in self.modules():
                if isinstance(module, nn.Linear) and module is not self.lm_head:
                    nn.init.normal_(module.weight, mean=0.0, std=0.02)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
                elif isinstance(module, nn.Embedding):
                    nn.init.normal_(module.weight, mean=0.0, std=0.02)
                elif isinstance(module, nn.LayerNorm | nn.RMSNorm):
                    module.reset_parameters()
            for name, param in self.named_parameters():
                if name.endswith(("attn.proj.weight", "mlp.proj.weight", "mlp.down.weight")):
                    nn.init.normal_(param, mean=0.0, std=residual_std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx: LongTensor (B, T) with T <= seq_len -> logits (B, T, V)."""
        if idx.dim() != 2:
            raise ValueError(f"GPT expects token ids of shape (batch, time), got {tuple(idx.shape)}")
        n_tokens = idx.shape[1]  # T
        if n_tokens > self.seq_len:
            raise ValueError(
                f"sequence length {n_tokens} exceeds the model's context (model.seq_len={self.seq_len})"
            )
        x = embed(self.tok_emb, self.pos_emb, idx)  # (B, T, C)
        rope = rope_of(self)
        for block in self.blocks:
            x = block(x, rope)  # (B, T, C)
        x = self.ln_f(x)  # (B, T, C)
        return self.lm_head(x)  # (B, T, V)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; shared tensors counted once (the tied head is the token embedding).

        ``non_embedding`` drops the token and position embeddings, the usual count for
        scaling laws (Kaplan et al. 2020) and for comparing models with different vocabularies.
        """
        total = sum(p.numel() for p in self.parameters())  # parameters() de-duplicates the tie
        if non_embedding:
            total -= self.tok_emb.weight.numel()
            if self.pos_emb is not None:
                total -= self.pos_emb.weight.numel()
        return total

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Sample ``max_new_tokens`` tokens after idx (B, T0) -> (B, T0 + max_new_tokens).

        The context is cropped to the last ``seq_len`` tokens (no KV cache: simple, and fast
        enough for samples in reports). ``temperature=0`` is greedy decoding; ``top_k`` keeps
        the k most likely tokens; pass a seeded ``generator`` for reproducible samples. Runs in
        eval mode (dropout off) and restores the previous mode.
        """
        if max_new_tokens < 0 or temperature < 0 or (top_k is not None and top_k < 1):
            raise ValueError("generate: need max_new_tokens >= 0, temperature >= 0, top_k >= 1")
        was_training = self.training
        self.eval()
        try:
            for _ in range(max_new_tokens):
                context = idx[:, -self.seq_len :]  # (B, T' <= seq_len)
                logits = self(_pad_right(context, self.sequence_multiple))[
                    :, context.shape[1] - 1, :
                ].float()  # (B, V)
                idx = torch.cat((idx, self._sample(logits, temperature, top_k, generator)), dim=1)
        finally:
            self.train(was_training)
        return idx  # (B, T0 + max_new_tokens)

    @staticmethod
    def _sample(
        logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
    ) -> torch.Tensor:
        """logits (B, V) -> next token ids (B, 1); NotFinite when the model's outputs are not."""
        if not bool(torch.isfinite(logits).all()):
            raise NotFinite("generate: the model's logits are not finite (its weights diverged)")
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        logits = logits / temperature
        if top_k is not None and top_k < logits.shape[-1]:
            kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = F.softmax(logits, dim=-1)  # (B, V)
        return torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)


class NotFinite(ValueError):
    """The model's outputs hold NaN or infinity: nothing to sample from."""


def check_fits_in_host_memory(cfg: ModelConfig, vocab_size: int) -> None:
    """ConfigError when the whole model's fp32 weights would not fit in this host's available
    memory (every rank builds it whole, from the seed, before anything shards it)."""
    from hpcpipe.errors import ConfigError

    width, kv = cfg.d_model, cfg.kv_heads * (cfg.d_model // cfg.n_heads)
    mlp = (2 if cfg.variant == "gpt2" else 3) * width * mlp_hidden(cfg)
    params = cfg.n_layers * (2 * width * width + 2 * width * kv + mlp) + vocab_size * width
    available = _available_host_bytes()
    if available is None:
        return
    if params * 4 > available:
        raise ConfigError(
            f"model: {params / 1e9:,.1f}B parameters need {params * 4 / 1e9:,.0f} GB of fp32 weights on "
            f"every rank before they are sharded, and this host has {available / 1e9:,.0f} GB free; "
            "hpcpipe does not build models on the meta device yet: plan it (hpcpipe plan memory) and "
            "render its launch, or train a smaller shape"
        )


def _available_host_bytes() -> int | None:
    """Linux's MemAvailable (free memory plus the page cache it can reclaim); free pages alone
    where /proc/meminfo does not say (a data node's page cache made MemFree refuse models that fit)."""
    import os

    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def embed(tok_emb: nn.Module, pos_emb: nn.Module | None, idx: torch.Tensor) -> torch.Tensor:
    """Token ids (B, T) -> (B, T, C): token embedding, plus learned positions (gpt2)."""
    x = tok_emb(idx)  # (B, T, C)
    if pos_emb is not None:
        positions = torch.arange(idx.shape[1], device=idx.device)  # (T,)
        x = x + pos_emb(positions)  # (B, T, C) + (T, C)
    return x


def rope_of(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The RoPE tables (seq_len, D) a module holds as buffers (llama), or None (gpt2)."""
    if not hasattr(module, "rope_cos"):
        return None
    return module.get_buffer("rope_cos"), module.get_buffer("rope_sin")


def _pad_right(idx: torch.Tensor, multiple: int) -> torch.Tensor:
    """idx (B, T) -> (B, ceil(T / multiple) * multiple), padded with token 0 on the right; a causal
    model's logits at positions < T do not depend on what follows."""
    pad = -idx.shape[1] % multiple
    return F.pad(idx, (0, pad)) if pad else idx
