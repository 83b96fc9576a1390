"""ARCHITECTURE.md names only what exists: every module path and ``hpcpipe.…`` module it names,
every name it places in a module (``config/job.py TRAINING_KEYS``) defined there, its rooms table
equal to test_architecture.py's ROOMS, and no path outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.unit.project.test_architecture import ROOMS

import hpcpipe

SRC = Path(hpcpipe.__file__).parent
ROOT = SRC.parents[1]
DOC = ROOT / "ARCHITECTURE.md"
SPANS = re.compile(r"`([^`\n]+)`")
# `dir/file.ext` or `dir/file.ext Name` (a name defined in that file); no placeholders.
PATH_SPAN = re.compile(r"^(\w[\w.-]*(?:/[\w.-]+)+/?)(?: ([A-Za-z_]\w*))?$")
MODULE_NAME = re.compile(r"^hpcpipe(?:\.[a-z_]\w*)+$")


def _spans() -> list[str]:
    return SPANS.findall(DOC.read_text())


# Where the document's paths start: `launch/job.py`, `hpcpipe/__init__.py`, `tests/helpers.py`.
BASES = (SRC, SRC.parent, ROOT)


def _path_spans() -> list[tuple[str, str | None]]:
    """The paths into the repository it names (not a run directory's `RUN/plan/`), with the name
    it places in each, if any."""
    found = [(m[1], m[2]) for span in _spans() if (m := PATH_SPAN.match(span))]
    return [(path, name) for path, name in found if any((b / path.split("/")[0]).exists() for b in BASES)]


def _located(path: str) -> Path | None:
    for base in BASES:
        if (base / path).exists():
            return base / path
    return None


def _defines(source: str, name: str) -> bool:
    """``name`` is a function, class, constant, attribute or field defined in ``source``."""
    pattern = rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^\s*(?:self\.)?{name}\s*(?::|=[^=])"
    return re.search(pattern, source, re.MULTILINE) is not None


def test_every_path_it_names_exists() -> None:
    missing = sorted({path for path, _ in _path_spans() if _located(path) is None})
    assert missing == [], f"ARCHITECTURE.md names paths that do not exist: {missing}"


def test_every_name_it_places_in_a_module_is_defined_there() -> None:
    wrong = sorted(
        f"{path} {name}"
        for path, name in _path_spans()
        if name is not None
        and path.endswith(".py")
        and (found := _located(path)) is not None
        and not _defines(found.read_text(), name)
    )
    assert wrong == [], f"ARCHITECTURE.md places names where they are not defined: {wrong}"


def test_every_module_it_names_exists() -> None:
    def exists(name: str) -> bool:
        # The module itself, or an attribute of one (`hpcpipe.kfp.sdk.KFP_REQUIREMENTS`).
        for candidate in (name, name.rpartition(".")[0]):
            relative = Path(*candidate.split(".")[1:])
            if (SRC / relative).with_suffix(".py").is_file() or (SRC / relative / "__init__.py").is_file():
                return True
        return False

    names = {span.partition(":")[0] for span in _spans()}
    missing = sorted(name for name in names if MODULE_NAME.match(name) and not exists(name))
    assert missing == [], f"ARCHITECTURE.md names modules that do not exist: {missing}"


def _documented_rooms() -> dict[str, int]:
    """The rooms table of section 1: room -> the modules and packages in its second column, less
    what a "(not …)" aside excludes."""
    rooms: dict[str, int] = {}
    section = DOC.read_text().partition("## 1. The rooms")[2].partition("\n## ")[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 4 or not cells[1].isdigit():
            continue
        for entry in SPANS.findall(re.sub(r"\(not [^)]*\)", "", cells[2])):
            key = entry.removesuffix("/").removesuffix(".py").replace("/", ".")
            rooms[key] = int(cells[1])
    return rooms


def test_the_rooms_table_is_the_tests_rooms() -> None:
    assert _documented_rooms() == ROOMS


def test_it_points_at_nothing_outside_the_repository() -> None:
    text = DOC.read_text()
    outside = [p for p in ("/work/", "/home/", "../") if p in text]
    assert outside == [], f"ARCHITECTURE.md points outside the repository: {outside}"


@pytest.mark.parametrize(
    ("source", "name", "defined"),
    [
        ("TRAINING_KEYS = (1,)\n", "TRAINING_KEYS", True),
        ("from hpcpipe.config.job import TRAINING_KEYS\n", "TRAINING_KEYS", False),
        ("class A:\n    def fit(self) -> None: ...\n", "fit", True),
        ("x = TRAINING_KEYS == 1\n", "TRAINING_KEYS", False),
    ],
)
def test_a_name_is_defined_only_where_it_is_assigned_or_declared(
    source: str, name: str, defined: bool
) -> None:
    assert _defines(source, name) is defined
