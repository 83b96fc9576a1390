"""SmolLM2's GGUF file de-quantised once (``models/gguf_cache.py``): the kept copy gives the same
logits and the same chat tokens as the file, adapters still name the file's directory, and the
second load reads the copy instead of de-quantising again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hpcpipe.models.hf_lm import ModelSource, load_base_model, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / "data" / "external" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not GGUF.is_file(), reason="no SmolLM2 GGUF: run `make fc-assets`"),
]

CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_the_kept_copy_is_the_files_model_and_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = ModelSource(str(GGUF.parent), GGUF.name, cache_dir=str(tmp_path / "models"))
    from_file, tok_file = load_base_model(source, "fp32"), load_tokenizer(source)
    assert list((tmp_path / "models").glob("gguf-*/model/config.json"))
    assert list((tmp_path / "models").glob("gguf-*/tokenizer/tokenizer_config.json"))

    import transformers

    for auto in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        monkeypatch.setattr(auto, "from_pretrained", _refusing_gguf(auto.from_pretrained))
    kept, tok_kept = load_base_model(source, "fp32"), load_tokenizer(source)
    assert kept.config._name_or_path == str(GGUF.parent)  # what an adapter names as its base
    text = tok_file.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert tok_kept.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False) == text
    ids = tok_file(text)["input_ids"]
    assert tok_kept(text)["input_ids"] == ids
    assert (tok_kept.eos_token, tok_kept.pad_token) == (tok_file.eos_token, tok_file.pad_token)
    batch = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(from_file(batch).logits, kept(batch).logits)


def _refusing_gguf(load: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        assert "gguf_file" not in kwargs, "de-quantised the GGUF file again"
        return load(*args, **kwargs)

    return call
