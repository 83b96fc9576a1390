"""Packed rows split into their system prompts and the rest, for training with the prompts frozen.

In the generated function-calling conversations the system prompt, with the tool schemas, holds
64% (the p16 mix) to 78% (the preset's) of the tokens (benchmarks/README.md, "LoRA function
calling"). No loss falls on it, yet backward runs through all of it: the replies attend to its
keys and values. ``lora.frozen_context`` runs each packed row in two passes:

1. the conversations' system prompts (``Packed.context``), forward under ``torch.no_grad``: no
   activations kept, their keys and values left in a KV cache;
2. the rest of every conversation, forward with gradients, each conversation attending to its
   own cached prompt and causally to itself (``packed_attention``'s ``context_spans``).

Forward values are those of one pass over the row: the same attention pattern, positions and
weights (``tests/unit/models/test_context_split.py``). The gradient leaves out the paths through the
prompts' keys and values: the adapters learn to read the schemas, not to encode them. Backward
covers the remaining third of the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpcpipe.models.packed_attention import ContextSpans, Spans, packed_positions


@dataclass(frozen=True)
class ContextSplit:
    prefix_ids: torch.Tensor  # (B, P): each row's system prompts in order, padded at the end
    prefix_positions: torch.Tensor  # (B, P)
    prefix_spans: Spans  # per row: each prompt's (start, end) in prefix_ids (padding: one more)
    suffix_ids: torch.Tensor  # (B, S): the row's other tokens in order, padded at the end
    suffix_positions: torch.Tensor  # (B, S)
    suffix_spans: ContextSpans  # per row: (prompt start, end in the cache, start, end in suffix_ids)
    suffix_index: torch.Tensor  # (B, S): each suffix token's position in the row; T for padding

    @property
    def has_context(self) -> bool:
        return self.prefix_ids.shape[1] > 0


def _runs(docs: list[int]) -> list[tuple[int, int, int]]:
    """(doc, start, end) of each run of equal ids."""
    out: list[tuple[int, int, int]] = []
    for i, doc in enumerate(docs):
        if out and out[-1][0] == doc:
            out[-1] = (doc, out[-1][1], i + 1)
        else:
            out.append((doc, i, i + 1))
    return out


def _padded(rows: list[torch.Tensor], width: int, fill: int) -> torch.Tensor:
    """1-D tensors -> (B, width), each padded with ``fill`` at the end."""
    out = torch.full((len(rows), width), fill, dtype=rows[0].dtype, device=rows[0].device)
    for b, row in enumerate(rows):
        out[b, : row.numel()] = row
    return out


def split_context(
    input_ids: torch.Tensor, doc_ids: torch.Tensor, context: torch.Tensor, pad_id: int
) -> ContextSplit:
    """input_ids, doc_ids, context (B, T) -> the two passes' inputs. ``context`` must mark a
    leading run of each conversation (its system prompt), as ``pack`` writes it."""
    t = input_ids.shape[1]
    # A context token after a non-context token of its own conversation: not a leading run.
    if (context[:, 1:] & ~context[:, :-1] & (doc_ids[:, 1:] == doc_ids[:, :-1])).any():
        raise ValueError("split_context: a conversation's context is not one leading run")
    positions = packed_positions(doc_ids)
    index = torch.arange(t, device=input_ids.device)
    prefix_at = [index[row] for row in context]
    suffix_at = [index[~row] for row in context]
    width_p = max(x.numel() for x in prefix_at)
    width_s = max(x.numel() for x in suffix_at)
    prefix_spans: Spans = []
    suffix_spans: ContextSpans = []
    for b in range(input_ids.shape[0]):
        prompts = {doc: (s, e) for doc, s, e in _runs(doc_ids[b, prefix_at[b]].tolist())}
        prefix_spans.append([(s, e) for s, e in prompts.values()])
        rest = [(*prompts.get(doc, (0, 0)), s, e) for doc, s, e in _runs(doc_ids[b, suffix_at[b]].tolist())]
        if prefix_at[b].numel() < width_p:  # padding: attends to itself
            prefix_spans[b].append((prefix_at[b].numel(), width_p))
        if suffix_at[b].numel() < width_s:
            rest.append((0, 0, suffix_at[b].numel(), width_s))
        suffix_spans.append(rest)
    rows = range(input_ids.shape[0])
    return ContextSplit(
        prefix_ids=_padded([input_ids[b, prefix_at[b]] for b in rows], width_p, pad_id),
        prefix_positions=_padded([positions[b, prefix_at[b]] for b in rows], width_p, 0),
        prefix_spans=prefix_spans,
        suffix_ids=_padded([input_ids[b, suffix_at[b]] for b in rows], width_s, pad_id),
        suffix_positions=_padded([positions[b, suffix_at[b]] for b in rows], width_s, 0),
        suffix_spans=suffix_spans,
        suffix_index=_padded(suffix_at, width_s, t),
    )


def context_cache(model: torch.nn.Module, split: ContextSplit) -> object:
    """Pass 1: the system prompts forward without gradients; their keys and values (a transformers
    ``Cache``) for the rest of the row to attend to."""
    with torch.no_grad():
        cache = model(
            input_ids=split.prefix_ids,
            position_ids=split.prefix_positions,
            spans=split.prefix_spans,
            use_cache=True,
            logits_to_keep=1,  # the prompts' logits are not needed
        ).past_key_values
    if cache is None:  # config/job.py refuses what drops it (gradient checkpointing)
        raise RuntimeError("lora.frozen_context: the model returned no KV cache for the system prompts")
    return cache
