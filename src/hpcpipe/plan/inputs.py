"""Which cost comes from where: given on the command line, measured in a run, or defaulted.

A given time wins over a measured one, and a measured one over a default; every cost keeps its
source so the plan can say which is which. The fast tier is always planned; the durable tier when
its save cost is given or the run copied to it. Each tier is planned as if it alone recovered
every failure (a node-local fast tier does not survive the loss of its node).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout
from hpcpipe.plan.measured import DURABLE, FAST, RunTimes, Timing

# Restart when neither given nor measured: on a cluster, failure detection, a new allocation or
# the agent's relaunch, process start, rendezvous and communicator set-up take minutes.
DEFAULT_RESTART_S = 120.0
_NOTHING_MEASURED = RunTimes(run_dir=Path())


@dataclass(frozen=True)
class GivenTimes:
    """Seconds given on the command line (None: not given); the names are the options'."""

    save_s: float | None = None
    restore_s: float | None = None
    restart_s: float | None = None
    durable_save_s: float | None = None
    durable_restore_s: float | None = None


@dataclass(frozen=True)
class TierCosts:
    """One checkpoint tier: δ (what a save costs training), its restore, hpcpipe's interval."""

    tier: str
    save: Timing
    restore: Timing
    current_interval_s: float | None = None


@dataclass(frozen=True)
class PlanInputs:
    tiers: tuple[TierCosts, ...]
    restart: Timing  # the restart alone; each tier adds its own restore
    run: RunTimes | None = None


def resolve_inputs(given: GivenTimes, run: RunTimes | None) -> PlanInputs:
    """The costs to plan with; ``UserError`` naming the option or file when the save cost of the
    fast tier is neither given nor measured."""
    _check_given(given)
    measured = run if run is not None else _NOTHING_MEASURED
    fast_save = _pick(given.save_s, "--save-s", measured.save.get(FAST))
    if fast_save is None:
        if run is None:
            raise UserError("give --run RUN_DIR (measured times) or --save-s SECONDS (given times)")
        raise UserError(
            f"{RunLayout(run.run_dir).events}: no checkpoint_staged or checkpoint_committed event to "
            "measure the save time from (set checkpoint.every_steps and train, or give --save-s)"
        )
    tiers = [_tier(FAST, fast_save, given.restore_s, "--restore-s", measured)]
    durable_save = _pick(given.durable_save_s, "--durable-save-s", measured.save.get(DURABLE))
    if durable_save is None and given.durable_restore_s is not None:
        raise UserError(
            "--durable-restore-s needs --durable-save-s (or a run that copied to the durable tier)"
        )
    if durable_save is not None:
        tiers.append(_tier(DURABLE, durable_save, given.durable_restore_s, "--durable-restore-s", measured))
    restart = _pick(given.restart_s, "--restart-s", measured.restart) or Timing(
        DEFAULT_RESTART_S, f"default: {DEFAULT_RESTART_S:g} s (no restart measured; give --restart-s)"
    )
    _check_measured(tiers, restart)
    return PlanInputs(tuple(tiers), restart, run)


def _tier(tier: str, save: Timing, restore_s: float | None, option: str, measured: RunTimes) -> TierCosts:
    restore = _pick(restore_s, option, measured.restore.get(tier)) or Timing(
        save.seconds, f"default: = save time (no restore measured; give {option})"
    )
    return TierCosts(tier, save, restore, measured.intervals.get(tier))


def _pick(value: float | None, option: str, measured: Timing | None) -> Timing | None:
    return Timing(value, f"given: {option}") if value is not None else measured


def _check_given(given: GivenTimes) -> None:
    for option, value in (("--save-s", given.save_s), ("--durable-save-s", given.durable_save_s)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UserError(f"{option} must be a number of seconds > 0 (got {value:g})")
    for option, value in (
        ("--restore-s", given.restore_s),
        ("--restart-s", given.restart_s),
        ("--durable-restore-s", given.durable_restore_s),
    ):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UserError(f"{option} must be a number of seconds >= 0 (got {value:g})")


def _check_measured(tiers: list[TierCosts], restart: Timing) -> None:
    """A run's events can hold a 0 s save (a clock's resolution) or worse: the plan divides by it."""
    for tier in tiers:
        if not (math.isfinite(tier.save.seconds) and tier.save.seconds > 0):
            raise UserError(
                f"{tier.tier} save time {tier.save.seconds:g} s ({tier.save.source}): give --save-s"
            )
    for timing in [t.restore for t in tiers] + [restart]:
        if not (math.isfinite(timing.seconds) and timing.seconds >= 0):
            raise UserError(f"time {timing.seconds:g} s ({timing.source}) is not a duration: give it instead")
