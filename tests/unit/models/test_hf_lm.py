"""The Hugging Face models' FLOPs for MFU: model FLOPs over the matmul weights."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hpcpipe.models.hf_lm import param_counts


@pytest.mark.parametrize("tied", [True, False])
def test_an_untied_input_embedding_is_a_lookup_and_recomputation_is_not_credited(tied: bool) -> None:
    """Counting every parameter and 2N more under gradient checkpointing overstated MFU (a third
    more when checkpointing slowed training; Qwen2-7B's untied embedding is 7% of it)."""
    cfg = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    for name, p in model.named_parameters():
        p.requires_grad_("layers.1" in name)  # a frozen base with some trainable weights
    counts = param_counts(model)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert (counts.frozen, counts.trainable) == (frozen, trainable)
    lookup = 0 if tied else 128 * 32  # the LM head's own matmul weight stays counted
    assert counts.training_flops_per_token() == 4.0 * (frozen - lookup) + 6.0 * trainable
