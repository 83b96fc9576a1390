"""Error messages read the same in every process: a YAML ``!!set`` quoted in one is sorted, not
in the order of the hash seed (which made the fuzz scenario's in-process and subprocess answers
differ), and the fuzz scenario's cases and answers are the same under any ``PYTHONHASHSEED``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from random import Random

import pytest

from hpcpipe.chaos import fuzz
from hpcpipe.config import load_config
from hpcpipe.errors import ConfigError, stable_repr

REPO = Path(__file__).resolve().parents[2]
MANY = "!!set {f, a, e, b, d, c}"  # six members: 720 orders, so a hash-ordered repr shows


def test_sets_are_sorted_wherever_they_sit() -> None:
    assert stable_repr({"b", "a", "c"}) == "{'a', 'b', 'c'}"
    assert stable_repr(frozenset({3, 1, 2})) == "frozenset({1, 2, 3})"
    nested = [{"b", "a"}, ({"y", "x"},), {"k": {2, 1}}]
    assert stable_repr(nested) == "[{'a', 'b'}, ({'x', 'y'},), {'k': {1, 2}}]"
    for plain in (set(), frozenset(), (), (1,), [], {}, "s", 1.5, None, {"b": 1, "a": 2}):
        assert stable_repr(plain) == repr(plain)


def test_a_config_error_quotes_a_yaml_set_sorted() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config("tiny", [f"fault.preempt_grace_s={MANY}"])
    assert str(caught.value).endswith("(got {'a', 'b', 'c', 'd', 'e', 'f'})")


def fuzz_answers(work: Path) -> str:
    """The fuzz scenario's digest of 500 cases (seed 0), then the answer (exit code and error line)
    of every case that quotes a YAML ``!!set``, run in-process as `hpcpipe chaos run` runs them."""
    import typer.main

    from hpcpipe.cli.app import app

    targets = fuzz.FuzzTargets("0123456789", work / "markers", work / "outside")
    root = work / "root"
    for folder in (root, targets.markers, targets.outside):
        folder.mkdir(parents=True)
    cases = fuzz.generate_cases(Random(0), 500, targets)
    cli = fuzz.InProcessCli(typer.main.get_command(app))
    answers = [fuzz.cases_digest(cases, work)]
    for case in (c for c in cases if "!!set" in repr((c.args, c.files))):
        fuzz.write_files(case, root)
        code, line = fuzz.summary(cli.run(case.args, root), (root,))
        answers.append(f"case {case.index}: exit {code}: {line}")
    try:
        load_config("tiny", [f"fault.preempt_grace_s={MANY}"])
    except ConfigError as exc:
        answers.append(str(exc))
    return "\n".join(answers).replace(str(work), "<work>")


@pytest.mark.timeout(180)
def test_the_fuzz_scenario_answers_alike_under_any_hash_seed(tmp_path: Path) -> None:
    outputs = []
    for seed in ("1", "2"):
        code = "import sys; from pathlib import Path; from tests.unit.test_errors import fuzz_answers"
        code += "; print(fuzz_answers(Path(sys.argv[1])))"
        proc = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / seed)],
            cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            timeout=150,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1]
    quoted = [line for line in outputs[0].splitlines() if "(got {'a', 'b'" in line]
    assert len(quoted) >= 2, outputs[0]  # a fuzzed case's !!set, and the six-member one
