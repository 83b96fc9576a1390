"""Packed attention by spans (models/packed_attention.py): each conversation of a packed row attends
within its own span, with the outputs and gradients of the block-diagonal mask it replaces."""

from __future__ import annotations

import torch
from tests.helpers import tiny_llama

from hpcpipe.data.function_calling.pack import PAD_DOC
from hpcpipe.models.packed_attention import PACKED, document_spans, packed_positions
from hpcpipe.recipes.lora_fc_loss import packed_attention


def _model(implementation: str) -> torch.nn.Module:
    return tiny_llama(packed=implementation == PACKED)


DOCS = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, PAD_DOC, PAD_DOC], [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]])
IDS = torch.randint(0, 64, DOCS.shape, generator=torch.Generator().manual_seed(1))


def test_spans_cover_each_row_one_run_per_conversation() -> None:
    assert document_spans(DOCS) == [[(0, 3), (3, 7), (7, 8), (8, 10)], [(0, 5), (5, 10)]]
    assert document_spans(torch.zeros(1, 4, dtype=torch.long)) == [[(0, 4)]]
    assert packed_positions(DOCS).tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 0, 1], [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]]


def test_spans_give_each_conversation_the_logits_it_has_alone() -> None:
    model = _model(PACKED)
    with torch.no_grad():
        packed = model(IDS, position_ids=packed_positions(DOCS), spans=document_spans(DOCS)).logits
        for row, spans in enumerate(document_spans(DOCS)):
            for s, e in spans:
                if DOCS[row, s] == PAD_DOC:
                    continue
                alone = model(IDS[row : row + 1, s:e]).logits  # no spans: the SDPA path, causal
                torch.testing.assert_close(packed[row : row + 1, s:e], alone, rtol=1e-5, atol=1e-5)


def test_spans_and_the_mask_they_replace_agree_in_loss_and_gradients() -> None:
    real = (
        DOCS != PAD_DOC
    )  # padding outputs differ (attend to themselves only, or causally) and are never read
    results = []
    for implementation in ("sdpa", PACKED):
        model = _model(implementation).train()
        if implementation == PACKED:
            out = model(IDS, position_ids=packed_positions(DOCS), spans=document_spans(DOCS))
        else:
            mask, positions = packed_attention(DOCS)
            out = model(IDS, attention_mask=mask, position_ids=positions)
        loss = out.logits[real].logsumexp(-1).mean()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), grads))
    (loss_mask, grads_mask), (loss_spans, grads_spans) = results
    torch.testing.assert_close(loss_spans, loss_mask, rtol=1e-5, atol=1e-5)
    assert grads_mask.keys() == grads_spans.keys() and len(grads_mask) > 10
    for name, grad in grads_mask.items():
        torch.testing.assert_close(grads_spans[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_without_spans_the_packed_model_is_transformers_sdpa() -> None:
    """Generation and callers with a mask of their own see no difference."""
    mask, positions = packed_attention(DOCS)
    with torch.no_grad():
        ours = _model(PACKED)(IDS, attention_mask=mask, position_ids=positions).logits
        theirs = _model("sdpa")(IDS, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(ours, theirs)


def test_a_packed_model_generates_like_sdpa() -> None:
    prompt = IDS[:1, :5]
    kwargs = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0, "use_cache": True}
    with torch.no_grad():
        ours = _model(PACKED).generate(prompt, **kwargs)
        theirs = _model("sdpa").generate(prompt, **kwargs)
    assert ours.tolist() == theirs.tolist()
