"""The harness's own kinds: one that passes and one that must fail.

``must_fail`` reports a failure on purpose, so a chaos run (and CI) shows that the harness can
fail: a runner that turned every verdict into "recovered" would be caught by it.
"""

from __future__ import annotations

from hpcpipe.chaos.scenario import TrialContext, TrialResult


def always_pass(ctx: TrialContext) -> TrialResult:
    draw = ctx.rng.randrange(1_000_000)
    return TrialResult(True, "nothing injected", {"draw": draw}, ttr_s=ctx.rng.uniform(0.1, 1.0))


def must_fail(ctx: TrialContext) -> TrialResult:
    draw = ctx.rng.randrange(1_000_000)
    return TrialResult(False, "failed on purpose (kind must_fail)", {"draw": draw}, lost=1)
