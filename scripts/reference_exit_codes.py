"""docs/reference/exit-codes.md: the exit codes hpcpipe gives, from every module-level
``<NAME>_EXIT_CODE = <int>`` in src/hpcpipe and the text that documents it there (the docstring
under it, the comment on its line, or the comment block above it)."""

from __future__ import annotations

import ast
from pathlib import Path

from reference_markdown import MissingDescription, from_docstring, page, table

import hpcpipe

SRC = Path(hpcpipe.__file__).parent
# Not constants in the code: the conventions every command follows.
CONVENTIONS = {
    0: ("-", "Success."),
    1: (
        "-",
        "A failure that is not bad input: an uncaught error, or a check that failed (`doctor`, "
        "`accept`, `chaos run`, `chaos report`, `ckpt verify`, ...).",
    ),
    128: (
        "-",
        "128 + N: killed by signal N (137 = SIGKILL, e.g. the out-of-memory killer), as the shell "
        "reports it.",
    ),
}


def _comment_above(lines: list[str], lineno: int) -> str:
    block: list[str] = []
    i = lineno - 2
    while i >= 0 and lines[i].lstrip().startswith("#"):
        block.insert(0, lines[i].lstrip()[1:].strip())
        i -= 1
    return " ".join(block)


def _meaning(body: list[ast.stmt], index: int, lines: list[str]) -> str:
    node = body[index]
    following = body[index + 1] if index + 1 < len(body) else None
    if (
        isinstance(following, ast.Expr)
        and isinstance(following.value, ast.Constant)
        and isinstance(following.value.value, str)
    ):
        return from_docstring(following.value.value)
    line = lines[node.lineno - 1]
    if "#" in line:
        return line.split("#", 1)[1].strip()
    return _comment_above(lines, node.lineno)


def codes() -> list[tuple[int, str, str]]:
    """(code, ``module.NAME``, meaning) for every ``*_EXIT_CODE`` constant."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        body = ast.parse(text).body
        for index, node in enumerate(body):
            if not (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                continue
            name = node.targets[0].id
            if (
                name.endswith("EXIT_CODE")
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, int)
            ):
                module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
                meaning = _meaning(body, index, lines)
                if not meaning:
                    raise MissingDescription(
                        f"{module}.{name} has no docstring or comment saying what it means"
                    )
                found.append((node.value.value, f"{module}.{name}", meaning))
    return found


def build() -> str:
    rows: list[tuple[object, ...]] = [(code, name, text) for code, (name, text) in CONVENTIONS.items()]
    rows += [(code, f"`{name}`", text) for code, name, text in codes()]
    rows.sort(key=lambda r: (int(str(r[0])), str(r[1])))
    intro = (
        "What `hpcpipe`'s exit code tells a script, a scheduler (Slurm's requeue, a Kubernetes "
        "restart policy) or an HPO study. Bad input always ends with one line naming the key, flag "
        "or file, and exit code 2."
    )
    return page("Exit codes", intro, table(("Code", "Constant", "Meaning"), rows))
