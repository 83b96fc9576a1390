"""The GPT's tensor-parallel plan, by module name (Megatron-LM's split, torchtitan's spelling).

Within each block, with ``tp`` ranks:

- attention: q, k, v column-wise (each rank computes H/tp whole heads), ``proj`` row-wise (the
  partial outputs are summed); MLP: ``fc`` (or ``gate`` and ``up``) column-wise, ``proj`` (or
  ``down``) row-wise. Two collectives per block forward, none inside attention or the MLP.
- sequence parallel: between those regions the activations are split along the sequence (B, T/tp,
  C) instead of replicated, so the norms, dropout and residual adds run on 1/tp of the tokens and
  keep 1/tp of the activations. The dropout draws the whole sequence's mask on every rank and keeps
  its chunk (``models/shard_dropout.py``): the tp ranks share one random stream. The row-wise
  outputs are reduce-scattered into that layout and all-gathered again at the next region's
  input: the same bytes as an all-reduce.
- the token embedding is split by vocabulary rows and the LM head, tied to it, by the same rows
  (column-wise over its (V, C) weight); the logits are all-gathered for the loss. The position
  table (gpt2) is split by positions, so each rank adds its own sequence chunk's rows.

Sequence parallelism needs ``seq_len`` divisible by ``tp``: ``GPT.sequence_multiple`` pads the
contexts of generation to a multiple on the right, which a causal model never looks at.
"""

from __future__ import annotations

from typing import Any

from hpcpipe.config import ModelConfig
from hpcpipe.errors import ConfigError
from hpcpipe.models.gpt import mlp_hidden
from hpcpipe.models.shard_dropout import ShardDropout


def check_tensor_parallel(cfg: ModelConfig, tp: int) -> None:
    """ConfigError naming the key that ``tp`` does not divide."""
    for key, value in (
        ("model.n_heads", cfg.n_heads),
        ("model.n_kv_heads", cfg.kv_heads),
        ("the MLP width (model.ffn_mult x model.d_model)", mlp_hidden(cfg)),
        ("model.seq_len (sequence parallelism)", cfg.seq_len),
    ):
        if value % tp:
            raise ConfigError(f"parallel.tp={tp} must divide {key} ({value})")


def gpt_tensor_parallel_plan(cfg: ModelConfig, tp: int) -> dict[str, Any]:
    """Module name -> parallel style for ``hpcpipe.models.gpt.GPT`` of ``cfg`` over ``tp`` ranks."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    check_tensor_parallel(cfg, tp)
    sequence = Shard(1)  # (B, T/tp, C) between the blocks' parallel regions
    plan: dict[str, Any] = {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=sequence),
        "ln_f": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=sequence, output_layouts=Replicate()),
    }
    if cfg.variant == "gpt2":  # (T, C) rows by position: each rank adds its chunk's rows
        plan["pos_emb"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0))
    mlp_in, mlp_out = (("fc",), "proj") if cfg.variant == "gpt2" else (("gate", "up"), "down")
    for i in range(cfg.n_layers):
        block = f"blocks.{i}"
        plan[f"{block}.ln_1"] = SequenceParallel()
        plan[f"{block}.ln_2"] = SequenceParallel()
        plan[f"{block}.drop"] = ShardDropout(dim=1)  # on the residual branches' (B, T/tp, C)
        # attn(x, rope): x all-gathered to the full sequence; rope tables are plain and replicated.
        plan[f"{block}.attn"] = PrepareModuleInput(
            input_layouts=(sequence, None), desired_input_layouts=(Replicate(), None)
        )
        for name in ("q", "k", "v"):
            plan[f"{block}.attn.{name}"] = ColwiseParallel()
        plan[f"{block}.attn.proj"] = RowwiseParallel(output_layouts=sequence)
        plan[f"{block}.mlp"] = PrepareModuleInput(
            input_layouts=(sequence,), desired_input_layouts=(Replicate(),)
        )
        for name in mlp_in:
            plan[f"{block}.mlp.{name}"] = ColwiseParallel()
        plan[f"{block}.mlp.{mlp_out}"] = RowwiseParallel(output_layouts=sequence)
    return plan
