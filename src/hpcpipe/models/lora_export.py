"""LoRA exports: the adapter alone (peft format) and the merged model (adapter folded in).

``full_adapter_state`` gathers every adapter tensor in full on *every* rank (FSDP2 shards them;
``full_state_dict`` without CPU offload all-gathers to all ranks), so whichever rank writes holds
real values. Saving a sharded model through peft's own ``save_pretrained`` would write each
rank's shard, or empty tensors, and an all-zero ``lora_B`` that loads silently as "no adapter".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpcpipe.models.hf_lm import DTYPES, ModelSource, load_base_model
from hpcpipe.models.hf_quiet import quiet_hf

__all__ = ["full_adapter_state", "load_with_adapter", "save_adapter", "save_merged"]


def full_adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Trainable (adapter) tensors, unsharded, on CPU; call on every rank (collective under FSDP2
    and DeepSpeed ZeRO-3)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if any(hasattr(p, "ds_id") for _, p in trainable):
        return _gathered_zero3(trainable)

    options = StateDictOptions(full_state_dict=True, ignore_frozen_params=True)
    state = get_model_state_dict(model, options=options)
    return {
        key: value.detach().to("cpu", torch.float32)
        for key, value in state.items()
        if isinstance(value, torch.Tensor)
    }


def _gathered_zero3(params: list[tuple[str, nn.Parameter]]) -> dict[str, torch.Tensor]:
    """ZeRO-3 keeps 1/world of each large parameter per rank (``ds_id`` marks them): gather the
    adapters whole for the copy (every rank), then give the memory back."""
    import deepspeed

    with deepspeed.zero.GatheredParameters([p for _, p in params]):
        return {name: p.detach().to("cpu", torch.float32, copy=True) for name, p in params}


def peft_model_of(model: nn.Module) -> Any:
    from peft import PeftModel

    inner = model.module if hasattr(model, "module") and isinstance(model.module, PeftModel) else model
    if not isinstance(inner, PeftModel):
        raise TypeError(f"expected a peft model, got {type(model).__name__}")
    return inner


def save_adapter(model: nn.Module, state: dict[str, torch.Tensor], out: Path, tokenizer: Any = None) -> Path:
    """``adapter_config.json`` + ``adapter_model.safetensors`` from the gathered ``state``."""
    out.mkdir(parents=True, exist_ok=True)
    with quiet_hf():
        peft_model_of(model).save_pretrained(out, state_dict=state, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def load_with_adapter(source: ModelSource, adapter_dir: Path, base_dtype: str = "fp32") -> nn.Module:
    """The base from ``source`` with the saved adapter applied (peft ``PeftModel.from_pretrained``)."""
    from peft import PeftModel

    base = load_base_model(source, base_dtype)
    with quiet_hf():
        return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=False)


def write_lora_export(model: nn.Module, fmt: str, out: Path, dtype: str, tokenizer: Any = None) -> Path:
    """A peft model with its trained adapters loaded, on the CPU in fp32: ``adapter`` writes the
    peft adapter directory (its weights in ``dtype``), anything else (``merged``, ``hf``) the
    merged model in ``dtype``."""
    if fmt == "adapter":
        state = {name: p.data.to(DTYPES[dtype]) for name, p in model.named_parameters() if p.requires_grad}
        return save_adapter(model, state, out, tokenizer)
    return save_merged(model, out, dtype, tokenizer)


def save_merged(model: nn.Module, out: Path, dtype: str, tokenizer: Any = None) -> Path:
    """A plain transformers model directory with the adapter folded into the base weights.

    Give it an fp32 peft model: the merge runs in fp32 (W + B @ A * alpha / r) and only the
    result is cast to ``dtype``. The peft model is consumed (its modules are replaced).
    """
    return save_model_dir(peft_model_of(model).merge_and_unload(), out, dtype, tokenizer)


def save_model_dir(model: nn.Module, out: Path, dtype: str, tokenizer: Any = None) -> Path:
    """``model`` (a transformers model) in ``dtype`` as a directory ``from_pretrained`` loads,
    with the tokenizer beside it."""
    model = model.to(DTYPES[dtype])
    model.config.use_cache = True  # type: ignore[union-attr]
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)  # type: ignore[operator]
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out
