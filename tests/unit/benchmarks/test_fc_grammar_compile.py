"""benchmarks/fc_grammar_compile.py: the evaluation's batches, and which of them are decoded."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "fc_grammar_compile.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fc_grammar_compile", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fc_grammar_compile", module)
    spec.loader.exec_module(module)
    return module


def test_batches_are_the_ones_generate_replies_forms(bench: ModuleType) -> None:
    prompts = ["xxxx", "x", "xxxxxx", "xx", "xxxxx", "xxx", "xxxxxxx"]
    assert bench.batches_by_length(prompts, 3) == [[1, 3, 5], [0, 4, 2], [6]]


@pytest.mark.parametrize(
    ("count", "among", "chosen"),
    [(3, 30, [0, 14, 29]), (1, 30, [15]), (2, 5, [0, 4]), (5, 3, [0, 1, 2]), (4, 4, [0, 1, 2, 3])],
)
def test_decoded_batches_spread_from_shortest_to_longest(
    bench: ModuleType, count: int, among: int, chosen: list[int]
) -> None:
    assert bench.spread(count, among) == chosen
