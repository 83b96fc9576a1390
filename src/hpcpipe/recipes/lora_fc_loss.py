"""The loss of the ``lora-function-calling`` recipe, on logits at supervised positions: which
targets open an assistant turn (where the model decides between a call and text), which of those
open a turn without a call, and the weighted mean over them; and the packed attention mask of the
raw loop in ``benchmarks/lora_overhead.py``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from hpcpipe.data.function_calling.tokens import IGNORE


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


def supervised_logits(
    model: nn.Module,
    batch: tuple[torch.Tensor, ...],
    call_open: Sequence[int],
    frozen_context: bool,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits (B, K, V) at the K positions that predict a supervised token; their targets (B, K);
    which of those targets open an assistant turn (B, K), where the model decides between a call
    and text; and which open a turn that makes no call (B, K). With ``frozen_context`` the system
    prompts run first without gradients (``lora.frozen_context``)."""
    from hpcpipe.models.packed_attention import document_spans, packed_positions

    input_ids, labels, doc_ids, context = batch  # (B, T) each
    targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE)  # (B, T): position t predicts token t+1
    opens = opening_targets(targets)  # (B, T)
    text_opens = text_openings(targets, opens, call_open)  # (B, T)
    if frozen_context and context.any():
        return _logits_after_context(model, batch, targets, opens, text_opens, pad_id)
    keep = _kept(targets)  # (K,)
    out = model(
        input_ids=input_ids,
        position_ids=packed_positions(doc_ids),
        spans=document_spans(doc_ids),  # each conversation attends within its own span
        logits_to_keep=keep,
    )
    return out.logits, targets[:, keep], opens[:, keep], text_opens[:, keep]


def _logits_after_context(
    model: nn.Module,
    batch: tuple[torch.Tensor, ...],
    targets: torch.Tensor,
    opens: torch.Tensor,
    text_opens: torch.Tensor,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``supervised_logits`` with the system prompts run first without gradients
    (models/context_split.py); targets, opens and text_opens (B, T) in the row's order."""
    from hpcpipe.models.context_split import context_cache, split_context

    input_ids, _, doc_ids, context = batch
    split = split_context(input_ids, doc_ids, context, pad_id)
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
