"""The ``fault:`` section: watchdog, OOM recovery and preemption."""

from __future__ import annotations

from pydantic import Field

from hpcpipe.config.section import Section


class FaultConfig(Section):
    """Fault tolerance: the hang watchdog, OOM recovery, and preemption (its grace period and exit
    code)."""

    hang_timeout_s: float = Field(
        0.0,
        ge=0,
        description="Watchdog: a step that takes longer than this dumps every "
        "rank's stack and exits non-zero (0: no watchdog).",
    )
    oom_recovery: bool | None = Field(
        None,
        description="On an out-of-memory error, halve the micro-batch (more gradient "
        "accumulation, same global batch) and retry the step. null: on, except under "
        "parallel.strategy=deepspeed, whose ZeRO step cannot be rolled back half-way, "
        "parallel.pp > 1, whose schedule runs every micro-batch in one call, and parallel.tp > 1, "
        "whose ranks wait for each other inside every block.",
    )
    preempt_grace_s: float = Field(
        30.0,
        ge=0,
        description="After SIGTERM/SIGUSR1 (preemption), time allowed to finish "
        "the step and write a final checkpoint before exiting.",
    )
    preempt_exit_code: int = Field(
        75,
        ge=1,
        le=255,
        description="Exit code after a preemption checkpoint: 75 "
        "(EX_TEMPFAIL, 'checkpointed, resubmit me'); not 143, which means killed *without* one.",
    )

    @property
    def agent_grace_s(self) -> int:
        """How long a node's agent (and a pod's termination grace) waits for its workers after
        passing a preemption signal on, before SIGKILL: their grace plus 30 s for the step in
        flight (the grace timer starts at the step's end) and the exit."""
        return int(self.preempt_grace_s) + 30

    @property
    def pod_grace_s(self) -> int:
        """A Kubernetes pod's ``terminationGracePeriodSeconds``: the agent's wait for its workers,
        then its SIGKILL of any left and its own exit (the kubelet's 30 s default would SIGKILL a
        checkpoint being written)."""
        return self.agent_grace_s + 15
