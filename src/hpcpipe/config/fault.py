"""The ``fault:`` section: watchdog, OOM recovery and preemption."""

from __future__ import annotations

from pydantic import Field, field_validator

from hpcpipe.config.section import Section

# Exit codes hpcpipe already gives a meaning (ARCHITECTURE.md, exit codes): a preemption answered
# with one of them would read as that (a crash, a user error, a hang, a lost peer, a pruned trial,
# Ctrl-C), and the agent would not restart or requeue as it should. The constants live with their
# owners (errors.py, observe/watchdog.py, launch/exit.py, train/trial.py); kept equal by a test.
RESERVED_EXIT_CODES = {
    1: "a crash (an uncaught exception)",
    2: "a user error",
    3: "a hang (the watchdog)",
    4: "a rank that lost its peer",
    76: "a pruned trial",
}


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
        "(EX_TEMPFAIL, 'checkpointed, resubmit me'); not 143, which means killed *without* one. "
        "Codes hpcpipe gives another meaning (1-4, 76) and 128 and above are refused.",
    )

    @field_validator("preempt_exit_code")
    @classmethod
    def _unreserved(cls, code: int) -> int:
        if code in RESERVED_EXIT_CODES:
            meaning = RESERVED_EXIT_CODES[code]
            raise ValueError(f"{code} already means {meaning}; use 75 (EX_TEMPFAIL) or another free code")
        if code >= 128:  # 128 + N: killed by signal N (130: Ctrl-C), i.e. *without* a checkpoint
            raise ValueError(
                f"{code} means killed by signal {code - 128}; use a code below 128 (75: EX_TEMPFAIL)"
            )
        return code

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
