"""Which class ``run.recipe`` names: a registered name or an import path, found and checked.

``run.recipe`` is either

- a **name** registered in the entry-point group ``hpcpipe.recipes``: a package declares
  ``[project.entry-points."hpcpipe.recipes"] my-recipe = "mypkg.recipes:MyRecipe"`` in its
  pyproject.toml. hpcpipe's built-in recipes are registered exactly so, in hpcpipe's own
  pyproject.toml: the built-ins have no back door;
- or an **import path** ``package.module:Class`` (the current directory is searched last, as
  ``python -m`` would).

The class must derive from ``hpcpipe.Recipe`` (``recipes/base.py``; its ``recipe_api`` says which
version of the API it was written for), implement every abstract method, declare its
``name`` (for an entry point, the entry point's name) and ``val_loss`` among its ``metric_goals``,
and may declare ``Args``: a pydantic model or a dataclass, the schema of the job's ``recipe:``
section.

This module sits in the bottom room (ARCHITECTURE.md): the config validates a job against the class
it names, and every tool above asks it about a recipe, so none of them spells a recipe's name.
It imports no recipe code but the class ``run.recipe`` names, and the config only for type
checking (the config imports this module, lazily, while it validates a job).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import re
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcpipe.errors import ConfigError, one_line
from hpcpipe.recipes.args import is_schema
from hpcpipe.recipes.base import API_VERSION, Recipe

if TYPE_CHECKING:
    from hpcpipe.config import JobConfig

ENTRY_POINT_GROUP = "hpcpipe.recipes"
BUILTIN_PACKAGE = "hpcpipe"
GOALS = ("min", "max")
NAME = re.compile(r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?")  # a Kubernetes label value, lower case


@dataclass(frozen=True)
class Registered:
    """One recipe name in the entry-point group."""

    name: str
    target: str  # "module:Class"
    package: str  # the distribution that registers it
    version: str

    @property
    def builtin(self) -> bool:
        return self.package == BUILTIN_PACKAGE


@dataclass(frozen=True)
class Registry:
    """Every registered name, and the names two packages claim (unusable until one renames)."""

    recipes: dict[str, Registered]
    collisions: dict[str, tuple[Registered, ...]]


@functools.cache
def registry() -> Registry:
    """The entry-point group, read once per process (``refresh()`` after installing a package)."""
    found: dict[str, list[Registered]] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        package = dist.metadata["Name"] if dist is not None else "?"
        entry = Registered(ep.name, ep.value, package, dist.version if dist is not None else "?")
        same = found.setdefault(ep.name, [])
        if all(other.package != entry.package for other in same):
            same.append(entry)
    recipes = {name: entries[0] for name, entries in found.items() if len(entries) == 1}
    collisions = {name: tuple(entries) for name, entries in found.items() if len(entries) > 1}
    return Registry(dict(sorted(recipes.items())), collisions)


def refresh() -> None:
    """Forget what was read and imported: a package was installed or removed since."""
    registry.cache_clear()
    recipe_class.cache_clear()
    importlib.invalidate_caches()


def is_import_path(ref: str) -> bool:
    return ":" in ref


@functools.cache
def recipe_class(ref: str) -> type[Recipe]:
    """The recipe class ``ref`` (a registered name or ``module:Class``) names, checked; a
    ConfigError naming ``run.recipe`` when it names no module or class, or one that is not a
    recipe. An exception raised by the recipe's own module while it imports is a bug of its
    author's, not bad input: RecipeImportError, with that exception as its ``__cause__``."""
    if is_import_path(ref):
        cls = _import(ref, f"run.recipe {ref!r}")
        return _checked(cls, f"run.recipe {ref!r}")
    reg = registry()
    if ref in reg.collisions:
        raise ConfigError(f"run.recipe {ref!r}: {collision_message(ref, reg.collisions[ref])}")
    entry = reg.recipes.get(ref)
    if entry is None:
        raise ConfigError(f"run.recipe: unknown recipe {ref!r} ({_known(reg)})")
    where = f"run.recipe {ref!r} (entry point of {entry.package})"
    cls = _checked(_import(entry.target, where), where)
    if cls.name != ref:
        raise ConfigError(
            f"{where}: {entry.target} is named {cls.name!r}; the entry point's name and the class's "
            "`name` must be the same"
        )
    return cls


def collision_message(name: str, entries: tuple[Registered, ...]) -> str:
    """Why ``name`` is unusable, and the two ways out: uninstall a package, or rename its entry
    point (the user's to choose: hpcpipe does not pick one package's recipe over another's)."""
    packages = " and ".join(entry.package for entry in entries)
    table = f'[project.entry-points."{ENTRY_POINT_GROUP}"] table of its pyproject.toml'
    builtin = next((e for e in entries if e.builtin), None)
    if builtin is not None:
        others = [e.package for e in entries if not e.builtin]
        return (
            f"the name is registered by {packages}: {', '.join(others)} reuses the name of hpcpipe's "
            f"built-in recipe; uninstall it (pip uninstall {' '.join(others)}), or rename its entry "
            f"point in the {table} and reinstall it"
        )
    return (
        f"the name is registered by {packages}; uninstall one (pip uninstall PACKAGE), rename its "
        f"entry point in the {table} and reinstall it, or use module:Class"
    )


def _known(reg: Registry) -> str:
    names = ", ".join(reg.recipes) or "none"
    return f"registered: {names}; or give an import path package.module:Class"


def _import(target: str, where: str) -> Any:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{where}: an import path is package.module:Class")
    if module_name.startswith(".") or "/" in module_name or module_name.endswith(".py"):
        dotted = module_name.removesuffix(".py").lstrip("./").replace("/", ".")
        raise ConfigError(
            f"{where}: an import path names a module, not a file: write {dotted}:{attr}, run "
            "from the file's folder (or put that folder on PYTHONPATH)"
        )
    try:
        module = _import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ConfigError(f"{where}: cannot import {module_name!r} (no module {missing!r})") from None
        raise RecipeImportError(_import_failure(exc, module_name, where)) from exc
    except Exception as exc:  # a bug in the recipe's module, raised while it imports
        raise RecipeImportError(_import_failure(exc, module_name, where)) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            _not_shadowed(module_name, where)  # the installed one of that name lacks it
            raise ConfigError(f"{where}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


class RecipeImportError(Exception):
    """The recipe's module raised while it imported (its ``__cause__``): a bug in the author's
    code, so not a UserError, and not a ValueError, which the config's validators would turn
    into a one-line ValidationError. ``hpcpipe`` prints ``report()`` and exits 1; a worker
    prints it and exits 2, which no restart follows (the restart would import the same module)."""

    def report(self) -> str:
        """What ``hpcpipe`` and a worker print: the module's own traceback, then one error line."""
        return f"{self.user_traceback()}error: {one_line(str(self))}\n"

    def user_traceback(self) -> str:
        """The cause's traceback without the frames of hpcpipe's lookup and of Python's import
        machinery: they say nothing to the module's author."""
        import traceback

        cause = self.__cause__
        if cause is None:
            return ""
        shown = traceback.TracebackException.from_exception(cause)
        frames = [frame for frame in shown.stack if not _machinery(frame.filename)]
        shown.stack = traceback.StackSummary.from_list(frames)
        return "".join(shown.format())


def _machinery(filename: str) -> bool:
    return filename.startswith("<frozen") or filename in (__file__, importlib.__file__)


def _import_failure(exc: Exception, module_name: str, where: str) -> str:
    """One line for an error raised while the recipe's module imports: what, and where in the
    author's code (the innermost frame outside Python's import machinery)."""
    import traceback

    if isinstance(exc, SyntaxError):
        place = f"{exc.filename}:{exc.lineno}"
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
        place = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else module_name
    reason = exc.msg if isinstance(exc, SyntaxError) else one_line(str(exc)[:300])
    return f"{where}: importing {module_name!r} raised {type(exc).__name__} at {place}: {reason}"


def _not_shadowed(module_name: str, where: str) -> None:
    """A file of the working directory named like an installed package (``datasets.py``) loses
    to it: the error would blame a missing attribute of the other package."""
    top = module_name.split(".", maxsplit=1)[0]
    here = Path.cwd()
    ours = (here / f"{top}.py").is_file() or (here / top / "__init__.py").is_file()
    found = sys.modules.get(top)
    origin = getattr(found, "__file__", None)
    if ours and origin is not None and not Path(origin).resolve().is_relative_to(here.resolve()):
        raise ConfigError(
            f"{where}: {top!r} is the installed package at {Path(origin).parent}, not the {top} in "
            f"{here}: rename your module (an installed package of that name comes first)"
        )


def _import_module(name: str) -> types.ModuleType:
    """``importlib.import_module``, finding a module of the current directory too (last)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    return importlib.import_module(name)


def _checked(obj: Any, where: str) -> type[Recipe]:
    if not isinstance(obj, type):
        raise ConfigError(f"{where}: {obj!r} is not a class")
    label = f"{obj.__module__}.{obj.__qualname__}"
    if not issubclass(obj, Recipe):
        raise ConfigError(
            f"{where}: {label} is not a recipe: derive it from hpcpipe.Recipe or hpcpipe.DatasetRecipe"
        )
    if obj.recipe_api != API_VERSION:
        raise ConfigError(
            f"{where}: {label} was written for recipe API {obj.recipe_api}; this hpcpipe has {API_VERSION}"
        )
    missing = sorted(getattr(obj, "__abstractmethods__", ()))
    if missing:
        raise ConfigError(f"{where}: {label} does not implement {', '.join(missing)}")
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: {label}.name must be a class attribute of 1-63 lower-case letters, digits, '-', "
            f"'_' or '.', first and last a letter or digit (it labels metrics and pods); got {name!r}"
        )
    goals = getattr(obj, "metric_goals", None)
    if not isinstance(goals, Mapping) or "val_loss" not in goals or set(goals.values()) - set(GOALS):
        raise ConfigError(
            f"{where}: {label}.metric_goals must map each evaluation metric to 'min' or 'max', "
            "val_loss included"
        )
    if obj.Args is not None and not is_schema(obj.Args):
        raise ConfigError(f"{where}: {label}.Args must be a pydantic model or a dataclass (or None)")
    return obj


def build_recipe(job: JobConfig) -> Recipe:
    """The recipe of ``job`` for this rank: ``from_job`` of the class ``run.recipe`` names."""
    return recipe_class(job.run.recipe).from_job(job)


def names_where(predicate: Callable[[type[Recipe]], bool]) -> list[str]:
    """The registered recipes whose class satisfies ``predicate`` (for messages: "supported: ...";
    a recipe that cannot be imported is left out)."""
    found = []
    for name in registry().recipes:
        try:
            cls = recipe_class(name)
        except Exception:  # a broken package's recipe supports nothing (recipes list says why)
            continue
        if predicate(cls):
            found.append(name)
    return found


def recipe_label(ref: str) -> str:
    """The recipe's own name (for a metric label, a Kubernetes label, a tag): ``ref`` itself for
    a registered name, the class's ``name`` for an import path."""
    return recipe_class(ref).name if is_import_path(ref) else ref


def package_of(cls: type) -> str | None:
    """The installed distribution a recipe class comes from (None: not installed, a path)."""
    top = cls.__module__.partition(".")[0]
    names = importlib.metadata.packages_distributions().get(top)
    return names[0] if names else None
