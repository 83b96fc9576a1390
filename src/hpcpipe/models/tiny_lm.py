"""``@tiny-llama``: a 2-layer random Llama and a byte-level BPE tokenizer trained on given texts.

Tests and the ``lora-fc-tiny`` preset need a real transformers model directory without a hub:
this writes one (``config.json``, ``model.safetensors``, ``tokenizer.json``...) that
``AutoModelForCausalLM`` / ``AutoTokenizer`` load like any other. It has no chat template on
purpose, so hpcpipe's own documented template is exercised. Same texts and seed, same directory
contents.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import torch

from hpcpipe.fsutil import atomic_replace_dir

TINY_NAME = "@tiny-llama"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_VOCAB = 4096


def default_tiny_dir(root: Path) -> Path:
    """The tiny model of a fixed text sample (not a run's data): every run and rank finds the same."""
    from hpcpipe.data.fc_gen import generate_glaive_rows

    texts = [row["system"] + "\n" + row["chat"] for row in generate_glaive_rows(600, seed=0)]
    return tiny_llama_dir(root, texts, seed=0)


def tiny_llama_dir(root: Path, texts: Sequence[str], seed: int) -> Path:
    """Build (once) the tiny model for ``texts`` under ``root``; returns its directory."""
    digest = hashlib.sha256(f"{seed}\0{_VOCAB}\0".encode() + "\0".join(texts).encode()).hexdigest()[:16]
    out = root / f"tiny-llama-{digest}"
    if (out / "model.safetensors").is_file():
        return out
    with atomic_replace_dir(out) as tmp:
        _write_tokenizer(texts, tmp)
        _write_model(tmp, seed)
    return out


def _write_tokenizer(texts: Sequence[str], out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.save_pretrained(out)


def _write_model(out: Path, seed: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=_VOCAB,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        eos_token_id=2,
        pad_token_id=0,
        bos_token_id=None,
    )
    from hpcpipe.models.hf_quiet import quiet_hf

    torch.manual_seed(seed)
    with quiet_hf():
        LlamaForCausalLM(config).save_pretrained(out)
