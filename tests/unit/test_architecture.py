"""The rooms stack (ARCHITECTURE.md): no module imports from a room above its own, and no two
modules import each other, directly or around a circle (lazy imports inside functions count)."""

from __future__ import annotations

import ast
from pathlib import Path

import hpcpipe

SRC = Path(hpcpipe.__file__).parent

# Lower number = lower room. A module may import its own room and the rooms below.
ROOMS: dict[str, int] = {
    # The package root holds only __version__ and re-exports of config and errors.
    **dict.fromkeys(
        [
            *[
                "__init__",
                "config",
                "config_section",
                "config_launch",
                "config_observe",
                "config_pipeline",
                "config_hpo",
            ],
            *["errors", "compat", "fsutil", "presets"],
        ],
        0,
    ),
    **dict.fromkeys(["checkpoint", "observe", "track", "data", "models", "evaluate"], 1),
    "recipes": 2,
    "train": 3,
    **dict.fromkeys(
        ["accept", "bench", "doctor", "hpo", "sweep", "pipeline", "chaos", "report", "launch"], 4
    ),
    **dict.fromkeys(["cli", "__main__"], 5),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    assert top in ROOMS, f"{module}: add its package to ROOMS in this test (and to ARCHITECTURE.md)"
    return ROOMS[top]


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
    return found & known


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    known = set(paths)
    return {name: _imports(path, known) - {name} for name, path in paths.items()}


def test_no_module_imports_from_a_room_above() -> None:
    upward = [
        f"{src} -> {dst}"
        for src, targets in _graph().items()
        for dst in sorted(targets)
        if _room(dst) > _room(src)
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
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue  # a package and its own submodules (re-exports) are one unit
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
