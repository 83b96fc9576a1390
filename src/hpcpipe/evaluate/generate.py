"""Greedy generation of assistant turns, batched with left padding, stopping at end of turn."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn


@torch.no_grad()
def generate_replies(
    model: nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int,
    batch_size: int,
    on_batch: Callable[[int], None] | None = None,
) -> list[str]:
    """The decoded continuation of every prompt (special tokens removed), in the prompts' order."""
    model.eval()
    tokenizer.padding_side = "left"  # generation continues at the right edge of every row
    device = next(model.parameters()).device
    # Batches of similar lengths: BFCL's prompts run from ~200 to several thousand tokens, and
    # every row of a batch is padded to its longest.
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    replies: dict[int, str] = {}
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        chunk = [prompts[i] for i in index]
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        out = model.generate(  # type: ignore[operator]
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            # The KV cache: training turns it off in the model's config (hf_lm.load_base_model);
            # without it every new token re-runs the whole prefix (8x slower on SmolLM2 here).
            use_cache=True,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        new = out[:, enc["input_ids"].shape[1] :]  # (B, <= max_new_tokens)
        replies.update(zip(index, tokenizer.batch_decode(new, skip_special_tokens=True), strict=True))
        if on_batch is not None:
            on_batch(len(chunk))
    return [replies[i] for i in range(len(prompts))]
