"""Run a function-calling evaluation: cases -> prompts -> greedy replies -> scores -> report files."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from hpcpipe.data.function_calling.conversation import Conversation
from hpcpipe.evaluate.function_calling import (
    Case,
    bfcl_case,
    heldout_case,
    score,
    summarize,
    write_report,
)
from hpcpipe.evaluate.generate import CallDecision, generate_replies


def build_cases(
    heldout: Sequence[Conversation],
    heldout_limit: int,
    bfcl_dir: Path | None,
    categories: Sequence[str],
    limit: int | None,
) -> list[Case]:
    """Held-out conversations (first ``heldout_limit``) and BFCL cases (``limit`` per category)."""
    cases = [c for i, conv in enumerate(heldout[:heldout_limit]) if (c := heldout_case(conv, i)) is not None]
    if bfcl_dir is not None and categories:
        from hpcpipe.evaluate.bfcl import load_bfcl

        cases += [bfcl_case(case) for case in load_bfcl(bfcl_dir, categories, limit)]
    return cases


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
) -> dict[str, Any]:
    """Generate every case's assistant turn, score it, write ``eval.json`` + ``eval.md``.
    ``call_threshold``: a reply calls exactly when P(call) at its first token reaches it."""
    from rich.progress import Progress

    from hpcpipe.data.function_calling.tokens import CALL_OPEN

    prompts = [chat.prompt(case.conversation, len(case.conversation.messages)) for case in cases]
    opener = chat.tokenizer(CALL_OPEN, add_special_tokens=False)["input_ids"][0]
    decision = CallDecision(opener, call_threshold)
    start = time.perf_counter()
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
        )
    results = [
        {**score(case, reply), "p_call": round(decision.p_call[i], 6)}
        for i, (case, reply) in enumerate(zip(cases, replies, strict=True))
    ]
    summary = summarize(results)
    meta = {
        **meta,
        "cases": len(cases),
        "generate_s": round(time.perf_counter() - start, 1),
        "max_new_tokens": max_new_tokens,
        "call_threshold": call_threshold,
    }
    write_report(summary, results, meta, out)
    return {"meta": meta, **summary}
