"""A trial's assertions, collected instead of raised: the first failed one becomes the detail."""

from __future__ import annotations

import subprocess
from typing import Any

from hpcpipe.chaos.jobs import last_line
from hpcpipe.chaos.scenario import TrialResult


class Checks:
    """``check(ok, why)`` each assertion, then ``result(...)``."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def check(self, ok: bool, why: str) -> bool:
        if not ok:
            self.failures.append(why)
        return ok

    def exit_code(self, proc: subprocess.CompletedProcess[str], want: int, what: str) -> bool:
        """``proc`` ended with ``want``; otherwise the failure quotes its last stderr line."""
        why = f"{what}: exit {proc.returncode}, expected {want} ({last_line(proc.stderr)})"
        return self.check(proc.returncode == want, why)

    def result(
        self,
        passed: str,
        placement: dict[str, Any],
        lost: int = 0,
        ttr_s: float | None = None,
        phases: dict[str, float] | None = None,
    ) -> TrialResult:
        if lost and not self.failures:
            self.failures.append(f"{lost} step(s) lost or not reproduced")
        detail = self.failures[0] if self.failures else passed
        return TrialResult(not self.failures, detail, placement, lost, ttr_s, phases)
