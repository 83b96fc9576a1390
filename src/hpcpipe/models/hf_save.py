"""A transformers model written as a plain directory, without ``save_pretrained``."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_plain_model(model: Any, out: Path) -> None:
    """``model`` as a plain transformers directory (config.json, model.safetensors) without
    ``save_pretrained``: that refuses a model de-quantised from GGUF (its quantizer says "not
    serializable", though its weights are ordinary tensors by now), and with accelerate and
    DeepSpeed installed it imports DeepSpeed to unwrap the model (about 2 s of CPU each time)."""
    from safetensors.torch import save_model

    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the copy is plain fp32 weights
    type(model.config).from_dict(config).save_pretrained(out)
    save_model(model, str(out / "model.safetensors"))  # tied embeddings stored once
