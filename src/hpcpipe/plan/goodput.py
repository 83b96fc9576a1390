"""The goodput plan: for each cluster size and checkpoint tier, the optimal interval, the goodput
it gives (closed form and simulated), hpcpipe's current interval, and the headroom to 5%."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from hpcpipe.plan.closed_form import checkpoint_share, daly_interval, goodput, young_interval
from hpcpipe.plan.failures import DEFAULT_GPU_MTBF_HOURS, job_mtbf_s
from hpcpipe.plan.headroom import LOSS_BUDGET, delta_at_loss, restart_at_loss
from hpcpipe.plan.inputs import PlanInputs, TierCosts
from hpcpipe.plan.simulate import simulate_goodput

# The simulation must agree with the closed form to this relative difference (it does to ~0.01%
# with 1000 replicas of 30 days; a row that does not is flagged, not hidden).
SIM_TOLERANCE = 0.01


@dataclass(frozen=True)
class PlanSettings:
    gpus: tuple[int, ...]
    gpu_mtbf_hours: float = DEFAULT_GPU_MTBF_HOURS
    horizon_days: float = 30.0  # training simulated per replica
    replicas: int = 1000
    seed: int = 0


def plan_goodput(inputs: PlanInputs, settings: PlanSettings) -> dict[str, Any]:
    """The plan as a JSON-able dict: settings, the costs with their sources, one row per
    (cluster size, tier)."""
    rows = [
        _row(gpus, tier, inputs.restart.seconds, settings) for gpus in settings.gpus for tier in inputs.tiers
    ]
    gaps = [abs(r["sim_gap"]) for r in rows if r["sim_gap"] is not None]
    return {
        "settings": asdict(settings),
        "loss_budget": LOSS_BUDGET,
        "sim_tolerance": SIM_TOLERANCE,
        "max_sim_gap": max(gaps, default=None),
        "run_dir": str(inputs.run.run_dir) if inputs.run else None,
        "step_time_s": inputs.run.step_time_s if inputs.run else None,
        "notes": list(inputs.run.notes) if inputs.run else [],
        "costs": {
            **{
                f"{t.tier}_{cost}": asdict(getattr(t, cost))
                for t in inputs.tiers
                for cost in ("save", "restore")
            },
            "restart": asdict(inputs.restart),
        },
        "rows": rows,
    }


def _row(gpus: int, tier: TierCosts, restart_s: float, settings: PlanSettings) -> dict[str, Any]:
    mtbf = job_mtbf_s(settings.gpu_mtbf_hours, gpus)
    delta = tier.save.seconds
    restart = restart_s + tier.restore.seconds  # R of the model: restart, then restore
    daly = daly_interval(delta, mtbf)
    closed = float(goodput(daly, delta, restart, mtbf))
    horizon_s = settings.horizon_days * 86400.0
    sim = simulate_goodput(daly, delta, restart, mtbf, horizon_s, settings.replicas, settings.seed)
    delta_5 = delta_at_loss(mtbf)
    restart_5 = restart_at_loss(delta, mtbf)
    current = tier.current_interval_s
    return {
        "gpus": gpus,
        "job_mtbf_s": mtbf,
        "tier": tier.tier,
        "delta_s": delta,
        "restart_s": restart,
        "tau_young_s": young_interval(delta, mtbf),
        "tau_daly_s": daly,
        "goodput": closed,
        "goodput_sim": sim.goodput if sim else None,
        "goodput_sim_stderr": sim.stderr if sim else None,
        "sim_gap": (sim.goodput - closed) / closed if sim and closed > 0 else None,
        "checkpoint_share": checkpoint_share(daly, delta, restart, mtbf),
        "failure_share": 1.0 - closed - checkpoint_share(daly, delta, restart, mtbf),
        "current_tau_s": current,
        "goodput_current": float(goodput(current, delta, restart, mtbf)) if current else None,
        "delta_at_budget_s": delta_5,
        "delta_headroom": delta_5 / delta,
        "restart_at_budget_s": restart_5,
        "restart_headroom": restart_5 / restart if restart_5 is not None and restart > 0 else None,
    }
