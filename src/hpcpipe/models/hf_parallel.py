"""A tensor-parallel plan for Llama-family Hugging Face models, by module name (torchtitan's split).

Llama, Mistral, Qwen2 and SmolLM name their layers the same way: ``self_attn.{q,k,v,o}_proj`` and
``mlp.{gate,up,down}_proj`` in each decoder layer, ``embed_tokens`` and ``lm_head`` around them.
q, k, v, gate and up are split column-wise (each rank computes its heads and its part of the MLP:
transformers reshapes with ``-1`` heads, so a rank's shard is read as H/tp heads), o and down
row-wise (their partial outputs all-reduced). The embedding is split by vocabulary rows and the
LM head by the same rows (so a tied pair stays one tensor); the logits are all-gathered. Norms
stay replicated: every rank sees the full sequence (no sequence parallelism here: a decoder
layer takes its hidden states as a keyword, which the plan would have to name per model).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from hpcpipe.errors import ConfigError

ATTENTION = ("q_proj", "k_proj", "v_proj")
MLP_IN = ("gate_proj", "up_proj")


def llama_family_plan(model: nn.Module, layers: list[nn.Module], tp: int) -> dict[str, Any]:
    """Module name -> parallel style for ``model`` over ``tp`` ranks; ConfigError when the model is
    not Llama-shaped or ``tp`` does not divide its heads and MLP width."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    _check_divisors(getattr(model, "config", None), tp)
    names = {module: name for name, module in model.named_modules()}
    embedding = getattr(model, "get_input_embeddings", lambda: None)()
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if embedding not in names or head not in names:
        raise ConfigError("parallel.tp: the model has no input embedding and LM head to split")
    plan: dict[str, Any] = {
        names[embedding]: RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        names[head]: ColwiseParallel(output_layouts=Replicate()),
    }
    for layer in layers:
        prefix = names[layer]
        for part, styles in (("self_attn", {**dict.fromkeys(ATTENTION, "col"), "o_proj": "row"}),
                             ("mlp", {**dict.fromkeys(MLP_IN, "col"), "down_proj": "row"})):  # fmt: skip
            for leaf, kind in styles.items():
                name = f"{prefix}.{part}.{leaf}"
                if not isinstance(_get(model, name), nn.Linear):
                    raise ConfigError(
                        f"parallel.tp: {name} is not a Linear: the model is not Llama-shaped (q/k/v/o_proj, "
                        "gate/up/down_proj), so hpcpipe has no tensor-parallel plan for it"
                    )
                plan[name] = ColwiseParallel() if kind == "col" else RowwiseParallel()
    return plan


def _check_divisors(config: Any, tp: int) -> None:
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, key, None)
        if value is not None and value % tp:
            raise ConfigError(f"parallel.tp={tp} must divide the model's {key} ({value})")


def _get(model: nn.Module, name: str) -> nn.Module | None:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None
