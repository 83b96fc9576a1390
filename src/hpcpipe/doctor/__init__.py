"""`hpcpipe doctor`: environment and cluster checks that degrade gracefully when a tool is absent.

Each check reports OK, WARN, FAIL or SKIPPED with one line saying why. A tool that is not
installed (``nvidia-smi``, ``ibstat``, ``sinfo``, ``lfs``, ...) or that fails or hangs makes its
check SKIPPED (or WARN where its absence is itself a problem), never a crash: doctor's job is to
describe a broken node, so it must survive one. Checks run concurrently and every external
command has a short timeout, so the whole report takes a few seconds.

Everything a check reads from outside (environment variables, PATH, the NVML module, /sys and
/proc) comes through :class:`Probe`, so tests can stage a node with tools missing or broken.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from hpcpipe.doctor.cluster import check_containers, check_env, check_lustre, check_slurm
from hpcpipe.doctor.gpu import check_gpus, check_topology
from hpcpipe.doctor.host import (
    check_cpu,
    check_cuda,
    check_disk,
    check_memory,
    check_nccl,
    check_python,
    check_torch,
)
from hpcpipe.doctor.network import check_ibstat, check_ibv_devinfo
from hpcpipe.doctor.probe import FAIL, OK, SKIPPED, WARN, Check, Probe

__all__ = [
    "CHECKS",
    "FAIL",
    "OK",
    "SKIPPED",
    "WARN",
    "Check",
    "Probe",
    "check_containers",
    "check_cpu",
    "check_cuda",
    "check_disk",
    "check_env",
    "check_gpus",
    "check_ibstat",
    "check_ibv_devinfo",
    "check_lustre",
    "check_memory",
    "check_nccl",
    "check_python",
    "check_slurm",
    "check_topology",
    "check_torch",
    "run_checks",
    "worst_status",
]


# ---------------------------------------------------------------------------------------------
# Running every check

CHECKS: tuple[Callable[[Probe], list[Check]], ...] = (
    check_cpu,
    check_memory,
    check_disk,
    check_python,
    check_torch,
    check_cuda,
    check_nccl,
    check_gpus,
    check_topology,
    check_ibstat,
    check_ibv_devinfo,
    check_slurm,
    check_lustre,
    check_containers,
    check_env,
)


def run_checks(
    probe: Probe | None = None, checks: tuple[Callable[[Probe], list[Check]], ...] = CHECKS
) -> list[Check]:
    """Every check, concurrently, in a fixed order; a check that raises becomes a WARN row."""
    probe = probe or Probe()
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(_guarded, check, probe) for check in checks]
        return [row for future in futures for row in future.result()]


def _guarded(check: Callable[[Probe], list[Check]], probe: Probe) -> list[Check]:
    try:
        return check(probe)
    except Exception as exc:
        name = check.__name__.removeprefix("check_")
        return [Check(name, WARN, f"could not run this check: {type(exc).__name__}: {exc}")]


def worst_status(checks: list[Check]) -> str:
    order = [OK, SKIPPED, WARN, FAIL]
    return max((c.status for c in checks), key=order.index, default=OK)
