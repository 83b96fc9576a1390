"""benchmarks/fc_grammar_compile.py: the evaluation's batches, and which of them are decoded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks import fc_grammar_compile as bench  # the repository root is on sys.path

SCRIPT = Path(bench.__file__)
BFCL_SAMPLES = bench.BFCL_SAMPLES


def test_batches_are_the_ones_generate_replies_forms() -> None:
    prompts = ["xxxx", "x", "xxxxxx", "xx", "xxxxx", "xxx", "xxxxxxx"]
    assert bench.batches_by_length(prompts, 3) == [[1, 3, 5], [0, 4, 2], [6]]


@pytest.mark.parametrize(
    ("count", "among", "chosen"),
    [(3, 30, [0, 14, 29]), (1, 30, [15]), (2, 5, [0, 4]), (5, 3, [0, 1, 2]), (4, 4, [0, 1, 2, 3])],
)
def test_decoded_batches_spread_from_shortest_to_longest(count: int, among: int, chosen: list[int]) -> None:
    assert bench.spread(count, among) == chosen


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--generate", "0"], "argument --generate: 0 is not a positive integer"),
        (["--bfcl-dir", str(BFCL_SAMPLES), "--split", "nope"], "unknown BFCL split 'nope'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr.splitlines()[-1] and "Traceback" not in proc.stderr
