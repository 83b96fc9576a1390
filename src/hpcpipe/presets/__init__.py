"""Shipped YAML presets: a preset name resolves to a file in this package."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from hpcpipe.errors import ConfigError


def preset_names() -> list[str]:
    root = resources.files(__name__)
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def preset_path(name: str) -> Path:
    path = Path(str(resources.files(__name__).joinpath(f"{name}.yaml")))
    if not path.is_file():
        known = ", ".join(preset_names())
        raise ConfigError(f"unknown preset {name!r} (presets: {known}; or give a path to a .yaml)")
    return path
