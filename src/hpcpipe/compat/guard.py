"""The guard every entry point of ``hpcpipe.compat`` resolves torch's private names through."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch


class TorchAPIError(RuntimeError):
    """The installed torch lacks an API hpcpipe relies on (raised with both named)."""

    def __init__(self, missing: str, purpose: str) -> None:
        super().__init__(
            f"torch {torch.__version__} has no {missing} (hpcpipe uses it to {purpose}); "
            "install a torch version hpcpipe was tested with (see docs/install.md)"
        )
        self.missing = missing


def require(owner: Any, name: str, purpose: str) -> Any:
    """``owner.name`` (``owner`` a module path, module, class or object) or TorchAPIError."""
    where = owner if isinstance(owner, str) else getattr(owner, "__name__", type(owner).__qualname__)
    try:
        target = importlib.import_module(owner) if isinstance(owner, str) else owner
    except ImportError:
        raise TorchAPIError(f"module {owner}", purpose) from None
    try:
        return getattr(target, name)
    except AttributeError:
        raise TorchAPIError(f"{where}.{name}", purpose) from None


def probe(owner: Any, *names: str, purpose: str) -> Callable[[], Any]:
    """A probe resolving ``owner.names[0].names[1]...`` (each step through ``require``)."""

    def resolve() -> Any:
        target = owner
        for name in names:
            target = require(target, name, purpose)
        return target

    return resolve
