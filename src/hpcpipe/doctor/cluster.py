"""Scheduler, file-system and container checks, and environment variables that break jobs."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpcpipe.doctor.network import rdma_devices
from hpcpipe.doctor.probe import (
    CONTAINER_RUNTIMES,
    FAIL,
    OK,
    SKIPPED,
    WARN,
    Check,
    Probe,
    locate,
    not_accessible,
)

# ---------------------------------------------------------------------------------------------
# Scheduler, file systems, containers


def check_slurm(probe: Probe) -> list[Check]:
    # The job comes from the environment first: compute nodes often lack sinfo (login-node
    # tools), and the allocation is still worth reporting there.
    job = _allocation(probe)
    out, why = probe.run(["sinfo", "-h", "-o", "%P|%a|%D|%t"])
    if out is None and not job:
        return [Check("slurm", SKIPPED, why)]
    rows = [line.split("|") for line in (out or "").splitlines() if line.count("|") == 3]
    # sinfo's suffixes: * not responding (unavailable), ~ # powered off or powering up (power saving).
    bad = [
        f"{p}: {n} node(s) {s}"
        for p, _, n, s in rows
        if s.endswith("*") or re.match(r"(down|drain|drng|fail|maint)", s.rstrip("~#"))
    ]
    version_out, _ = probe.run(["scontrol", "--version"])
    version = version_out.strip() if version_out else "scontrol unavailable"
    partitions = (
        f"{len({r[0] for r in rows})} partition(s)" if out is not None else f"sinfo unavailable ({why})"
    )
    summary = f"{version}; {partitions}"
    if job:
        summary += (
            f"; inside job {job['id']} on {job['nodes']} ({job['num_nodes']} node(s), "
            f"partition {job['partition'] or '-'}, GPUs per node {job['gpus_per_node']}, "
            f"gres {job['gres'] or '-'})"
        )
    details: dict[str, Any] = {
        "partitions": [dict(zip(("partition", "avail", "nodes", "state"), r, strict=True)) for r in rows]
    }
    if out is None:
        details["sinfo"] = why
    if job:
        details["job"] = job
    if bad:
        return [Check("slurm", WARN, f"{summary}; unavailable: {'; '.join(bad[:4])}", details)]
    if out is None and probe.which("sinfo") is not None:  # there, but the controller did not answer
        return [Check("slurm", WARN, summary, details)]  # (srun steps and requeues need it)
    return [Check("slurm", OK, summary, details)]


def _allocation(probe: Probe) -> dict[str, Any] | None:
    """The Slurm job this process runs in (environment + ``scontrol show job``), or None."""
    env = probe.env
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    out, _ = probe.run(["scontrol", "show", "job", "--oneliner", job_id])
    fields = dict(item.split("=", 1) for item in (out or "").split() if "=" in item)
    gres = fields.get("TresPerNode") or fields.get("Gres") or ""
    return {
        "id": job_id,
        "nodes": env.get("SLURM_JOB_NODELIST", fields.get("NodeList", "")),
        "num_nodes": env.get("SLURM_JOB_NUM_NODES", fields.get("NumNodes", "")),
        "partition": env.get("SLURM_JOB_PARTITION", fields.get("Partition", "")),
        "gpus_per_node": env.get("SLURM_GPUS_ON_NODE", env.get("SLURM_GPUS_PER_NODE", "0")),
        "gres": "" if gres == "(null)" else gres,
    }


def check_lustre(probe: Probe) -> list[Check]:
    if probe.which("lfs") is None:  # not a Lustre client: the run directory is not Lustre's business
        return [Check("lustre", SKIPPED, "lfs not found on PATH")]
    try:
        _, existing = locate(probe.run_dir)
    except OSError as exc:
        return [Check("lustre", FAIL, not_accessible(probe.run_dir, exc))]
    out, why = probe.run(["lfs", "df", "-h", str(existing)])
    if out is None:
        return [Check("lustre", SKIPPED, why)]
    full = [
        line.split()[-1] for line in out.splitlines() if re.search(r"\b(9\d|100)%", line) and "OST" in line
    ]
    if full:
        return [
            Check(
                "lustre", WARN, f"{len(full)} OST(s) at >= 90% use ({', '.join(full[:4])}): writes may fail"
            )
        ]
    return [Check("lustre", OK, f"lfs df {existing}: every OST below 90% use", {"lfs_df": out.strip()})]


def check_containers(probe: Probe) -> list[Check]:
    found = {}
    for runtime in CONTAINER_RUNTIMES:
        if probe.which(runtime):
            out, _ = probe.run([runtime, "--version"])
            found[runtime] = out.strip().splitlines()[0] if out else "version unknown"
    inside = _inside_container(probe)
    parts = [f"{name} ({version})" for name, version in found.items()]
    if inside:
        parts.append(f"running inside {inside}")
    if not parts:
        return [Check("containers", SKIPPED, f"no container runtime found ({', '.join(CONTAINER_RUNTIMES)})")]
    return [Check("containers", OK, "; ".join(parts), {"runtimes": found, "inside": inside})]


def _inside_container(probe: Probe) -> str | None:
    if probe.path("/.dockerenv").exists():
        return "a Docker container"
    if probe.path("/run/.containerenv").exists():
        return "a Podman container"
    if probe.env.get("APPTAINER_CONTAINER") or probe.env.get("SINGULARITY_CONTAINER"):
        return "an Apptainer/Singularity container"
    if probe.env.get("ENROOT_ROOTFS") or probe.env.get("PYXIS_VERSION"):
        return "an enroot/pyxis container"
    return None


# ---------------------------------------------------------------------------------------------
# Environment variables that commonly break or slow distributed jobs

_ENV_WARNINGS: tuple[tuple[str, Callable[[str], bool], str], ...] = (
    (
        "NCCL_P2P_DISABLE",
        lambda v: v == "1",
        "disables NVLink/PCIe peer-to-peer: intra-node collectives slow down",
    ),
    ("NCCL_SHM_DISABLE", lambda v: v == "1", "disables shared-memory transport between local ranks"),
    ("NCCL_DEBUG", lambda v: v.upper() == "TRACE", "TRACE logs every call and slows collectives"),
    ("NCCL_ALGO", bool, "forces NCCL's algorithm, overriding its tuning (debugging only)"),
    ("NCCL_PROTO", bool, "forces NCCL's protocol, overriding its tuning (debugging only)"),
    ("NCCL_ASYNC_ERROR_HANDLING", bool, "deprecated: use TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    ("NCCL_BLOCKING_WAIT", bool, "deprecated: use TORCH_NCCL_BLOCKING_WAIT"),
    ("CUDA_LAUNCH_BLOCKING", lambda v: v == "1", "serialises every kernel launch (debugging only)"),
    (
        "TORCH_DISTRIBUTED_DEBUG",
        lambda v: v.upper() == "DETAIL",
        "DETAIL checks every collective and slows them",
    ),
    ("CUDA_VISIBLE_DEVICES", lambda v: v.strip() == "", "is empty: every GPU is hidden from this process"),
)


def check_env(probe: Probe) -> list[Check]:
    env = probe.env
    checks = [
        Check(f"env {name}", WARN, f"{name}={env[name]!r} {why}")
        for name, bad, why in _ENV_WARNINGS
        if name in env and bad(env[name])
    ]
    interfaces = _names(probe.path("/sys/class/net"))
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if env.get(name) and not _nccl_list_matches(env[name], interfaces):
            checks.append(
                Check(
                    f"env {name}",
                    FAIL,
                    f"{name}={env[name]!r} matches no interface "
                    f"({', '.join(interfaces) or 'none found'}): rendezvous will hang",
                )
            )
    if env.get("NCCL_IB_HCA"):
        hcas = rdma_devices(probe)
        if not _nccl_list_matches(env["NCCL_IB_HCA"], hcas, strip_port=True):
            checks.append(
                Check(
                    "env NCCL_IB_HCA",
                    FAIL,
                    f"NCCL_IB_HCA={env['NCCL_IB_HCA']!r} matches no RDMA "
                    f"device ({', '.join(hcas) or 'none found'})",
                )
            )
    if env.get("NCCL_IB_DISABLE") == "1" and rdma_devices(probe):
        checks.append(
            Check("env NCCL_IB_DISABLE", WARN, "InfiniBand present but NCCL_IB_DISABLE=1: NCCL uses TCP")
        )
    checks += _threads_and_master(env)
    return checks or [Check("environment", OK, "no NCCL/gloo/CUDA variables known to break or slow jobs")]


def _threads_and_master(env: Mapping[str, str]) -> list[Check]:
    checks = []
    omp = env.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > (os.cpu_count() or 1):
        checks.append(
            Check("env OMP_NUM_THREADS", WARN, f"OMP_NUM_THREADS={omp} exceeds the {os.cpu_count()} cores")
        )
    addr = env.get("MASTER_ADDR")
    if addr:
        try:
            socket.getaddrinfo(addr, None)
        except OSError:
            checks.append(
                Check("env MASTER_ADDR", FAIL, f"MASTER_ADDR={addr!r} does not resolve: ranks cannot meet")
            )
    return checks


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def _nccl_list_matches(value: str, names: list[str], strip_port: bool = False) -> bool:
    """NCCL's list syntax: 'eth,ib' (prefixes), '=eth0' (exact names), '^docker,lo' (all but)."""
    exclude, exact = value.startswith("^"), value.lstrip("^").startswith("=")
    items = [
        item.split(":")[0] if strip_port else item
        for item in value.lstrip("^").lstrip("=").split(",")
        if item
    ]

    def listed(name: str) -> bool:
        return any(name == item if exact else name.startswith(item) for item in items)

    return any(not listed(n) for n in names) if exclude else any(listed(n) for n in names)
