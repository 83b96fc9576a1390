"""Greedy generation of assistant turns, batched with left padding, stopping at end of turn.

The end of a turn is the tokenizer's EOS and the token the chat template closes an assistant turn
with (``turn_end``): they differ where hpcpipe's own ChatML template (``<|im_end|>``) serves a
tokenizer whose EOS is ``<|endoftext|>``, or a template ends turns with ``<|eot_id|>``.

A reply's first token decides between a call and text: every call opens with the same token (the
first of ``<tool_call>``). ``CallDecision`` reads the probability of that token there for every
prompt, which says how sure the model was (``p_call`` in eval.json), and with a threshold makes
the decision by it: the opener where P >= threshold, any other token where P < threshold.
Only the first token: a reply that opens with text ("Sure, one moment.") may still write a call
after it, whatever its P(call); the committed evaluations have few (docs/function-calling-eval.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class CallDecision:
    """The call/no-call decision at the first token of each reply: read, and set by a threshold."""

    token: int  # the id of the token that opens every call
    threshold: float | None = None  # None: greedy decides (the argmax token)
    p_call: dict[int, float] = field(default_factory=dict)  # prompt index -> P(opener at token 1)

    def processor(self, index: Sequence[int], prompt_length: int) -> Callable[..., torch.Tensor]:
        """A logits processor for one batch of ``generate`` (prompts ``index``, left-padded to
        ``prompt_length``): acts on the first generated position only."""

        def process(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if input_ids.shape[1] != prompt_length:
                return scores
            p = scores.float().softmax(dim=-1)[:, self.token]  # (B,)
            self.p_call.update(zip(index, p.tolist(), strict=True))
            if self.threshold is None:
                return scores
            # In float64, as the threshold was chosen: in the scores' float32 a threshold just
            # above a P(call) (threshold_for's nextafter) would round down to it and call.
            call = p.double() >= self.threshold  # (B,)
            opener = torch.zeros_like(scores, dtype=torch.bool)
            opener[:, self.token] = True
            banned = torch.where(call[:, None], ~opener, opener)  # (B, V)
            return scores.masked_fill(banned, float("-inf"))

        return process


def turn_end(chat: Any) -> str | None:
    """The text ``chat``'s template closes an assistant turn with ("<|im_end|>", "<|eot_id|>",
    "</s>"), None when it writes none after the reply or cannot render one."""
    from hpcpipe.data.function_calling.tokens import RenderError

    mark = "REPLY-ENDS-HERE"
    messages = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": mark}]
    try:
        text = chat.render(messages, None, generation=False)
    except RenderError:
        return None
    tail = text.rpartition(mark)[2].split()
    return tail[0] if tail else None


def stop_ids(tokenizer: Any, stop: str | None) -> list[int]:
    """The ids a reply ends at: EOS, and ``stop`` where the tokenizer has it as one token."""
    ids = [tokenizer.eos_token_id]
    more = tokenizer(stop, add_special_tokens=False)["input_ids"] if stop is not None else []
    return ids + more if len(more) == 1 and more[0] not in ids else ids


@torch.no_grad()
def generate_replies(
    model: nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int,
    batch_size: int,
    on_batch: Callable[[int], None] | None = None,
    decision: CallDecision | None = None,
    constraint: Callable[[Sequence[int]], Callable[..., torch.Tensor]] | None = None,
    stop: str | None = None,
) -> list[str]:
    """The decoded continuation of every prompt (special tokens removed), in the prompts' order;
    ``decision`` collects each prompt's P(call) at the first token (and applies its threshold);
    ``constraint`` gives a batch's prompt indices a logits processor that masks what they may not
    write (``hpcpipe.evaluate.constrain``), applied after ``decision`` has read the scores;
    ``stop`` (``turn_end``) ends a reply besides EOS: at its token, or cut at its text where the
    tokenizer splits it into several."""
    from transformers import LogitsProcessorList

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
        length = enc["input_ids"].shape[1]
        processors = [decision.processor(index, length)] if decision is not None else []
        if constraint is not None:
            processors.append(constraint(index))
        out = model.generate(  # type: ignore[operator]
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            # The KV cache: training turns it off in the model's config (hf_lm.load_base_model);
            # without it every new token re-runs the whole prefix (8x slower on SmolLM2 here).
            use_cache=True,
            eos_token_id=stop_ids(tokenizer, stop),
            pad_token_id=tokenizer.pad_token_id,
            logits_processor=LogitsProcessorList(processors),
        )
        new = out[:, length:]  # (B, <= max_new_tokens)
        texts = tokenizer.batch_decode(new, skip_special_tokens=True)
        # A reply never reads on past its turn: the later turns a model invents are not its reply.
        replies.update(zip(index, [t if stop is None else t.split(stop)[0] for t in texts], strict=True))
        if on_batch is not None:
            on_batch(len(chunk))
    return [replies[i] for i in range(len(prompts))]
