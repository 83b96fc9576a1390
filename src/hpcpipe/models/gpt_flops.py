"""Training FLOPs of hpcpipe's GPT (the ``gpt`` recipe's MFU and ``hpcpipe roofline``)."""

from __future__ import annotations

from hpcpipe.config import ModelConfig
from hpcpipe.models.gpt import mlp_hidden

__all__ = ["matmul_params", "training_flops_per_token"]


def matmul_params(cfg: ModelConfig, vocab_size: int) -> int:
    """Weights that take part in a matmul: every block's Linear weights plus the LM head (V x C).

    The head is a (C -> V) matmul even when its weight is tied to the embedding; the embedding
    lookups are gathers, not matmuls, so they are left out. Biases and norm weights are
    element-wise and negligible, so they are left out too.
    """
    d = cfg.d_model
    kv = cfg.kv_heads * (d // cfg.n_heads)  # k and v width: C without grouped-query attention
    attention = 2 * d * d + 2 * d * kv  # q and proj (C x C each), k and v (C x kv each)
    mlp_matrices = 2 if cfg.variant == "gpt2" else 3  # fc/proj or gate/up/down
    mlp = mlp_matrices * d * mlp_hidden(cfg)
    return cfg.n_layers * (attention + mlp) + vocab_size * d


def training_flops_per_token(cfg: ModelConfig, vocab_size: int) -> float:
    """Model FLOPs for one trained token (forward + backward): 6 N + 12 L C T.

    6 N: each matmul weight costs 2 FLOPs (multiply + add) per token in the forward pass and
    twice that in the backward pass (gradients w.r.t. inputs and w.r.t. weights), with N from
    :func:`matmul_params`. 12 L C T: the attention scores (q k^T) and the attention-weighted
    values (p v) are matmuls without weights, 2 L C T FLOPs each forward per token, times 3 for
    forward + backward. This is the estimate of PaLM appendix B and nanoGPT's ``estimate_mfu``;
    causal masking is ignored (the kernels' savings are not credited), as they do.
    """
    n = matmul_params(cfg, vocab_size)
    return float(6 * n + 12 * cfg.n_layers * cfg.d_model * cfg.seq_len)
