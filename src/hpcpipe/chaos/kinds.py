"""The scenario kinds, by name: each is a function taking a TrialContext and returning a
TrialResult, in the module its group names (``runner.resolve`` imports it when a trial runs).

Only names here (no imports: scenario.py checks kinds against them, and the kinds' modules import
scenario.py). Validating a scenario file imports no trainer, and each kind's module stays one
concern (training faults, checkpoint faults, input and security checks, the harness's own).
"""

from __future__ import annotations

KINDS: tuple[str, ...] = (
    # The harness's own: one passes, one must fail (so the harness is shown able to fail).
    "always_pass",
    "must_fail",
    # Faults in a running group.
    "kill_rank",
    "always_fail",
    "oom",
    "stall",
    "slow_rank",
    "lost_node",
    # Faults around checkpoints.
    "kill_during_save",
    "sigterm_during_save",
    "corrupt_checkpoint",
    "disk_full",
    # Bad input and security.
    "fuzz_config",
    "malicious_pickle",
    "secrets",
    "loopback_only",
)

# The params each kind reads (``TrialContext.param``): name -> (type, smallest value, the bound it
# must stay below or None). Checked when the scenario file loads: an unknown key was ignored (a
# misspelt one silently took its default), and a value out of range failed every trial, maybe hours
# in, as "not recovered". Numbers are finite; a bound is what the fault injector accepts
# (``train/fault_injection.py``: HPCPIPE_CHAOS_SLOW seconds in (0, 3600)).
KIND_PARAMS: dict[str, dict[str, tuple[type, float, float | None]]] = {
    "kill_rank": {"max_restarts": (int, 0, None)},
    "always_fail": {"max_restarts": (int, 0, None)},
    "oom": {"rel_tolerance": (float, 0.0, None)},
    "stall": {"hang_timeout_s": (float, 0.1, None)},  # below the scenario's and the job's timeouts
    "slow_rank": {"seconds": (float, 0.001, 3600.0)},
    "lost_node": {"rel_tolerance": (float, 0.0, None)},
    "fuzz_config": {"cases": (int, 1, None)},
    "loopback_only": {"steps": (int, 1, None)},
}

STALL_HANG_TIMEOUT_S = 4.0  # the stall kind's params.hang_timeout_s when the scenario gives none
