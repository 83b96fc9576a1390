"""Shared fixtures: a tiny prepared corpus and a runner for the real CLI in a subprocess."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.helpers import run_cli, write_synthetic_corpus

from hpcpipe.launch import heap
from hpcpipe.observe.event_kinds import CHECK_EVENTS_VAR
from hpcpipe.train.environment import sharing_cores

# The collection imports torch, transformers and every test module: as a command's imports
# (launch/heap.py), with the collector mostly idle, and frozen once collected.
heap.start_up()

# The xdist workers' training runs share this machine's cores: without it, one run's spinning
# OpenMP threads slow the other's several times over. Every subprocess inherits it.
os.environ.update(sharing_cores(os.environ))
# Every events.jsonl line any run writes must be a kind, with fields, that observe/event_kinds.py
# lists (docs/reference/events.md is generated from it): a drift fails the test that wrote it.
os.environ[CHECK_EVENTS_VAR] = "1"


@pytest.fixture(scope="session")
def cli():  # type: ignore[no-untyped-def]
    return run_cli


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few hundred KB of real Python source (the stdlib), copied so tests don't depend on order."""
    import sysconfig

    src = Path(sysconfig.get_paths()["stdlib"])
    out = tmp_path_factory.mktemp("corpus")
    total = 0
    for path in sorted(src.glob("*.py")):
        text = path.read_text(errors="replace")
        (out / path.name).write_text(text)
        total += len(text)
        if total > 300_000:
            break
    return out


@pytest.fixture(scope="session")
def synthetic_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_corpus(tmp_path_factory.mktemp("synthetic") / "corpus.txt")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest test files first (seconds per file from ``tests/durations.json``), each file's tests
    in their own order: with ``--dist loadfile --no-loadscope-reorder`` the xdist workers take whole
    files from the front of this order, so the long files start at once and the short ones fill the
    gaps at the end (the workers finish together). ``scripts/test_durations.py record`` refreshes
    the table from a JUnit XML; a file it does not know yet runs after the known ones."""
    import json

    table = Path(__file__).parent / "durations.json"
    seconds: dict[str, float] = json.loads(table.read_text()) if table.is_file() else {}
    order = {id(item): index for index, item in enumerate(items)}

    def key(item: pytest.Item) -> tuple[float, int]:
        name = item.nodeid.split("::", 1)[0]
        return (-seconds.get(name, -1.0), order[id(item)])

    items.sort(key=key)
    for item in items:  # the directory is the kind: `-m e2e` / `-m "not e2e"` select by it
        if "/e2e/" in f"/{item.nodeid}":
            item.add_marker(pytest.mark.e2e)


def pytest_collection_finish(session: pytest.Session) -> None:
    heap.settle()


@pytest.fixture(autouse=True)
def _cpu_seconds_per_test(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """With HPCPIPE_TEST_CPU=FILE, append each test's CPU seconds (this process and the children
    it reaped: the hpcpipe subprocesses and their workers) to FILE as JSON lines. The suite is
    CPU-bound on 2 cores: this is the figure to cut (``scripts/test_durations.py cpu FILE``)."""
    target = os.environ.get("HPCPIPE_TEST_CPU")
    if not target:
        yield
        return
    import json
    import resource

    def used() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    start = used()
    yield
    row = {"test": request.node.nodeid, "cpu_s": round(used() - start, 2)}
    with open(target, "a") as out:
        out.write(json.dumps(row) + "\n")
