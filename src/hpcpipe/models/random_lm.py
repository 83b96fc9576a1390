"""``@random:<shape>``: a Hugging Face causal LM of a real architecture's shape with random weights.

For throughput measurements of models whose weights are not on the machine (the seed's
Qwen2-7B-Instruct on a GPU node without a hub): the directory holds ``config.json`` and the
``@tiny-llama`` tokenizer (ids < 4096 are valid for any of these vocabularies), no weights; the
weights are initialised from the config with a fixed seed, so every rank and every export build
the same base. Throughput depends on the shape, not on the values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpcpipe.errors import ConfigError
from hpcpipe.fsutil import atomic_replace_dir

RANDOM_PREFIX = "@random:"

# Public config.json values of the real models; `qwen2-tiny` is the same architecture at test size.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2-7b": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    },
    "qwen2-tiny": {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
        "max_position_embeddings": 4096,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    },
}


def random_model_dir(name: str, root: Path) -> Path:
    """``@random:<shape>`` -> a directory with the shape's config.json and a tokenizer."""
    from hpcpipe.models.tiny_lm import default_tiny_dir

    shape = name.removeprefix(RANDOM_PREFIX)
    if shape not in SHAPES:
        raise ConfigError(f"model.name_or_path: unknown shape {name} (known: {', '.join(sorted(SHAPES))})")
    out = root / f"random-{shape}"
    if (out / "config.json").is_file():
        return out
    tiny = default_tiny_dir(root)
    with atomic_replace_dir(out) as tmp:
        for file in tiny.iterdir():
            if file.name.startswith(("tokenizer", "special_tokens")) or file.suffix == ".jinja":
                (tmp / file.name).write_bytes(file.read_bytes())
        config = {**SHAPES[shape], "eos_token_id": 2, "pad_token_id": 0, "use_cache": False}
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
