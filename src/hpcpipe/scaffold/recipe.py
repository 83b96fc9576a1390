"""Write a recipe package: pyproject.toml (the entry point), the recipe module, a job, a README,
a Dockerfile on top of hpcpipe's image (with a .dockerignore that keeps runs and local
environments out of it), and a test that runs ``hpcpipe recipes check``. The files
are Jinja2 templates (``templates/recipe/``); every one is rendered before any is written."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from hpcpipe.errors import UserError
from hpcpipe.recipes.registry import NAME

# What each template becomes, relative to the package directory ({module}: the import name).
FILES = {
    "pyproject.toml.j2": "pyproject.toml",
    "README.md.j2": "README.md",
    "job.yaml.j2": "job.yaml",
    "Dockerfile.j2": "Dockerfile",
    "dockerignore.j2": ".dockerignore",
    "init.py.j2": "src/{module}/__init__.py",
    "recipe.py.j2": "src/{module}/recipe.py",
    "test_recipe.py.j2": "tests/test_recipe.py",
}


@dataclass(frozen=True)
class Names:
    recipe: str  # run.recipe's name: my-recipe
    module: str  # the Python package: my_recipe
    cls: str  # the recipe class: MyRecipe
    dist: str  # the distribution (pip install): my-recipe


def names_for(name: str) -> Names:
    """The names of a recipe ``name``; UserError unless it is a valid recipe name."""
    if not NAME.fullmatch(name) or not re.fullmatch(r"[a-z][a-z0-9-]*", name):
        raise UserError(
            f"NAME {name!r}: use lower-case letters, digits and '-', starting with a letter (e.g. my-recipe)"
        )
    from hpcpipe.recipes.registry import registry

    taken = registry()
    holder = taken.recipes.get(name) or next(iter(taken.collisions.get(name, ())), None)
    if holder is not None:  # installed, the two packages' recipe would be unusable, the built-in too
        raise UserError(f"NAME {name!r}: a recipe of {holder.package} has that name; choose another")
    module = name.replace("-", "_")
    if importlib.util.find_spec(module) is not None:
        raise UserError(
            f"NAME {name!r}: its module {module!r} would shadow an installed one; choose another name"
        )
    if _installed_distribution(name):  # `pip install -e` of the package would replace it
        raise UserError(f"NAME {name!r}: an installed distribution has that name; choose another name")
    cls = "".join(part.capitalize() for part in module.split("_")) + "Recipe"
    return Names(name, module, cls, name)


def _installed_distribution(name: str) -> bool:
    """Whether a distribution of that name (compared as pip does: -, _ and . alike) is installed:
    ``pyyaml``'s module is ``yaml``, so the module check above misses it."""
    import importlib.metadata

    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def write_package(name: str, out: Path, hpcpipe_version: str) -> list[Path]:
    """Render every template for ``name`` into ``out`` (which must not exist or be empty)."""
    import jinja2

    names = names_for(name)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out}: exists and is not empty; choose another --dir")
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("hpcpipe.scaffold", "templates/recipe"),
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    rendered = {
        out / target.format(module=names.module): env.get_template(template).render(
            n=names, hpcpipe_version=hpcpipe_version
        )
        for template, target in FILES.items()
    }
    for path, text in rendered.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return sorted(rendered)
