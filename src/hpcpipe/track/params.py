"""A run's identity for trackers: the flattened config as parameters, lineage as tags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpcpipe.fsutil import read_json_object
from hpcpipe.layout import RunLayout

LINEAGE_TAGS = ("git_sha", "config_hash", "dataset_manifest_sha256", "world_size", "job_id")


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 1e-3}} -> {"train.lr": 1e-3}; lists and None stay values."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def as_text(value: Any) -> str:
    """A parameter value as trackers store it (JSON for lists, dicts and null)."""
    return value if isinstance(value, str) else json.dumps(value)


def lineage_tags(run_dir: Path) -> dict[str, str]:
    """hpcpipe.* tags from ``lineage.json``: code, config, data, hosts, world size."""
    lineage = read_json_object(RunLayout(run_dir).lineage)
    tags = {f"hpcpipe.{k}": str(lineage[k]) for k in LINEAGE_TAGS if lineage.get(k) is not None}
    if lineage.get("hosts"):
        tags["hpcpipe.hosts"] = ",".join(lineage["hosts"])
    tags["hpcpipe.run_dir"] = str(run_dir.resolve())
    return tags
