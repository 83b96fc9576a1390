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
