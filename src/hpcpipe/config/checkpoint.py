"""The ``checkpoint:`` section: when and where checkpoints are written, kept and verified."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field

from hpcpipe.config.section import Section


class CheckpointConfig(Section):
    """Checkpoints: DCP shards + a manifest of file hashes, committed atomically, in two tiers.

    ``async`` is a Python keyword, so the field is ``async_save`` in code and ``async`` in YAML
    and ``--set checkpoint.async=true`` (both spellings are accepted when reading).
    """

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    every_steps: int = Field(
        0, ge=0, description="Save a checkpoint every N optimizer steps (0: no periodic saves)."
    )
    keep_last: int = Field(
        3,
        ge=1,
        description="Committed checkpoints kept per tier, newest first (the newest "
        "verified one and the one training resumed from are never deleted).",
    )
    keep_every: int = Field(
        0,
        ge=0,
        description="Also keep forever every checkpoint whose step is a multiple of "
        "this (0: none), e.g. for later evaluation.",
    )
    async_save: bool = Field(
        False,
        alias="async",
        description="Write in the background: training blocks only while the state is copied "
        "to CPU memory (costs one extra copy of the model + optimizer state in RAM).",
    )
    dir: str | None = Field(
        None,
        min_length=1,
        description="Fast tier, written at every save (node-local disk is fine on one "
        "node; every rank must see it); null: <run_dir>/checkpoints.",
    )
    durable_dir: str | None = Field(
        None,
        min_length=1,
        description="Durable tier (shared file system): committed fast checkpoints are "
        "copied there in the background and verified; null: no durable tier.",
    )
    durable_every_steps: int = Field(
        0,
        ge=0,
        description="Copy to the durable tier when the step is a multiple of this "
        "(0 with durable_every_s 0: copy every checkpoint).",
    )
    durable_every_s: float = Field(
        0.0,
        ge=0,
        description="Also copy to the durable tier when this many seconds passed "
        "since the last durable copy (0: no time-based copies).",
    )
    resume: Literal["auto", "never", "required"] = Field(
        "auto",
        description="auto: resume from the newest verified checkpoint if any; never: "
        "always start fresh (refused, exit 2, where the run already holds committed checkpoints: "
        "they would mix with the new run's); required: fail (exit 2) when there is nothing to "
        "resume from.",
    )
    scratch_if_none_verify: bool = Field(
        False,
        description="When checkpoints exist but none verifies, start from scratch "
        "instead of failing with exit code 2.",
    )
    io_threads: int = Field(2, ge=1, le=64, description="Writer threads per rank (one file each per save).")
    hash: Literal["sha256", "blake3"] = Field(
        "blake3",
        description="File hash in the manifest: blake3 (a 111 MB restore took 0.060 CPU-s with it "
        "against 0.102 with sha256, 2026-11-26: benchmarks/README.md; a restore hashes every byte it "
        "reads), or sha256 (FIPS sites, `sha256sum -c`). Each manifest names its "
        "hash: checkpoints of either kind always verify.",
    )
    memory_tier: bool = Field(
        True,
        description="Keep each node's files of the newest checkpoint in /dev/shm, owned by the node's "
        "agent, so a worker restarted on the same node restores from memory (checked against the "
        "disk checkpoint's hashes). Only runs started through hpcpipe's agent have one.",
    )
    memory_limit_gb: float | None = Field(
        None,
        gt=0,
        description="Most the memory tier may hold per node, in GB (null: half of /dev/shm); a "
        "checkpoint larger than this is not kept in memory. Larger than /dev/shm: refused.",
    )


def own_checkpoint_dirs(checkpoint: CheckpointConfig, name: str, scope: Path) -> dict[str, str]:
    """``checkpoint.dir`` and ``durable_dir`` given outside the run directory, made one run's own
    (``<dir>/<scope name>-<hash of scope>/<name>``) for runs started side by side from one config
    (sweep points, HPO trials; ``scope``: the sweep's or study's directory): one shared directory
    had every run resume the one before it, and a name alone the same run of another sweep."""
    import hashlib

    tag = f"{scope.name}-{hashlib.sha256(str(scope.absolute()).encode()).hexdigest()[:8]}"
    given = {"checkpoint.dir": checkpoint.dir, "checkpoint.durable_dir": checkpoint.durable_dir}
    return {key: str(Path(value) / tag / name) for key, value in given.items() if value}
