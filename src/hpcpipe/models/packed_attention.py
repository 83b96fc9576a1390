"""Attention over packed rows one conversation at a time, with no (T, T) mask.

A packed row holds several conversations (``data/function_calling/pack.py``). A block-diagonal
mask keeps them apart, but a mask sends SDPA to its masked kernels, which score every (query,
key) pair of the row, across conversations too, and then discard most of them. Here SDPA runs
causally on each conversation's span of the row (its flash kernel, on CPU and CUDA) and the
spans are concatenated back: the same outputs (``tests/unit/recipes/test_lora_fc_loss.py``), and only the
spans' squares are scored instead of the row's. On this project's 2-core AMD EPYC (AVX2) machine
on 2026-11-27 a SmolLM2 training step on 1280-token rows ran 1.14x faster (benchmarks/README.md,
"LoRA function calling": "Step time on the AVX2 machine").

Registered with transformers' public ``AttentionInterface`` as ``PACKED``; a model switched to it
(``model.set_attn_implementation(PACKED)``) takes ``spans=document_spans(doc_ids)`` in its
forward, which transformers hands to every attention layer. A forward with a KV cache of the
conversations' system prompts takes ``context_spans`` instead (``models/context_split.py``): each
conversation's tokens attend to its own cached prompt and causally to each other. A forward with
neither (generation, a caller with a mask of its own) runs transformers' SDPA path unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

PACKED = "hpcpipe_packed"

Spans = list[list[tuple[int, int]]]  # per row: (start, end) of each conversation, covering the row
# Per row, for each conversation: (start, end) of its system prompt among the cached keys, and
# (start, end) of its other tokens among the queries; (0, 0) for a conversation without a prompt.
ContextSpans = list[list[tuple[int, int, int, int]]]


def document_spans(doc_ids: torch.Tensor) -> Spans:
    """doc_ids (B, T) -> for each row, the (start, end) of every run of one id (padding, -1, is
    one more run at the end of a row). One host sync per batch."""
    t = doc_ids.shape[1]
    changes = (doc_ids[:, 1:] != doc_ids[:, :-1]).nonzero().tolist()  # [(row, t - 1), ...]
    cuts: list[list[int]] = [[0] for _ in range(doc_ids.shape[0])]
    for row, at in changes:
        cuts[row].append(at + 1)
    return [list(zip(c, [*c[1:], t], strict=True)) for c in cuts]


def packed_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """doc_ids (B, T) -> positions (B, T) that restart at 0 where each conversation starts."""
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    index = torch.arange(doc_ids.shape[1], device=doc_ids.device).expand_as(doc_ids)
    first = torch.cummax(torch.where(starts, index, torch.zeros_like(index)), dim=1).values
    return index - first


def packed_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    spans: Spans | None = None,
    context_spans: ContextSpans | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """query (B, H, T, D), key and value (B, H_kv, T, D) -> (B, T, H, D), as transformers'
    attention functions return it. Causal within each span of ``spans``; no span sees another.
    With ``context_spans`` key and value are (B, H_kv, P + T, D): the P cached prompt tokens first."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if spans is None and context_spans is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    groups = query.shape[1] // key.shape[1]  # grouped-query attention: heads per key/value head
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    if context_spans is not None:
        return _context_attention(query, key, value, context_spans, dropout, scaling), None
    assert spans is not None
    rows = []
    for b, row in enumerate(spans):
        parts = [
            F.scaled_dot_product_attention(
                query[b : b + 1, :, s:e],
                key[b : b + 1, :, s:e],
                value[b : b + 1, :, s:e],
                dropout_p=dropout,
                is_causal=True,
                scale=scaling,
            )
            for s, e in row
        ]
        rows.append(torch.cat(parts, dim=2))
    return torch.cat(rows, dim=0).transpose(1, 2).contiguous(), None


def _context_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    context_spans: ContextSpans,
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    """query (B, H, S, D) and key, value (B, H, P + S, D), the P cached prompt tokens first ->
    (B, S, H, D): each conversation's queries see its whole prompt and, causally, themselves."""
    cached = key.shape[2] - query.shape[2]
    rows = []
    for b, row in enumerate(context_spans):
        parts = []
        for c0, c1, s0, s1 in row:
            q = query[b : b + 1, :, s0:s1]
            k = torch.cat([key[b : b + 1, :, c0:c1], key[b : b + 1, :, cached + s0 : cached + s1]], dim=2)
            v = torch.cat([value[b : b + 1, :, c0:c1], value[b : b + 1, :, cached + s0 : cached + s1]], dim=2)
            # (S_c, P_c + S_c): the prompt in full, then causal; lower-right aligned
            mask = torch.ones(s1 - s0, c1 - c0 + s1 - s0, dtype=torch.bool, device=q.device).tril(c1 - c0)
            parts.append(
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling)
            )
        rows.append(torch.cat(parts, dim=2))
    return torch.cat(rows, dim=0).transpose(1, 2).contiguous()


def register() -> None:
    """Make ``PACKED`` a transformers attention implementation (idempotent). Its mask function is
    SDPA's, for forwards without ``spans``; with them the mask is ignored."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PACKED, packed_attention_forward)
    AttentionMaskInterface.register(PACKED, sdpa_mask)


def use_packed_attention(model: nn.Module) -> None:
    """Switch a transformers model to ``PACKED`` attention (forwards then take ``spans=``)."""
    register()
    model.set_attn_implementation(PACKED)  # type: ignore[operator]
