"""The rooms stack (ARCHITECTURE.md): no module imports from a room above its own, and no two
modules import each other, directly or around a circle. Every import counts: lazy imports inside
functions, TYPE_CHECKING imports, and imports by string (``importlib.import_module("hpcpipe.x")``,
``"hpcpipe.x:function"`` tables, package-data loaders): any string constant that names an hpcpipe
module is an edge, so a dependency cannot hide in a string."""

from __future__ import annotations

import ast
import functools
import tomllib
from pathlib import Path

import hpcpipe

SRC = Path(hpcpipe.__file__).parent

# Lower number = lower room. A module may import its own room and the rooms below. A dotted key
# places one module apart from its package (the longest key that prefixes a module wins).
ROOMS: dict[str, int] = {
    # The package root holds only __version__ and re-exports of config and errors.
    **dict.fromkeys(["__init__", "config", "errors", "compat", "fsutil", "netutil", "presets", "layout"], 0),
    # The recipe API's base, its argument schema and the registry that finds a recipe's class: the
    # config validates a job against the class run.recipe names.
    **dict.fromkeys(["recipes.base", "recipes.args", "recipes.registry"], 0),
    **dict.fromkeys(["checkpoint", "observe", "track", "data", "models", "evaluate"], 1),
    "recipes": 2,
    "train": 3,
    **dict.fromkeys(
        [
            "accept",
            "bench",
            "doctor",
            "hpo",
            "sweep",
            "pipeline",
            "chaos",
            "report",
            "launch",
            "plan",
            "recipecheck",
            "scaffold",
            "testing",
        ],
        4,
    ),
    **dict.fromkeys(["cli", "__main__"], 5),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> int:
    parts = module.split(".")[1:] or ["__init__"]
    for depth in range(len(parts), 0, -1):
        key = ".".join(parts[:depth])
        if key in ROOMS:
            return ROOMS[key]
    raise AssertionError(f"{module}: add its package to ROOMS in this test (and to ARCHITECTURE.md)")


@functools.cache
def _entry_point_groups() -> set[str]:
    """The entry-point groups pyproject.toml declares: ``"hpcpipe.recipes"`` names a group (where
    packages register recipes), not the package of the same name."""
    pyproject = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())
    return set(pyproject["project"].get("entry-points", {}))


def _named_module(text: str, known: set[str]) -> str | None:
    """``"hpcpipe.chaos.training:kill_rank"`` or ``"hpcpipe.cli.app"`` -> the module it names."""
    name = text.partition(":")[0]
    if text in _entry_point_groups():
        return None
    return name if name in known and name != "hpcpipe" else None


def _imports(path: Path, known: set[str]) -> set[str]:
    """hpcpipe modules ``path`` imports anywhere in it (``from pkg import mod`` resolves to mod)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("hpcpipe")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hpcpipe"):
            base = node.module or ""
            subs = {f"{base}.{a.name}" for a in node.names} & known
            found |= subs or {base}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            named = _named_module(node.value, known)
            found |= {named} if named else set()
    return found & known


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    known = set(paths)
    return {name: _imports(path, known) - {name} for name, path in paths.items()}


def _is_own_package(a: str, b: str) -> bool:
    """A package and its own submodules (re-exports, lazy attribute tables) are one unit."""
    return a.startswith(b + ".") or b.startswith(a + ".")


def test_no_module_imports_from_a_room_above() -> None:
    upward = [
        f"{src} -> {dst}"
        for src, targets in _graph().items()
        for dst in sorted(targets)
        if _room(dst) > _room(src) and not (_is_own_package(src, dst) and src.count(".") < dst.count("."))
    ]
    assert upward == [], "imports from a higher room: " + "; ".join(upward)


def test_no_import_cycles() -> None:
    graph = _graph()
    cycles: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if _is_own_package(node, nxt):
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == [], "import cycles: " + "; ".join(cycles)


def test_imports_by_string_are_seen() -> None:
    """The checks above would miss nothing hidden in a string: shown on a module written here."""
    known = {"hpcpipe.cli.app", "hpcpipe.chaos.training", "hpcpipe.chaos.fuzz"}
    sample = SRC.parent / "_architecture_sample.py"
    sample.write_text(
        'import importlib\napp = importlib.import_module("hpcpipe.cli.app").app\n'
        'KINDS = {"kill": "hpcpipe.chaos.training:kill_rank"}\nlog = "hpcpipe.not_a_module"\n'
    )
    try:
        assert _imports(sample, known) == {"hpcpipe.cli.app", "hpcpipe.chaos.training"}
    finally:
        sample.unlink()
    assert _room("hpcpipe.recipes.registry") == 0 < _room("hpcpipe.recipes.gpt") == 2
