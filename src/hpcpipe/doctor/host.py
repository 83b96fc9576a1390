"""Host checks: CPU, memory, disk of the run directory; Python, torch, CUDA and NCCL builds."""

from __future__ import annotations

import os
import platform
import shutil
import sys
from pathlib import Path

from hpcpipe.bench.host import meminfo
from hpcpipe.doctor.probe import (
    FAIL,
    GIB,
    LOW_FREE_DISK_GIB,
    MIN_FREE_DISK_GIB,
    OK,
    SKIPPED,
    WARN,
    Check,
    Probe,
    locate,
    not_accessible,
)

# ---------------------------------------------------------------------------------------------
# Host


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as ``lscpu`` prints it (``model name`` in ``cpuinfo``), else what
    Python knows of the processor."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def check_cpu(probe: Probe) -> list[Check]:
    cores = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    model = cpu_model(probe.path("/proc/cpuinfo"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    summary = f"{model}: {usable} usable of {cores} cores, load {load:.1f}"
    details = {"model": model, "cores": cores, "usable_cores": usable, "load_1min": load}
    if load > usable:
        return [Check("cpu", WARN, summary + " (busier than its cores: timings will be noisy)", details)]
    return [Check("cpu", OK, summary, details)]


def check_memory(probe: Probe) -> list[Check]:
    info = meminfo(probe.path("/proc/meminfo"))
    if "MemTotal" not in info:
        return [Check("memory", SKIPPED, "no /proc/meminfo (not Linux)")]
    total, available = info["MemTotal"], info.get("MemAvailable", info.get("MemFree", 0))
    summary = f"{available / GIB:.1f} GiB available of {total / GIB:.1f} GiB"
    details = {"total_bytes": total, "available_bytes": available}
    if available < 2 * GIB or available < total * 0.1:
        return [Check("memory", WARN, summary + " (low: data loaders and ranks may be OOM-killed)", details)]
    return [Check("memory", OK, summary, details)]


def check_disk(probe: Probe) -> list[Check]:
    try:
        target, existing = locate(probe.run_dir)
        usage = shutil.disk_usage(existing)
    except OSError as exc:  # a folder on the way that cannot be read: runs cannot be saved there
        return [Check("disk (run dir)", FAIL, not_accessible(probe.run_dir, exc))]
    fs = _filesystem_type(probe, existing)
    summary = f"{target}: {usage.free / GIB:.1f} GiB free of {usage.total / GIB:.1f} GiB ({fs})"
    details = {"path": str(target), "checked": str(existing), "free_bytes": usage.free, "filesystem": fs}
    if not existing.is_dir():  # a file where the run directory (or a folder above it) would go
        return [
            Check(
                "disk (run dir)",
                FAIL,
                f"{existing} is a file, not a directory: runs cannot be saved",
                details,
            )
        ]
    if not os.access(existing, os.W_OK):
        return [Check("disk (run dir)", FAIL, f"{existing} is not writable: runs cannot be saved", details)]
    if usage.free < MIN_FREE_DISK_GIB * GIB:
        return [Check("disk (run dir)", FAIL, summary + ": too little for checkpoints", details)]
    if usage.free < LOW_FREE_DISK_GIB * GIB:
        return [Check("disk (run dir)", WARN, summary + ": checkpoints may fill it", details)]
    return [Check("disk (run dir)", OK, summary, details)]


def _filesystem_type(probe: Probe, path: Path) -> str:
    """The type of the longest mount point containing ``path`` (/proc/mounts), or 'unknown'."""
    best, kind = "", "unknown"
    try:
        for line in probe.path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if (
                len(parts) >= 3
                and (str(path) + "/").startswith(parts[1].rstrip("/") + "/")
                and len(parts[1]) > len(best)
            ):
                best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


# ---------------------------------------------------------------------------------------------
# Python, torch, CUDA, NCCL


def check_python(probe: Probe) -> list[Check]:
    """The interpreter that will run the ranks (torchrun/srun start this same executable)."""
    env = "virtual environment" if sys.prefix != sys.base_prefix else "system interpreter"
    summary = f"{platform.python_implementation()} {platform.python_version()} ({sys.executable}, {env})"
    return [Check("python", OK, summary, {"executable": sys.executable, "prefix": sys.prefix})]


def check_torch(probe: Probe) -> list[Check]:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return [Check("torch", FAIL, f"cannot import torch: {exc}")]
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    backends = [
        name for name, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available())) if ok
    ]
    summary = f"torch {torch.__version__} ({build}); distributed backends: {', '.join(backends) or 'none'}"
    details = {"version": torch.__version__, "cuda_build": torch.version.cuda, "backends": backends}
    if not dist.is_available() or "gloo" not in backends:
        return [
            Check("torch", FAIL, summary + ": torch.distributed/gloo missing, no multi-process runs", details)
        ]
    return [Check("torch", OK, summary, details)]


def check_cuda(probe: Probe) -> list[Check]:
    import torch

    driver = probe.path("/proc/driver/nvidia/version").is_file()
    if not torch.version.cuda:
        status = WARN if driver else SKIPPED
        return [
            Check(
                "cuda",
                status,
                "torch is a CPU-only build" + (" but this host has an NVIDIA driver" if driver else ""),
            )
        ]
    if not torch.cuda.is_available():
        if not driver:
            return [Check("cuda", SKIPPED, "no NVIDIA driver on this host (CPU node)")]
        visible = probe.env.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return [Check("cuda", FAIL, f"NVIDIA driver present but torch sees no GPU{hint}")]
    count = torch.cuda.device_count()
    names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
    return [
        Check(
            "cuda",
            OK,
            f"CUDA {torch.version.cuda} runtime, {count} GPU(s): {', '.join(names)}",
            {"device_count": count, "names": names},
        )
    ]


def check_nccl(probe: Probe) -> list[Check]:
    import torch
    import torch.distributed as dist

    if not dist.is_nccl_available() or not torch.version.cuda:
        return [Check("nccl", SKIPPED, "this torch build has no NCCL backend")]
    version = torch.cuda.nccl.version()
    text = ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
    return [Check("nccl", OK, f"NCCL {text} (bundled with torch)")]
