"""benchmarks/fc_abstention_ceiling.py: the replay of a declining rule, on hand-made outcomes."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from benchmarks import fc_abstention_ceiling  # the repository root is on sys.path


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return fc_abstention_ceiling


def case(id_: str, category: str, expects: bool, ast: bool) -> dict[str, Any]:
    return {"id": id_, "category": category, "expects_call": expects, "ast": ast}


# Two calls that pass (sure of them), one that fails, two irrelevance calls (unsure) and one
# irrelevance case that declined on its own (no score: it made no call).
RESULTS = [
    case("s1", "simple", True, True),
    case("s2", "simple", True, True),
    case("s3", "simple", True, False),
    case("i1", "irrelevance", False, False),
    case("i2", "irrelevance", False, False),
    case("i3", "irrelevance", False, True),
    case("l1", "live_irrelevance", False, True),
]
SCORES = {"s1": -0.1, "s2": -0.5, "s3": -2.0, "i1": -1.0, "i2": -0.3}


def test_declining_below_the_threshold_passes_only_where_no_call_was_wanted(bench: ModuleType) -> None:
    assert bench.replay(RESULTS, SCORES, -5.0) == (4, {"irrelevance": 1, "live_irrelevance": 1})
    # Below -0.7: s3 and i1 decline; s3 wanted a call (still a failure), i1 wanted none (a pass).
    assert bench.replay(RESULTS, SCORES, -0.7) == (5, {"irrelevance": 2, "live_irrelevance": 1})
    # Everything that called declines: the passing calls are lost.
    assert bench.replay(RESULTS, SCORES, 0.0) == (4, {"irrelevance": 3, "live_irrelevance": 1})


def test_the_ceiling_is_the_best_threshold_alone_and_with_irrelevance_kept(bench: ModuleType) -> None:
    best = bench.ceiling(RESULTS, SCORES, keep=0.9)
    assert best["all"]["ast"] == pytest.approx(5 / 7) and best["all"]["threshold"] == -0.5
    assert best["kept"]["ast"] == pytest.approx(5 / 7) and best["kept"]["irrelevance"] == 1.0
    assert best["kept"]["threshold"] == -0.1  # the only threshold that also declines i2
    # Passing calls (s1 -0.1, s2 -0.5) against unwanted calls (i1 -1.0, i2 -0.3): 3 of 4 pairs.
    assert best["auc"] == pytest.approx(0.75)
    assert bench.ceiling(RESULTS, {}, keep=0.9).get("kept") is None  # 2/3 irrelevance can't reach 0.9
