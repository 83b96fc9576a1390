"""The scenario kinds: name -> ``module:function`` taking a TrialContext, returning a TrialResult.

Only names here (no imports: scenario.py checks kinds against this map, and the kinds' modules
import scenario.py). The runner resolves a name when a trial runs, so validating a scenario file
imports no trainer, and each kind's module stays one concern (training faults, checkpoint faults,
input and security checks, the harness's own).
"""

from __future__ import annotations

KINDS: dict[str, str] = {
    # The harness's own: one passes, one must fail (so the harness is shown able to fail).
    "always_pass": "hpcpipe.chaos.harness:always_pass",
    "must_fail": "hpcpipe.chaos.harness:must_fail",
    # Faults in a running group.
    "kill_rank": "hpcpipe.chaos.training:kill_rank",
    "always_fail": "hpcpipe.chaos.training:always_fail",
    "oom": "hpcpipe.chaos.training:oom",
    "stall": "hpcpipe.chaos.training:stall",
    "slow_rank": "hpcpipe.chaos.training:slow_rank",
    "lost_node": "hpcpipe.chaos.training:lost_node",
    # Faults around checkpoints.
    "kill_during_save": "hpcpipe.chaos.saving:kill_during_save",
    "sigterm_during_save": "hpcpipe.chaos.saving:sigterm_during_save",
    "corrupt_checkpoint": "hpcpipe.chaos.saving:corrupt_checkpoint",
    "disk_full": "hpcpipe.chaos.saving:disk_full",
    # Bad input and security.
    "fuzz_config": "hpcpipe.chaos.security:fuzz_config",
    "malicious_pickle": "hpcpipe.chaos.security:malicious_pickle",
    "secrets": "hpcpipe.chaos.security:secrets_stay_hidden",
    "loopback_only": "hpcpipe.chaos.security:loopback_only",
}
