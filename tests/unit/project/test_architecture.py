"""The rooms stack (ARCHITECTURE.md): no module imports from a room above its own, no two modules
import each other, directly or around a circle, and no two packages do either. Every import
counts: lazy imports inside functions, TYPE_CHECKING imports (except where said), and imports by
string (``importlib.import_module("hpcpipe.x")``, ``"hpcpipe.x:function"`` tables, package-data
loaders): any string constant that names an hpcpipe module is an edge, so a dependency cannot
hide in a string."""

from __future__ import annotations

import ast
import functools
import tomllib
from pathlib import Path
from typing import TypeGuard

import hpcpipe

SRC = Path(hpcpipe.__file__).parent
ROOT_PACKAGE = "hpcpipe"

# Lower number = lower room. A module may import its own room and the rooms below. A dotted key
# places one module apart from its package (the longest key that prefixes a module wins). Each
# key is a unit: the cycle check between packages runs on these keys.
ROOMS: dict[str, int] = {
    # The package root holds only __version__ and the public API's re-exports.
    **dict.fromkeys(
        [
            "__init__",
            "config",
            "errors",
            "compat",
            "fsutil",
            "netutil",
            "yamlfile",
            "presets",
            "layout",
            "annotations",
        ],
        0,
    ),
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
    # Chains room 4's tools: hpcpipe run's steps (pipeline), Katib (hpo) and the train job (launch).
    "kfp": 5,
    **dict.fromkeys(["cli", "__main__"], 6),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    """The ROOMS key that places ``module``: ``hpcpipe.launch.kubernetes`` -> ``launch``."""
    parts = module.split(".")[1:] or ["__init__"]
    for depth in range(len(parts), 0, -1):
        key = ".".join(parts[:depth])
        if key in ROOMS:
            return key
    raise AssertionError(f"{module}: add its package to ROOMS in this test (and to ARCHITECTURE.md)")


def _room(module: str) -> int:
    return ROOMS[unit(module)]


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
    return name if name in known and name != ROOT_PACKAGE else None


def _is_type_checking(node: ast.AST) -> TypeGuard[ast.If]:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _nodes(tree: ast.AST, type_only: bool) -> list[ast.AST]:
    """Every node of ``tree``; without ``type_only``, not those under ``if TYPE_CHECKING:``."""
    found: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        if not type_only and _is_type_checking(node):
            todo += node.orelse
        else:
            todo += ast.iter_child_nodes(node)
    return found


def imports(path: Path, known: set[str], type_only: bool = True) -> set[str]:
    """hpcpipe modules ``path`` imports anywhere in it (``from pkg import mod`` resolves to mod);
    without ``type_only``, only the imports that can run (not under ``if TYPE_CHECKING:``)."""
    found: set[str] = set()
    for node in _nodes(ast.parse(path.read_text()), type_only):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith(ROOT_PACKAGE)}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(ROOT_PACKAGE):
            base = node.module or ""
            subs = {f"{base}.{a.name}" for a in node.names} & known
            found |= subs or {base}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            named = _named_module(node.value, known)
            found |= {named} if named else set()
    return found & known


@functools.cache
def module_graph(type_only: bool = True) -> dict[str, frozenset[str]]:
    """Every hpcpipe module -> the hpcpipe modules it imports (``imports``)."""
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    known = set(paths)
    return {name: frozenset(imports(path, known, type_only) - {name}) for name, path in paths.items()}


def _is_own_package(a: str, b: str) -> bool:
    """A package and its own submodules (re-exports, lazy attribute tables) are one unit."""
    return a.startswith(b + ".") or b.startswith(a + ".")


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every circle a depth-first walk of ``graph`` closes, as ``a -> b -> a``."""
    cycles: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def unit_graph(type_only: bool = True) -> dict[str, set[str]]:
    """ROOMS key -> the keys its modules import, the root package left out: Python runs
    ``hpcpipe/__init__.py`` before any submodule whoever imports what, so an edge to it orders
    nothing."""
    graph: dict[str, set[str]] = {}
    for src, targets in module_graph(type_only).items():
        for dst in targets:
            if ROOT_PACKAGE not in (src, dst) and unit(src) != unit(dst):
                graph.setdefault(unit(src), set()).add(unit(dst))
    return graph


def test_no_module_imports_from_a_room_above() -> None:
    # The root package is the public API: it re-exports hpcpipe.DatasetRecipe from room 2.
    upward = [
        f"{src} -> {dst}"
        for src, targets in module_graph().items()
        for dst in sorted(targets)
        if _room(dst) > _room(src) and src != ROOT_PACKAGE
    ]
    assert upward == [], "imports from a higher room: " + "; ".join(upward)


def test_no_import_cycles_between_modules() -> None:
    graph = {
        node: {nxt for nxt in targets if not _is_own_package(node, nxt)}
        for node, targets in module_graph().items()
    }
    cycles = _cycles(graph)
    assert cycles == [], "import cycles: " + "; ".join(cycles)


def test_no_import_cycles_between_packages() -> None:
    """``launch`` -> ``hpo`` while ``hpo`` -> ``launch`` is a cycle even when no module closes one:
    the two packages can no longer be placed one above the other. Lazy imports count; imports for
    type checking only do not, as they never run (the config names the recipe API's registry in its
    validators, and the registry and ``recipes/base.py`` name the config's types in signatures)."""
    cycles = _cycles(unit_graph(type_only=False))
    assert cycles == [], "import cycles between packages: " + "; ".join(cycles)


def test_a_cycle_between_packages_is_seen_through_a_lazy_import(tmp_path: Path) -> None:
    """A lazy import of a package that imports back closes a cycle; one for type checking does not."""
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def spec():\n    from hpcpipe.pipeline.steps import STEPS\n    return STEPS\n")
    typed = tmp_path / "typed.py"
    typed.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hpcpipe.pipeline import steps\n"
    )
    known = set(module_graph())
    assert imports(lazy, known, type_only=False) == {"hpcpipe.pipeline.steps"}
    assert imports(typed, known) == {"hpcpipe.pipeline.steps"}
    assert imports(typed, known, type_only=False) == set()
    graph = {"launch": {"pipeline"}, "pipeline": {"launch"}}
    assert _cycles(graph) == ["launch -> pipeline -> launch"]


def test_imports_by_string_are_seen(tmp_path: Path) -> None:
    """The checks above would miss nothing hidden in a string: shown on a module written here."""
    known = {"hpcpipe.cli.app", "hpcpipe.chaos.training", "hpcpipe.chaos.fuzz"}
    sample = tmp_path / "sample.py"
    sample.write_text(
        'import importlib\napp = importlib.import_module("hpcpipe.cli.app").app\n'
        'KINDS = {"kill": "hpcpipe.chaos.training:kill_rank"}\nlog = "hpcpipe.not_a_module"\n'
    )
    assert imports(sample, known) == {"hpcpipe.cli.app", "hpcpipe.chaos.training"}
    assert _room("hpcpipe.recipes.registry") == 0 < _room("hpcpipe.recipes.gpt") == 2
