"""Run a function-calling evaluation: cases -> prompts -> greedy replies -> scores -> report files."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from hpcpipe.data.function_calling.conversation import Conversation
from hpcpipe.evaluate.bfcl import BfclCase
from hpcpipe.evaluate.function_calling import (
    Case,
    bfcl_case,
    heldout_case,
    score,
    summarize,
    write_report,
)
from hpcpipe.evaluate.generate import CallDecision, generate_replies, stop_ids, turn_end


def build_cases(
    heldout: Sequence[Conversation], heldout_limit: int, bfcl_cases: Sequence[BfclCase]
) -> list[Case]:
    """Held-out conversations (the first ``heldout_limit``), then BFCL's cases."""
    cases = [c for i, conv in enumerate(heldout[:heldout_limit]) if (c := heldout_case(conv, i)) is not None]
    return cases + [bfcl_case(case) for case in bfcl_cases]


def evaluate_cases(
    model: nn.Module,
    chat: Any,  # hpcpipe.data.function_calling.tokens.ChatFormat
    cases: Sequence[Case],
    out: Path,
    meta: dict[str, Any],
    max_new_tokens: int,
    batch_size: int,
    progress: bool,
    call_threshold: float | None = None,
    constrain: bool = False,
) -> dict[str, Any]:
    """Generate every case's assistant turn, score it, write ``eval.json`` + ``eval.md``.
    ``call_threshold``: a reply opens with a call exactly when P(call) at its first token
    reaches it (below it, the reply opens with text and may still write a call after it);
    ``constrain``: calls follow the offered functions' schemas (``hpcpipe.evaluate.constrain``)."""
    from rich.progress import Progress

    from hpcpipe.data.function_calling.tokens import CALL_OPEN

    prompts = [chat.prompt(case.conversation, len(case.conversation.messages)) for case in cases]
    opener = chat.tokenizer(CALL_OPEN, add_special_tokens=False)["input_ids"][0]
    decision = CallDecision(opener, call_threshold)
    start = time.perf_counter()
    grammars = CaseGrammars(model, chat, cases) if constrain else None
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("generating", total=len(prompts))
        replies = generate_replies(
            model,
            chat.tokenizer,
            prompts,
            max_new_tokens,
            batch_size,
            on_batch=lambda n: bar.advance(task, n),
            decision=decision,
            constraint=None if grammars is None else grammars.processor,
            stop=turn_end(chat),
        )
    results = [
        {**score(case, reply), "p_call": decision.p_call[i]}  # exact, as the call threshold is
        for i, (case, reply) in enumerate(zip(cases, replies, strict=True))
    ]
    summary = summarize(results)
    meta = {
        **meta,
        "cases": len(cases),
        "generate_s": round(time.perf_counter() - start, 1),
        "max_new_tokens": max_new_tokens,
        "call_threshold": call_threshold,
        "constrained": constrain,
        "heldout_sha256": heldout_sha256(cases),
    }
    if grammars is not None:
        meta["unconstrained_cases"] = grammars.unconstrained
    write_report(summary, results, meta, out)
    return {"meta": meta, **summary}


def heldout_sha256(cases: Sequence[Case]) -> str | None:
    """SHA-256 of the held-out cases (prompts, tools, expected calls), None without any: their ids
    are only ``heldout_<index>``, so two runs' evaluations name different conversations alike."""
    held = [
        [c.id, [[m.role, m.content] for m in c.conversation.messages], c.conversation.tools, c.ground_truth]
        for c in cases
        if c.id.startswith("heldout_")
    ]
    text = json.dumps(held, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest() if held else None


class CaseGrammars:
    """Every case's compiled call grammar, by prompt index, and a batch's logits processor."""

    def __init__(self, model: nn.Module, chat: Any, cases: Sequence[Case]) -> None:
        from hpcpipe.evaluate.constrain import CallGrammars, check_template

        check_template(chat)
        # The turn's end as generation stops at it: else a grammar would not let a reply end there.
        stops = stop_ids(chat.tokenizer, turn_end(chat))
        self.compiler = CallGrammars(chat.tokenizer, logits_width(model, chat.tokenizer), stops)
        self.by_case = [self.compiler.compile(case.conversation.tools) for case in cases]

    @property
    def unconstrained(self) -> int:
        return self.compiler.unconstrained

    def processor(self, index: Sequence[int]) -> Any:
        return self.compiler.processor([self.by_case[i] for i in index])


def logits_width(model: nn.Module, tokenizer: Any) -> int:
    """The logits' width: the model's embedding rows (padded past the tokenizer's vocabulary)."""
    config = getattr(model, "config", None)
    return int(getattr(config, "vocab_size", None) or len(tokenizer))
