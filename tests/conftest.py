"""Shared fixtures: a tiny prepared corpus and a runner for the real CLI in a subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import run_cli, write_synthetic_corpus


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
