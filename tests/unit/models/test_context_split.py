"""Training with the system prompts as frozen context (models/context_split.py): the same forward
as one pass over the packed row, and the gradient of one pass whose prompt keys and values are
constants."""

from __future__ import annotations

import pytest
import torch
from tests.helpers import tiny_llama

from hpcpipe.data.function_calling.pack import PAD_DOC
from hpcpipe.models.context_split import context_cache, split_context
from hpcpipe.models.packed_attention import document_spans, packed_positions

# Two rows: conversations with prompts of 3, 2 and 0 tokens; padding at the end of the first.
DOCS = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 1, PAD_DOC], [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]])
CONTEXT = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
IDS = torch.randint(1, 64, DOCS.shape, generator=torch.Generator().manual_seed(3))
REAL = DOCS != PAD_DOC


def _model() -> torch.nn.Module:
    return tiny_llama(packed=True, train=True)


def _two_passes(model: torch.nn.Module) -> torch.Tensor:
    """Logits (B, T, V) in the row's order, the prompts run first without gradients."""
    split = split_context(IDS, DOCS, CONTEXT, pad_id=0)
    cache = context_cache(model, split)
    suffix = model(
        input_ids=split.suffix_ids,
        position_ids=split.suffix_positions,
        past_key_values=cache,
        context_spans=split.suffix_spans,
    ).logits
    logits = torch.zeros(*IDS.shape, suffix.shape[-1])
    for b in range(IDS.shape[0]):
        real = split.suffix_index[b] < IDS.shape[1]
        logits[b, split.suffix_index[b][real]] = suffix[b][real]
    return logits


def _one_pass(model: torch.nn.Module) -> torch.Tensor:
    return model(IDS, position_ids=packed_positions(DOCS), spans=document_spans(DOCS)).logits


def test_the_split_keeps_each_conversations_prompt_and_order() -> None:
    split = split_context(IDS, DOCS, CONTEXT, pad_id=0)
    assert split.prefix_ids.tolist() == [
        IDS[0, [0, 1, 2, 5, 6]].tolist(),
        [*IDS[1, [4, 5, 6]].tolist(), 0, 0],
    ]
    assert split.prefix_spans == [[(0, 3), (3, 5)], [(0, 3), (3, 5)]]  # row 2: its prompt, then padding
    assert split.suffix_index.tolist() == [[3, 4, 7, 8, 9, 10, 10], [0, 1, 2, 3, 7, 8, 9]]
    # conversation 0 of row 1 has no prompt: (0, 0); padding attends to itself
    assert split.suffix_spans == [[(0, 3, 0, 2), (3, 5, 2, 4), (0, 0, 4, 5), (0, 0, 5, 7)],
                                  [(0, 0, 0, 4), (0, 3, 4, 7)]]  # fmt: skip
    assert split.suffix_positions[0].tolist() == [3, 4, 2, 3, 0, 0, 0]  # positions as in the row


def test_two_passes_give_the_logits_of_one() -> None:
    model = _model().eval()
    with torch.no_grad():
        whole, split = _one_pass(model), _two_passes(model)
    torch.testing.assert_close(split[REAL & ~CONTEXT], whole[REAL & ~CONTEXT], rtol=1e-5, atol=1e-5)


def test_the_gradient_is_one_pass_with_the_prompts_keys_and_values_held_constant() -> None:
    def loss(logits: torch.Tensor) -> torch.Tensor:
        return logits[REAL & ~CONTEXT].logsumexp(-1).mean()

    def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    frozen = _model()
    loss(_two_passes(frozen)).backward()
    reference = _model()
    hooks = [  # k and v of the prompt tokens become constants; nothing else changes
        module.register_forward_hook(
            lambda _m, _args, out: torch.where(CONTEXT[..., None], out.detach(), out)
        )
        for name, module in reference.named_modules()
        if name.endswith(("k_proj", "v_proj"))
    ]
    loss(_one_pass(reference)).backward()
    for hook in hooks:
        hook.remove()
    got, want = grads(frozen), grads(reference)
    assert got.keys() == want.keys() and len(got) > 10
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    full = _model()
    loss(_one_pass(full)).backward()
    assert not torch.allclose(grads(full)["model.layers.0.self_attn.k_proj.weight"],
                              got["model.layers.0.self_attn.k_proj.weight"])  # fmt: skip


def test_context_that_is_not_one_leading_run_is_refused() -> None:
    broken = CONTEXT.clone()
    broken[0, 4] = True  # conversation 0 of row 0: context, a gap, context again
    broken[0, 3] = False
    broken[0, 2] = False
    with pytest.raises(ValueError, match="one leading run"):
        split_context(IDS, DOCS, broken, pad_id=0)
