"""Which committed checkpoint a resume loads: rank 0's choice, broadcast by the store.

Candidates are every committed ``step-*`` of the tiers, newest first (fast before durable for
the same step). The first whose manifest, file names and sizes check is chosen; its hashes are
checked while the ranks load it (``dcp_load.py``), and a load that finds a bad file puts the
candidate in ``failed`` for the next round. Only where a half-loaded model could not be
overwritten by an older checkpoint (``checkpoint.scratch_if_none_verify``) or DeepSpeed's own
loader reads the files (``content=True``) are the hashes checked here, before anything loads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpcpipe.checkpoint.after_commit import problem_events
from hpcpipe.checkpoint.manifest import verify_dir
from hpcpipe.checkpoint.tiers import Tier
from hpcpipe.config import CheckpointConfig

__all__ = ["choose_checkpoint", "earlier_run", "newest_committed", "resume_tiers"]


def choose_checkpoint(
    cfg: CheckpointConfig,
    tiers: list[Tier],
    failed: dict[str, str],
    content: bool,
    event: Callable[[str, dict[str, Any]], None],
) -> dict[str, Any]:
    """``{"action": "load", "path", "tier", "step"}``, ``{"action": "fresh"}`` or
    ``{"action": "error", "message"}``; ``failed`` maps paths whose load failed to their first
    problem; ``checkpoint_fallback``/``checkpoint_none_verify`` events go to ``event``."""
    where = " or ".join(str(tier.root) for tier in tiers)
    candidates = _candidates(tiers)
    if not candidates:
        if cfg.resume == "required":
            return {
                "action": "error",
                "message": f"checkpoint.resume=required but {where} holds no committed checkpoint",
            }
        return {"action": "fresh"}
    first_problem: str | None = next(iter(failed.values()), None)
    for step, tier, path in candidates:
        if str(path) in failed:
            continue
        _, problems = verify_dir(path, content=content)
        if not problems:
            return {"action": "load", "path": str(path), "tier": tier, "step": step}
        problem_events(event, "checkpoint_fallback", step, path, tier, problems)
        first_problem = first_problem or f"{path}/{problems[0]}"
    summary = f"no checkpoint in {where} verifies (newest: {first_problem})"
    if cfg.scratch_if_none_verify and cfg.resume != "required":
        if failed:  # a load failed part-way: this process's model is no longer as built
            return {
                "action": "error",
                "message": f"{summary}; a load failed part-way and left the model partly loaded: "
                "run again to start from scratch",
            }
        event("checkpoint_none_verify", {"action": "start from scratch", "detail": summary})
        return {"action": "fresh"}
    hint = "set checkpoint.scratch_if_none_verify=true to start from scratch"
    return {"action": "error", "message": f"{summary}; {hint}"}


def resume_tiers(cfg: CheckpointConfig, fast: Path) -> list[Tier]:
    """The tiers a resume chooses from: ``fast`` (the store's root), then ``checkpoint.durable_dir``."""
    return [Tier("fast", fast)] + ([Tier("durable", Path(cfg.durable_dir))] if cfg.durable_dir else [])


def newest_committed(tiers: list[Tier]) -> tuple[int, Path] | None:
    """(step, directory) of the checkpoint a resume tries first: the newest committed of
    ``tiers``, the fast tier's for a step both hold (not verified; read-only). A fast tier
    lost with its node, or pruned, leaves the durable tier's: a resume loads that."""
    candidates = _candidates(tiers)
    return (candidates[0][0], candidates[0][2]) if candidates else None


def _candidates(tiers: list[Tier]) -> list[tuple[int, str, Path]]:
    found = [(step, tier.name, path) for tier in tiers for step, path in tier.committed()]
    return sorted(found, key=lambda c: (-c[0], c[1] != "fast"))


def earlier_run(tiers: list[Tier], env: Mapping[str, str]) -> str | None:
    """Why ``checkpoint.resume=never`` must not start here, or None: the tiers hold an earlier
    run's committed checkpoints. The new run's saves would replace the old ones of the same
    steps and leave the higher ones, which the next resume would load as this run's newest. A
    restart of this job (the elastic agent's, a Slurm requeue: ``env``) starts fresh again."""
    counts = (env.get(var, "0") or "0" for var in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"))
    if any(count.isdigit() and int(count) > 0 for count in counts):
        return None
    try:
        committed = {str(tier.root): [step for step, _ in tier.committed()] for tier in tiers}
    except OSError as exc:
        return f"cannot read checkpoints: {exc}"
    holding = {root: max(steps) for root, steps in committed.items() if steps}
    if not holding:
        return None
    where = ", ".join(f"{root} (newest step {step})" for root, step in holding.items())
    return (
        f"checkpoint.resume=never: committed checkpoints of an earlier run are in {where}; "
        "give the new run another run.name, or remove them"
    )
