"""The Hugging Face models' FLOPs for MFU: model FLOPs over the matmul weights; a model that cannot
be read is one line naming it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hpcpipe.errors import ConfigError
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


@pytest.mark.parametrize("content", [b"junk\n", b"GGUF\x03\x00\x00\x00\x05\x00"])  # no magic; truncated
def test_a_file_that_is_no_gguf_model_is_one_line_naming_it(tmp_path: Path, content: bytes) -> None:
    """transformers' GGUF reader raises ValueError (no magic bytes) or struct.error (truncated):
    only OSError was caught, so both were tracebacks."""
    from hpcpipe.models.hf_lm import ModelSource, load_base_model, load_tokenizer

    (tmp_path / "bad.gguf").write_bytes(content)
    source = ModelSource(str(tmp_path), "bad.gguf")
    named = re.escape(f"model.gguf_file: cannot load a tokenizer from {tmp_path / 'bad.gguf'} (")
    with pytest.raises(ConfigError, match=named):
        load_tokenizer(source)
    with pytest.raises(ConfigError, match=re.escape(f"cannot load {tmp_path / 'bad.gguf'} (")):
        load_base_model(source, "fp32")


def test_a_model_directory_without_a_tokenizer_is_one_line_naming_it(tmp_path: Path) -> None:
    from hpcpipe.models.hf_lm import ModelSource, load_tokenizer

    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ConfigError, match=f"model.name_or_path: cannot load a tokenizer from {tmp_path} "):
        load_tokenizer(ModelSource(str(tmp_path), None))
