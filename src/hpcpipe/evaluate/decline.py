"""Declining after the call: a reply that wrote a call is withdrawn when the model was unsure of it.

Greedy decoding decides call or text at the reply's first token. Where the listed functions come
close to the request (a freezing point asked, a boiling-point function listed) a small fine-tuned
model opens a call anyway, and then has to make the arguments up: the call's own tokens are less
likely. The rule scores every reply that opens with a call after it is written (``makes_call``:
a call written after some text is neither scored nor declined, as the first token decided
against calling there),

    score = log P(call at the first token) + weight x mean log P(each token of the call)

(one forward pass over prompt + reply, the model's raw logits) and declines the call when the
score is below a threshold (benchmarks/fc_abstention_ceiling.py measured the score against
alternatives: p_call alone ranks calls worse).

The threshold comes from generated data, never from a benchmark: near misses
(``data.synthetic_mix.near_misses``: a request beside a listed function of its field, from a
seed no training row was drawn from), decoded as the evaluation decodes them, and the threshold
at which ``target`` of them decline (those that decline at the first token count too). It is
saved beside the adapter (``decline.json``).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpcpipe.config.synthetic import SHAPE_FIELDS, SyntheticMix
from hpcpipe.data.function_calling.conversation import Conversation
from hpcpipe.evaluate.calibrate import SEED_OFFSET, is_number, read_saved  # SEED_OFFSET: see there
from hpcpipe.evaluate.function_calling import Case, score
from hpcpipe.layout import RunLayout

DECLINED_REPLY = "None of the functions listed can do this, so I won't call one."


@dataclass(frozen=True)
class DeclineRule:
    threshold: float | None  # a call whose score is below this declines; None: none declines
    weight: float  # of the call's mean token log-probability in the score
    target: float  # the share of near misses that decline under the rule
    cases: int  # near misses decoded
    calling: int  # of them, those whose reply opened a call
    seed: int  # the generator seed they were drawn from
    constrained: bool = True  # decoded under the call grammar (--constrain), as the evaluation was
    call_threshold: float | None = None  # the evaluation's first-token threshold (None: greedy)
    adapter_sha256: str | None = None  # calibrate.adapter_sha256 of the adapter it was set on

    def __post_init__(self) -> None:
        numbers = (self.threshold, self.call_threshold)
        if not all(v is None or is_number(v) for v in numbers) or not is_number(self.weight):
            raise TypeError(
                f"threshold {self.threshold!r}, call_threshold {self.call_threshold!r} or weight "
                f"{self.weight!r} is not a number"
            )

    def declines(self, value: float) -> bool:
        return self.threshold is not None and value < self.threshold

    def save(self, directory: Path) -> Path:
        path = directory / RunLayout.DECLINE  # beside the exported adapter
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path


def read_decline(adapter_dir: Path) -> DeclineRule | None:
    return read_saved(adapter_dir / RunLayout.DECLINE, DeclineRule, "delete it, or pass --recalibrate")


def field_near_misses(n: int, seed: int, mix: SyntheticMix) -> list[Conversation]:
    """``n`` requests beside a listed function of their field that cannot serve them (``mix``'s
    functions, names and places as it draws them), each cut before its reply."""
    from hpcpipe.data.function_calling.generator import generate_conversations

    only_refusals = {shape: 0.0 for shape in SHAPE_FIELDS} | {"refusal": 1.0}
    near = mix.model_copy(update={**only_refusals, "near_misses": 1.0, "follow_ups": 0.0, "restate": 0.0})
    drawn = generate_conversations(n, seed, near)
    return [Conversation(c.messages[:2], c.tools, source="near-miss") for c in drawn]


@torch.no_grad()
def call_log_probs(model: nn.Module, tokenizer: Any, prompt: str, reply: str) -> list[float]:
    """log P(token) of every token of ``reply`` after ``prompt``, from the model's raw logits (the
    reply's text tokenized again: the generated ids where BPE splits it the same way)."""
    head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    tail = tokenizer(reply, add_special_tokens=False)["input_ids"]
    logits = model(input_ids=torch.tensor([head + tail]), use_cache=False).logits[0]  # (T, V)
    logp = logits[len(head) - 1 : -1].float().log_softmax(dim=-1)  # (len(tail), V)
    return logp[torch.arange(len(tail)), torch.tensor(tail)].tolist()


def decline_score(p_call: float, log_probs: Sequence[float], weight: float) -> float:
    return math.log(max(p_call, 1e-9)) + weight * statistics.fmean(log_probs)


def makes_call(reply: str) -> bool:
    """Whether ``reply`` opens with a call: the ones the rule judges (a call after text is not)."""
    from hpcpipe.data.function_calling.tokens import CALL_OPEN

    return reply.lstrip().startswith(CALL_OPEN)


def threshold_at(scores: Sequence[float], declined_first: int, target: float) -> float | None:
    """The smallest threshold at which ``target`` of all near misses decline: ``declined_first``
    already did at the first token; ``scores`` are the calls'. None when no call needs to."""
    if not 0 < target <= 1:
        raise ValueError(f"target must be in (0, 1], got {target}")
    needed = math.ceil(target * (declined_first + len(scores))) - declined_first  # calls to decline
    if needed <= 0:
        return None
    ranked = sorted(scores)
    return ranked[needed] if needed < len(ranked) else math.nextafter(ranked[-1], math.inf)


def calibrate_decline(
    model: nn.Module,
    chat: Any,  # hpcpipe.data.function_calling.tokens.ChatFormat
    mix: SyntheticMix,
    seed: int,
    cases: int,
    target: float,
    weight: float,
    constrain: bool,
    batch_size: int = 8,
    call_threshold: float | None = None,
) -> DeclineRule:
    """Decode ``cases`` near misses as the evaluation does (``constrain``; the first token greedy
    or by ``call_threshold``, as its ``--call-threshold``), score the calls, and choose the
    threshold for ``target``."""
    from hpcpipe.data.function_calling.tokens import CALL_OPEN
    from hpcpipe.evaluate.fc_run import CaseGrammars
    from hpcpipe.evaluate.generate import CallDecision, generate_replies, turn_end

    convs = field_near_misses(cases, seed + SEED_OFFSET, mix)
    prompts = [chat.prompt(conv, len(conv.messages)) for conv in convs]
    opener_id = chat.tokenizer(CALL_OPEN, add_special_tokens=False)["input_ids"][0]
    decision = CallDecision(opener_id, call_threshold)
    # First token only: most decline there, and a prose reply need not be written out.
    firsts = generate_replies(model, chat.tokenizer, prompts, 1, batch_size, decision=decision)
    opener = chat.tokenizer.decode([decision.token])
    opening = [i for i, first in enumerate(firsts) if first.startswith(opener)]
    near = [Case(f"near_{i}", "near_miss", "irrelevance", convs[i], [], None) for i in opening]
    grammars = CaseGrammars(model, chat, near) if constrain else None
    replies = generate_replies(
        model,
        chat.tokenizer,
        [prompts[i] for i in opening],
        128,
        batch_size,
        constraint=None if grammars is None else grammars.processor,
        stop=turn_end(chat),
        decision=CallDecision(opener_id, call_threshold),  # the same first token again (its own indices)
    )
    scores = [
        decline_score(decision.p_call[i], call_log_probs(model, chat.tokenizer, prompts[i], reply), weight)
        for i, reply in zip(opening, replies, strict=True)
        if makes_call(reply)
    ]
    threshold = threshold_at(scores, cases - len(scores), target)  # exact: rounding could let a call through
    return DeclineRule(
        threshold, weight, target, cases, len(scores), seed + SEED_OFFSET, constrain, call_threshold
    )


def apply_decline(
    model: nn.Module, chat: Any, cases: Sequence[Case], results: Sequence[dict[str, Any]], rule: DeclineRule
) -> list[dict[str, Any]]:
    """``results`` (eval.json's cases, in ``cases``' order) with every call scored and, below the
    rule's threshold, replaced by a decline (scored again; the call kept as ``declined_call``)."""
    out = []
    for case, result in zip(cases, results, strict=True):
        if not makes_call(result["reply"]):
            out.append(result)
            continue
        prompt = chat.prompt(case.conversation, len(case.conversation.messages))
        log_probs = call_log_probs(model, chat.tokenizer, prompt, result["reply"])
        value = decline_score(result["p_call"], log_probs, rule.weight)
        shown = round(value, 6)
        if rule.declines(value):
            withdrawn = {"p_call": result["p_call"], "decline_score": shown, "declined_call": result["reply"]}
            out.append({**score(case, DECLINED_REPLY), **withdrawn})
        else:
            out.append({**result, "decline_score": shown})
    return out
