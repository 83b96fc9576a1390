"""hpcpipe's GPT exported from a committed checkpoint: safetensors or a Hugging Face model.

The ``gpt`` recipe's ``export`` (its ``export_formats``: ``hf``, ``safetensors``). Both read the
checkpoint in one process without a process group (DCP reshards whatever world size wrote it into
one full model) through the safe reader (``checkpoint/safe_dcp.py``): exporting a checkpoint from
elsewhere runs none of its bytes. The caller verified every file against the manifest.

- ``safetensors``: ``model.safetensors`` holding hpcpipe's own state dict (the tied head is stored
  once; ``safetensors.torch.load_model(GPT(cfg, vocab), path)`` re-ties it), with the model
  config, vocabulary size and step in the file's metadata.
- ``hf``: a directory ``transformers.AutoModelForCausalLM.from_pretrained`` loads: GPT-2
  (``GPT2LMHeadModel``) for ``model.variant=gpt2``, Llama (``LlamaForCausalLM``) for ``llama``,
  names mapped as tabled in ``hpcpipe.models.gpt`` (GPT-2's Conv1D weights transposed, Llama's
  fused q/k/v split), plus the run's ``tokenizer.json`` when its prepared dataset can be found.

The vocabulary size comes from the checkpoint itself (``model.vocab_size`` may be null, meaning
"the tokenizer's").
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import torch

from hpcpipe.checkpoint.deepspeed_io import is_deepspeed_checkpoint
from hpcpipe.checkpoint.manifest import CheckpointError, read_manifest
from hpcpipe.checkpoint.safe_dcp import SafeFileSystemReader, load_state_safely
from hpcpipe.config import ModelConfig
from hpcpipe.layout import RunLayout
from hpcpipe.models.gpt import GPT, mlp_hidden

__all__ = ["export_gpt", "hf_config", "hf_state_dict", "load_gpt"]


def export_gpt(
    ckpt: Path,
    fmt: str,
    out: Path,
    model_cfg: ModelConfig,
    prepared_dir: str,
    run_dir: Path,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write the verified checkpoint ``ckpt`` of a ``gpt`` run as ``fmt`` into ``out``, its
    weights in ``dtype`` (the checkpoint's fp32 master weights, rounded once)."""
    model = load_gpt(ckpt, model_cfg)
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "safetensors":
        _write_safetensors(model.to(dtype), out / "model.safetensors", read_manifest(ckpt).step)
    else:
        _write_hf(model, prepared_dir, run_dir, out, dtype)
    return out


def load_gpt(ckpt: Path, model_cfg: ModelConfig) -> GPT:
    """A full ``GPT`` on CPU with the checkpoint's weights (any saving world size or strategy)."""
    if is_deepspeed_checkpoint(ckpt):
        return _load_gpt_deepspeed(ckpt, model_cfg)
    metadata = SafeFileSystemReader(ckpt).read_metadata()
    entry = metadata.state_dict_metadata.get("model.tok_emb.weight")
    if entry is None or not hasattr(entry, "size"):
        raise CheckpointError(f"{ckpt}: no model.tok_emb.weight: not a checkpoint of the gpt recipe")
    model = GPT(model_cfg, vocab_size=int(entry.size[0]))
    state = model.state_dict()  # tensors share storage with the parameters: loaded in place
    load_state_safely(ckpt, {"model": state}, "does not fit the run's model config")
    model.eval()
    return model


def _load_gpt_deepspeed(ckpt: Path, model_cfg: ModelConfig) -> GPT:
    """The same from a DeepSpeed checkpoint: its shards consolidated by DeepSpeed's zero_to_fp32."""
    from hpcpipe.checkpoint.deepspeed_io import consolidated_state_dict

    full = consolidated_state_dict(ckpt)
    embedding = full.get("tok_emb.weight")
    if embedding is None:
        raise CheckpointError(f"{ckpt}: no tok_emb.weight: not a checkpoint of the gpt recipe")
    model = GPT(model_cfg, vocab_size=int(embedding.shape[0]))
    missing, _ = model.load_state_dict(full, strict=False)
    if missing:
        raise CheckpointError(f"{ckpt}: does not fit the run's model config ({missing[0]} is not in it)")
    model.eval()
    return model


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face names (GPT-2 or Llama, from the model's variant)."""
    ours = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    if model.cfg.variant == "gpt2":
        ours = _fuse_qkv(ours)
    mapper = _gpt2_names if model.cfg.variant == "gpt2" else _llama_names
    out: dict[str, torch.Tensor] = {}
    for name, tensor in ours.items():
        out.update(mapper(name, tensor))
    return out


def _fuse_qkv(ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """GPT-2 keeps q, k and v in one ``c_attn``: ``blocks.i.attn.{q,k,v}.<p>`` -> one
    ``blocks.i.attn.qkv.<p>``, the three concatenated along the output dimension (3C rows)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in ours.items():
        head, _, param = name.rpartition(".")
        if head.endswith(".attn.q"):
            stem = head[: -len(".q")]
            parts = [ours[f"{stem}.{p}.{param}"] for p in "qkv"]
            out[f"{stem}.qkv.{param}"] = torch.cat(parts, dim=0)
        elif not head.endswith((".attn.k", ".attn.v")):
            out[name] = tensor
    return out


def _gpt2_names(name: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """One hpcpipe GPT-2 tensor -> its GPT2LMHeadModel name(s); Conv1D weights are (in, out)."""
    conv1d = {
        "attn.qkv": "attn.c_attn",
        "attn.proj": "attn.c_proj",
        "mlp.fc": "mlp.c_fc",
        "mlp.proj": "mlp.c_proj",
    }
    if name in ("tok_emb.weight", "pos_emb.weight"):
        return {f"transformer.{'wte' if name.startswith('tok') else 'wpe'}.weight": t}
    if name == "lm_head.weight":
        return {"lm_head.weight": t}
    if name.startswith("ln_f."):
        return {f"transformer.{name}": t}
    _, index, rest = name.split(".", 2)  # blocks.i.<rest>
    module, param = rest.rsplit(".", 1)
    if module in conv1d:
        value = t.t().contiguous() if param == "weight" else t
        return {f"transformer.h.{index}.{conv1d[module]}.{param}": value}
    return {f"transformer.h.{index}.{rest}": t}  # ln_1.*, ln_2.*


def _llama_names(name: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """One hpcpipe Llama-style tensor -> its LlamaForCausalLM name."""
    simple = {
        "tok_emb.weight": "model.embed_tokens.weight",
        "ln_f.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight",
    }
    if name in simple:
        return {simple[name]: t}
    _, index, rest = name.split(".", 2)
    layer = f"model.layers.{index}"
    renames = {
        "attn.q.weight": "self_attn.q_proj.weight",  # heads in HF's order: no permutation needed
        "attn.k.weight": "self_attn.k_proj.weight",
        "attn.v.weight": "self_attn.v_proj.weight",
        "ln_1.weight": "input_layernorm.weight",
        "ln_2.weight": "post_attention_layernorm.weight",
        "attn.proj.weight": "self_attn.o_proj.weight",
        "mlp.gate.weight": "mlp.gate_proj.weight",
        "mlp.up.weight": "mlp.up_proj.weight",
        "mlp.down.weight": "mlp.down_proj.weight",
    }
    return {f"{layer}.{renames[rest]}": t}


def hf_config(cfg: ModelConfig, vocab_size: int, eos_id: int | None) -> Any:
    """The ``transformers`` config equivalent to ``cfg`` (dropout 0: exports are for inference)."""
    from transformers import GPT2Config, LlamaConfig

    if cfg.variant == "gpt2":
        return GPT2Config(
            vocab_size=vocab_size,
            n_positions=cfg.seq_len,
            n_embd=cfg.d_model,
            n_layer=cfg.n_layers,
            n_head=cfg.n_heads,
            n_inner=mlp_hidden(cfg),
            activation_function="gelu_new",
            layer_norm_epsilon=cfg.norm_eps,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            tie_word_embeddings=True,
            bos_token_id=eos_id,
            eos_token_id=eos_id,
        )
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=mlp_hidden(cfg),
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.d_model // cfg.n_heads,
        max_position_embeddings=cfg.seq_len,
        rms_norm_eps=cfg.norm_eps,
        **_rope_kwargs(cfg),
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
    )


def _rope_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    """``rope_theta``: transformers 5 turns the keyword into ``rope_parameters``; 4.x keeps it."""
    return {"rope_theta": cfg.rope_theta}


def _write_hf(model: GPT, prepared_dir: str, run_dir: Path, out: Path, dtype: torch.dtype) -> None:
    from transformers import GPT2LMHeadModel, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a CLI verb prints one result line, not shard bars

    dataset = _prepared_dataset(prepared_dir, run_dir)
    eos_id = int(dataset["eos_id"]) if dataset and dataset["eos_id"] is not None else None
    config = hf_config(model.cfg, model.vocab_size, eos_id)
    hf_cls = GPT2LMHeadModel if model.cfg.variant == "gpt2" else LlamaForCausalLM
    hf_model = hf_cls(config)
    missing, unexpected = hf_model.load_state_dict(hf_state_dict(model), strict=False)
    # The tied head is one tensor; buffers such as GPT-2's causal mask are not weights.
    weights = {name for name, _ in hf_model.named_parameters()}
    if unexpected or any(name in weights for name in missing):
        raise CheckpointError(f"HF export: names did not map (missing {missing}, unexpected {unexpected})")
    hf_model.eval()
    torch.nn.Module.to(hf_model, dtype)  # (transformers wraps .to in a decorator mypy misreads)
    hf_model.save_pretrained(out)  # config.json records the dtype
    if dataset and dataset.get("tokenizer"):
        shutil.copyfile(dataset["tokenizer"], out / "tokenizer.json")


def _prepared_dataset(prepared_dir: str, run_dir: Path) -> dict[str, Any] | None:
    """The run's prepared dataset (eos id, tokenizer.json path), found through the run's
    ``lineage.json`` dataset hash under ``data.prepared_dir``; None when it cannot be found."""
    lineage = RunLayout(run_dir).lineage
    prepared = Path(prepared_dir)
    if not lineage.is_file() or not prepared.is_dir():
        return None
    wanted = json.loads(lineage.read_text()).get("dataset_manifest_sha256")
    for manifest in sorted(prepared.glob("*/manifest.json")):
        raw = manifest.read_bytes()
        if wanted and hashlib.sha256(raw).hexdigest() == wanted:
            eos_id = json.loads(raw).get("tokenizer", {}).get("eos_id")
            tokenizer = manifest.parent / "tokenizer.json"
            return {"eos_id": eos_id, "tokenizer": tokenizer if tokenizer.is_file() else None}
    return None


def _write_safetensors(model: GPT, path: Path, step: int) -> None:
    from safetensors.torch import save_model

    metadata = {
        "format": "pt",
        "hpcpipe.model_config": json.dumps(model.cfg.model_dump(mode="json"), sort_keys=True),
        "hpcpipe.vocab_size": str(model.vocab_size),
        "hpcpipe.step": str(step),
    }
    save_model(model, str(path), metadata=metadata)
