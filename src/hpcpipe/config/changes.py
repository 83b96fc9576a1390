"""What a job changes against the config a run directory recorded: the keys a user should look
at when the run's checkpoints refuse the job ("does not load into this model")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hpcpipe.config.job import TRAINING_KEYS, WAITING_KEYS, JobConfig
from hpcpipe.yamlfile import load_yaml_text

SHOWN = 5  # keys named in one line; the rest counted


def changed_keys(recorded: Path, job: JobConfig) -> list[str]:
    """``section.key old -> new`` for every key whose value differs from the YAML at ``recorded``
    (none when it is missing or unreadable: nothing to compare with)."""
    try:
        before = load_yaml_text(recorded.read_text())  # as the job was read: 1e-3 is 0.001
    except (OSError, yaml.YAMLError):
        return []
    if not isinstance(before, dict):
        return []
    old, new = _flat(before), _flat(job.to_dict())
    return [
        f"{key} {old.get(key)!r} -> {new.get(key)!r}"
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    ]


def training_changes(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``key old -> new`` for every value under TRAINING_KEYS (less WAITING_KEYS) that differs
    between two job trees: nested as config.yaml, or keyed by TRAINING_KEYS as ``hpcpipe run``
    records its train step's inputs (both flatten to the same dotted keys)."""
    old, new = _flat(before), _flat(now)
    return [
        f"{key} {old.get(key)!r} -> {new.get(key)!r}"
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
        and key not in WAITING_KEYS  # recorded by older versions; never what is trained
        and any(key == top or key.startswith(f"{top}.") for top in TRAINING_KEYS)
    ]


def describe_changes(recorded: Path, job: JobConfig) -> str:
    """``"; changed since the run's config.yaml: model.d_model 32 -> 64"`` or ``""``."""
    changes = changed_keys(recorded, job)
    if not changes:
        return ""
    more = f" and {len(changes) - SHOWN} more" if len(changes) > SHOWN else ""
    return f"; changed since {recorded}: {', '.join(changes[:SHOWN])}{more}"


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat
