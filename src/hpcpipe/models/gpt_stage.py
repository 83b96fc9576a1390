"""One pipeline stage of the GPT: a contiguous run of its blocks, with the embedding on the first
stage and the final norm and LM head on the last.

The stage holds the full model's own modules under the full model's names (``tok_emb``,
``blocks.<i>``, ``ln_f``, ``lm_head``), so its parameter names are the full model's: a checkpoint
written by stages loads into one process and back. Built by the recipe
(``GPTRecipe.pipeline_stage``) for the trainer's pipeline (``train/pipeline_parallel.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hpcpipe.models.gpt import GPT, embed, rope_of


class GPTStage(nn.Module):
    """Token ids (B, T) on the first stage, hidden states (B, T, C) after it -> hidden states, or
    logits (B, T, V) on the last stage."""

    def __init__(self, model: GPT, blocks: Sequence[int], first: bool, last: bool) -> None:
        super().__init__()
        self.tok_emb = model.tok_emb if first else None
        self.pos_emb = model.pos_emb if first else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in blocks})
        self.ln_f = model.ln_f if last else None
        self.lm_head = model.lm_head if last else None
        rope = rope_of(model)
        if rope is not None:  # the same tables, not in the state dict (as in the GPT)
            self.register_buffer("rope_cos", rope[0], persistent=False)
            self.register_buffer("rope_sin", rope[1], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_emb is not None:
            x = embed(self.tok_emb, self.pos_emb, x)  # (B, T) ids -> (B, T, C)
        rope = rope_of(self)
        for block in self.blocks.values():
            x = block(x, rope)  # (B, T, C)
        if self.lm_head is not None:
            assert self.ln_f is not None
            x = self.lm_head(self.ln_f(x))  # (B, T, V)
        return x
