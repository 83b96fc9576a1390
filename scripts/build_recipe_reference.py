"""Generate docs/reference/recipe-api.md, the reference of hpcpipe's public recipe API, from the code.

    .venv/bin/python scripts/build_recipe_reference.py [OUT]   (default: docs/reference/recipe-api.md)

Every public name of the recipe API (``hpcpipe.Recipe``, ``hpcpipe.DatasetRecipe`` and what their
methods take and return, ``hpcpipe.testing``) with its signature, its declared attributes and its
docstring. tests/unit/project/test_recipe_reference.py regenerates it and compares: edit the docstrings,
not the Markdown.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from pathlib import Path
from typing import Any

import hpcpipe
import hpcpipe.testing
from hpcpipe.recipes.base import Recipe

OUT = Path(__file__).resolve().parents[1] / "docs" / "reference" / "recipe-api.md"
CLASSES = (
    "Recipe",
    "DatasetRecipe",
    "Datasets",
    "RecipeContext",
    "ExportRequest",
    "DataSummary",
    "PaddingBatch",
    "TrainLoader",
)
HEADER = """# Recipe API reference

Generated from the code by `scripts/build_recipe_reference.py` (a test keeps it current). What is
public: the names below, importable from `hpcpipe` (and `hpcpipe.testing`), and the entry-point
group `hpcpipe.recipes`; everything else in hpcpipe may change between versions. A recipe written
for another version of this API (`Recipe.recipe_api`) is refused with one line. The tutorial is
[Your own model](../your-own-model.md).
"""


def _doc(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__ or "").strip()


def _signature(obj: Any) -> str:
    try:
        return str(inspect.signature(obj)).replace("'", "")
    except (TypeError, ValueError):
        return "(...)"


def _comments(cls: type) -> dict[str, str]:
    """Each annotated class attribute's comment in the source: the comment lines just above it
    and the one at the end of its line."""
    source, _ = inspect.getsourcelines(cls)
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(textwrap.dedent("".join(source)))):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            line = node.lineno - 1
            above = []
            while line > 0 and source[line - 1].strip().startswith("#") and "# --" not in source[line - 1]:
                line -= 1
                above.insert(0, source[line].strip().lstrip("# "))
            own = source[node.lineno - 1].partition("  # ")[2].strip()
            found[node.target.id] = " ".join([*above, own]).strip()
    return found


def _declared(cls: type) -> list[str]:
    """The class attributes a recipe declares (annotated in hpcpipe.Recipe) with their defaults."""
    lines = []
    comments = _comments(cls)
    for name, annotation in inspect.get_annotations(cls).items():
        if name.startswith("_"):
            continue
        default = getattr(cls, name, inspect.Parameter.empty)
        shown = "" if default is inspect.Parameter.empty else f" = `{default!r}`"
        kind = str(annotation)
        kind = kind.removeprefix("ClassVar[").removesuffix("]") if kind.startswith("ClassVar[") else kind
        note = f": {comments[name]}" if comments.get(name) else ""
        lines.append(f"- `{name}: {kind}`{shown}{note}")
    return lines


def _methods(cls: type) -> list[str]:
    lines = []
    for name, member in cls.__dict__.items():
        if name.startswith("_") and name != "__init__":
            continue
        func = member.__func__ if isinstance(member, classmethod | staticmethod) else member
        if isinstance(member, property):
            lines += [f"#### `{name}` (property)", "", _doc(member.fget), ""]
        elif inspect.isfunction(func):
            prefix = "classmethod " if isinstance(member, classmethod) else ""
            abstract = " *(abstract: yours to write)*" if getattr(func, "__isabstractmethod__", False) else ""
            lines += [
                f"#### {prefix}`{name}{_signature(func)}`{abstract}",
                "",
                _doc(func) or "(no docstring)",
                "",
            ]
    return lines


def _class(name: str) -> list[str]:
    cls = getattr(hpcpipe, name)
    bases = ", ".join(b.__name__ for b in cls.__bases__ if b is not object)
    lines = [f"## `hpcpipe.{name}`" + (f" ({bases})" if bases else ""), "", _doc(cls), ""]
    if cls is Recipe or (isinstance(cls, type) and issubclass(cls, Recipe)):
        declared = _declared(cls)
        if declared:
            lines += ["### Declared attributes", "", *declared, ""]
    elif inspect.get_annotations(cls) and name != "TrainLoader":
        fields = ", ".join(f"`{k}: {v}`" for k, v in inspect.get_annotations(cls).items())
        lines += [f"Fields: {fields}.", ""]
    methods = _methods(cls)
    if methods:
        lines += ["### Methods", "", *methods]
    return lines


def _testing() -> list[str]:
    mod = hpcpipe.testing
    lines = ["## `hpcpipe.testing`", "", _doc(mod), ""]
    for name in ("assert_recipe_passes", "check_recipe"):
        func = getattr(mod, name)
        lines += [f"#### `{name}{_signature(func)}`", "", _doc(func), ""]
    lines += [
        "The properties, in the order they run: " + ", ".join(f"`{p}`" for p in mod.PROPERTIES) + ".",
        "",
    ]
    return lines


def build() -> str:
    lines = [HEADER]
    for name in CLASSES:
        lines += _class(name)
    lines += _testing()
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(build())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
