"""What a job changes against the config a run directory recorded: the keys a user should look
at when the run's checkpoints refuse the job ("does not load into this model")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hpcpipe.config.job import TRAINING_KEYS, WAITING_KEYS, JobConfig
from hpcpipe.yamlfile import load_yaml_text

SHOWN = 5  # keys named in one line; the rest counted

# Keys under TRAINING_KEYS that decide where the same training runs, how fast, and how it reads
# its data, never what it trains or on which data (each field's description in config/data.py and
# config/parallel.py): a per-job $TMPDIR cache, more loader workers or another strategy for a run
# that trained to its last step change nothing in its model. Kept: data keys that make the data or
# what a step sees (sources, max_train_samples, augment), parallel.sync_gradients (ranks diverge),
# broadcast_buffers (BatchNorm statistics) and deepspeed_config (it may set precision or clipping).
PLACEMENT_KEYS = (
    *WAITING_KEYS,
    *(f"data.{key}" for key in ("prepared_dir", "cache_dir", "num_workers", "pin_memory")),
    *(f"data.{key}" for key in ("persistent_workers", "prefetch_factor")),
    *(f"parallel.{key}" for key in ("strategy", "zero_stage", "offload_optimizer", "offload_params")),
    *(f"parallel.{key}" for key in ("nproc", "nnodes", "tp", "pp", "pp_schedule", "virtual_stages")),
    *(f"parallel.{key}" for key in ("pp_split", "backend", "threads_per_rank", "bucket_cap_mb")),
    *(f"parallel.{key}" for key in ("gradient_as_bucket_view", "static_graph", "find_unused_parameters")),
    *(f"parallel.{key}" for key in ("worker_start", "retain_host_memory")),
    # speed and memory, not what is trained (the same gradients, up to the order of sums)
    "train.compile",
    "train.activation_checkpointing",
    "model.gradient_checkpointing",
)


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
    """``key old -> new`` for every value under TRAINING_KEYS (less PLACEMENT_KEYS) that differs
    between two job trees: nested as config.yaml, or keyed by TRAINING_KEYS as ``hpcpipe run``
    records its train step's inputs (both flatten to the same dotted keys)."""
    old, new = _flat(before), _flat(now)
    return [
        f"{key} {old.get(key)!r} -> {new.get(key)!r}"
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
        and key not in PLACEMENT_KEYS
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
