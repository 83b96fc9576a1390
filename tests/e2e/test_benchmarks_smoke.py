"""Every benchmark in ``benchmarks/`` runs end to end at toy size (``--smoke``), so a broken one fails
the suite, not the next person who measures.

The scripts are found in the folder, not listed here: every ``*.py`` with a ``__main__`` block and
every ``*.sh``. Each runs with ``--smoke`` in a process of its own (in a temporary directory, in a
session of its own, killed whole past a hard timeout; a ``*.py`` forked from the tests' zygote,
``hpcpipe.launch.zygote.run_script``, which imported torch and the CLI once) and must exit 0 with,
last, its JSON line saying ``"smoke": true``; a new script without ``--smoke`` fails here (argparse:
unrecognized arguments). A module without a ``__main__`` block must be a helper that a script
imports (``harness.py`` and the like), so a script cannot drop out by accident. ``gpu_suite*`` (the
GPU machine's suite) has its own test.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path

import pytest
from tests.helpers import CLI_PRELOAD, CLI_ZYGOTE, REPO

from hpcpipe.launch.zygote import Launch, run_script

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
OWN_TEST = ("gpu_suite",)
TIMEOUT_S = 240  # a smoke run takes seconds to a minute on 2 busy cores


def _runnable(path: Path) -> bool:
    return path.suffix == ".sh" or 'if __name__ == "__main__":' in path.read_text()


def _scripts(folder: Path = BENCHMARKS) -> list[Path]:
    found = sorted([*folder.glob("*.py"), *folder.glob("*.sh")])
    return [p for p in found if not p.name.startswith(OWN_TEST) and _runnable(p)]


def _no_gcc() -> str | None:
    return None if shutil.which("gcc") else "gcc is not installed: the NVTX tool cannot be built"


def _no_deepspeed() -> str | None:
    return None if find_spec("deepspeed") else "deepspeed is not installed (the test extra has it)"


# What a script needs that a machine may lack: the one-line reason it skips there.
MISSING: dict[str, Callable[[], str | None]] = {
    "nvtx_overhead.py": _no_gcc,
    "deepspeed_overhead.py": _no_deepspeed,
}


def _check_smoke(script: Path, cwd: Path) -> float:
    """``script --smoke`` in ``cwd``: exit 0 and, last, a JSON line with ``"smoke": true``;
    returns its seconds."""
    # The venv's bin first: a shell script calls `hpcpipe` by name.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    if script.suffix == ".py":
        how = Launch(timeout=TIMEOUT_S, new_session=True, kill=_kill_group)
        proc = run_script(script, ["--smoke"], cwd, env, how, CLI_PRELOAD, REPO, CLI_ZYGOTE)
    else:
        proc = subprocess.run(
            ["bash", str(script), "--smoke"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
            start_new_session=True,
        )
    seconds = time.perf_counter() - started
    assert proc.returncode == 0, f"exit {proc.returncode} after {seconds:.0f} s:\n{proc.stderr[-4000:]}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output:\n{proc.stderr[-2000:]}"
    record = json.loads(lines[-1])  # the JSON line comes last
    assert record["smoke"] is True, lines[-1]
    return seconds


def _kill_group(pid: int) -> None:
    """The script and everything it started (its session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("script", _scripts(), ids=lambda p: p.name)
def test_the_benchmark_runs_at_toy_size(script: Path, tmp_path: Path) -> None:
    reason = MISSING.get(script.name, lambda: None)()
    if reason:
        pytest.skip(reason)
    print(f"{script.name}: {_check_smoke(script, tmp_path):.1f} s")


def _unused_modules(folder: Path = BENCHMARKS) -> list[str]:
    """The modules without a ``__main__`` block that no module of ``folder`` imports."""
    imported: set[str] = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    helpers = [p.stem for p in sorted(folder.glob("*.py")) if not _runnable(p)]
    return [name for name in helpers if name not in imported]


def test_every_module_without_main_is_a_helper_a_script_imports() -> None:
    assert _unused_modules() == []


def test_a_new_script_without_smoke_fails_and_one_without_main_is_caught(tmp_path: Path) -> None:
    (tmp_path / "shared.py").write_text("X = 1\n")
    main = 'if __name__ == "__main__":\n    argparse.ArgumentParser().parse_args()\n'
    (tmp_path / "new_bench.py").write_text(f"import argparse\n\nimport shared\n\n{main}")
    (tmp_path / "forgotten.py").write_text("import argparse\n\nargparse.ArgumentParser().parse_args()\n")
    assert [p.name for p in _scripts(tmp_path)] == ["new_bench.py"]
    with pytest.raises(AssertionError, match="unrecognized arguments: --smoke"):
        _check_smoke(tmp_path / "new_bench.py", tmp_path)
    assert _unused_modules(tmp_path) == ["forgotten"]  # runs on import: not a helper, not found


def test_the_discovery_finds_the_scripts_and_leaves_out_helpers_and_gpu_suite() -> None:
    names = {p.name for p in _scripts()}
    assert {"trainer_overhead.py", "collectives_overhead.py", "fc_mix_sweep.sh"} <= names
    assert not names & {"harness.py", "ddp_harness.py", "in_memory_gpt.py", "observer_pair.py"}
    assert not [n for n in names if n.startswith("gpu_suite")]
