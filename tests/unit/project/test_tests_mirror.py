"""tests/unit mirrors the source (tests/README.md): ``tests/unit/<package>/test_<module>.py`` tests
``src/hpcpipe/<package>/<module>.py`` (``test_<module>_<aspect>.py`` for a second file of one module,
``test_<package>.py`` for a package as a whole); ``tests/unit/benchmarks/`` mirrors ``benchmarks/``
and ``tests/unit/project/`` holds the checks of the repository as a whole (rooms, docs, deploy files)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
UNIT = ROOT / "tests" / "unit"
SRC = ROOT / "src" / "hpcpipe"


def _names_in(folder: Path) -> set[str]:
    """What a test file in the mirror of ``folder`` may be named after: its modules, its
    subpackages, and the package itself."""
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    packages = {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    return modules | packages | {folder.name}


def _mirrors(test: Path) -> bool:
    relative = test.parent.relative_to(UNIT)
    if relative.parts[:1] == ("project",):
        return True
    folder = ROOT / "benchmarks" if relative.parts[:1] == ("benchmarks",) else SRC / relative
    if not folder.is_dir() or (folder != ROOT / "benchmarks" and not (folder / "__init__.py").is_file()):
        return False
    stem = test.stem.removeprefix("test_")
    return any(stem == name or stem.startswith(name + "_") for name in _names_in(folder))


def test_every_unit_test_file_is_named_after_what_it_tests() -> None:
    strays = [str(p.relative_to(UNIT)) for p in sorted(UNIT.rglob("test_*.py")) if not _mirrors(p)]
    assert strays == [], f"move or rename (tests/README.md says where): {strays}"


def test_every_folder_is_a_package() -> None:
    """Basenames repeat across packages (``checkpoint/test_export.py``, ``recipes/...``): each folder
    is a package so pytest imports them under distinct names."""
    folders = [UNIT, *(p for p in UNIT.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    assert [str(f) for f in folders if not (f / "__init__.py").is_file()] == []


def test_the_rule_refuses_a_stray() -> None:
    assert not _mirrors(UNIT / "test_something_else.py")
    assert not _mirrors(UNIT / "checkpoint" / "test_nothing.py")
    assert _mirrors(UNIT / "checkpoint" / "test_store_async.py")
    assert _mirrors(UNIT / "data" / "tokens" / "test_loader.py")
