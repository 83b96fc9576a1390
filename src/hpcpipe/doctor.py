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

import functools
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from hpcpipe.bench.host import meminfo

OK, WARN, FAIL, SKIPPED = "OK", "WARN", "FAIL", "SKIPPED"
TOOL_TIMEOUT_S = 5.0
GIB = 1 << 30
MIN_FREE_DISK_GIB, LOW_FREE_DISK_GIB = 1, 10
HOT_GPU_C = 85
CONTAINER_RUNTIMES = ("docker", "podman", "apptainer", "singularity", "enroot")


@dataclass(frozen=True)
class Check:
    """One finding: which check, its status, a one-line summary and optional details."""

    name: str
    status: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _load_nvml() -> ModuleType:
    import pynvml

    return pynvml


@dataclass
class Probe:
    """The outside world as the checks see it (replaceable in tests)."""

    run_dir: Path = Path("runs")
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    sys_root: Path = Path("/")
    load_nvml: Callable[[], ModuleType] = _load_nvml
    timeout_s: float = TOOL_TIMEOUT_S

    def which(self, tool: str) -> str | None:
        return shutil.which(tool, path=self.env.get("PATH", ""))

    def run(self, cmd: list[str]) -> tuple[str | None, str]:
        """(stdout, "") on success; (None, why not) when missing, failing or hanging."""
        exe = self.which(cmd[0])
        if exe is None:
            return None, f"{cmd[0]} not found on PATH"
        try:
            proc = subprocess.run(
                [exe, *cmd[1:]],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                env=dict(self.env),
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None, f"`{' '.join(cmd)}` timed out after {self.timeout_s:g} s"
        except OSError as exc:
            return None, f"`{' '.join(cmd)}` could not start: {exc}"
        if proc.returncode != 0:
            first = (proc.stderr or proc.stdout).strip().splitlines()
            return None, f"`{' '.join(cmd)}` exited {proc.returncode}" + (f": {first[0]}" if first else "")
        return proc.stdout, ""

    def path(self, absolute: str) -> Path:
        return self.sys_root / absolute.lstrip("/")


# ---------------------------------------------------------------------------------------------
# Host


def check_cpu(probe: Probe) -> list[Check]:
    cores = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    model = platform.processor() or platform.machine()
    try:
        for line in probe.path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
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
    target = probe.run_dir.resolve()
    existing = next((p for p in (target, *target.parents) if p.exists()), Path("/"))
    usage = shutil.disk_usage(existing)
    fs = _filesystem_type(probe, existing)
    summary = f"{target}: {usage.free / GIB:.1f} GiB free of {usage.total / GIB:.1f} GiB ({fs})"
    details = {"path": str(target), "checked": str(existing), "free_bytes": usage.free, "filesystem": fs}
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


# ---------------------------------------------------------------------------------------------
# GPUs through NVML, and their topology


def check_gpus(probe: Probe) -> list[Check]:
    try:
        nvml = probe.load_nvml()
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError, ...
        return [Check("gpus (nvml)", SKIPPED, f"NVML unavailable: {exc or type(exc).__name__}")]
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            return [Check("gpus (nvml)", SKIPPED, f"driver {driver}, no GPUs")]
        return [_gpu(nvml, i, driver) for i in range(count)]
    finally:
        nvml.nvmlShutdown()


def _gpu(nvml: Any, index: int, driver: str) -> Check:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = _text(nvml.nvmlDeviceGetName(handle))
    memory = nvml.nvmlDeviceGetMemoryInfo(handle).total
    problems: list[tuple[str, str]] = []  # (status, text)
    details: dict[str, Any] = {"name": name, "memory_bytes": memory, "driver": driver}
    ecc = _nvml(
        nvml,
        lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        ),
    )
    details["ecc_uncorrected_volatile"] = ecc
    if ecc:
        problems.append((FAIL, f"{ecc} uncorrected ECC errors since boot"))
    remap = _nvml(nvml, lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    if remap is not None and (remap[3] or remap[2]):
        problems.append(
            (
                FAIL if remap[3] else WARN,
                "row remapping failed" if remap[3] else "row remap pending (reset the GPU)",
            )
        )
    temp = _nvml(nvml, lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
    details["temperature_c"] = temp
    if temp is not None and temp >= HOT_GPU_C:
        problems.append((WARN, f"{temp} C (throttles soon)"))
    power = _nvml(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    limit = _nvml(nvml, lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    details.update(
        power_w=None if power is None else power / 1000, power_limit_w=None if limit is None else limit / 1000
    )
    active, links = _nvlinks(nvml, handle)
    details.update(nvlink_active=active, nvlink_links=links)
    if links and active < links:
        problems.append((WARN, f"NVLink {active}/{links} links active"))
    summary = (
        f"{name}, {memory / GIB:.0f} GiB, driver {driver}, ECC {ecc if ecc is not None else 'n/a'}, "
        f"{temp if temp is not None else '?'} C, " + (f"NVLink {active}/{links}" if links else "no NVLink")
    )
    worst = FAIL if any(s == FAIL for s, _ in problems) else WARN if problems else OK
    return Check(f"gpu {index}", worst, summary + "".join(f"; {t}" for _, t in problems), details)


def _nvlinks(nvml: Any, handle: Any) -> tuple[int, int]:
    """(active, present) NVLink links; a link NVML reports as not supported is not present."""
    active = present = 0
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        state = _nvml(nvml, functools.partial(nvml.nvmlDeviceGetNvLinkState, handle, link))
        if state is None:
            continue
        present += 1
        active += int(state == getattr(nvml, "NVML_FEATURE_ENABLED", 1))
    return active, present


def _nvml(nvml: Any, call: Callable[[], Any]) -> Any:
    """The value of an NVML query, None where the GPU or driver does not support it."""
    try:
        return call()
    except nvml.NVMLError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def check_topology(probe: Probe) -> list[Check]:
    out, why = probe.run(["nvidia-smi", "topo", "-m"])
    if out is None:
        return [Check("gpu topology", SKIPPED, why)]
    gpus = [line.split()[0] for line in out.splitlines() if re.match(r"^\s*GPU\d+\s", line)]
    nvlinked = bool(re.search(r"\bNV\d+\b", out))
    details = {"matrix": out.strip()}
    if len(gpus) > 1 and not nvlinked:
        return [
            Check(
                "gpu topology",
                WARN,
                f"{len(gpus)} GPUs connected through PCIe/host only (no NV# links)",
                details,
            )
        ]
    return [
        Check(
            "gpu topology", OK, f"{len(gpus)} GPU(s)" + (", NVLink between GPUs" if nvlinked else ""), details
        )
    ]


# ---------------------------------------------------------------------------------------------
# Network: InfiniBand / RDMA


def check_ibstat(probe: Probe) -> list[Check]:
    out, why = probe.run(["ibstat"])
    if out is None:
        return [_missing_rdma_tool(probe, "infiniband (ibstat)", why)]
    ports = _ibstat_ports(out)
    if not ports:
        return [Check("infiniband (ibstat)", WARN, "ibstat lists no ports")]
    down = [p for p in ports if p["state"] != "Active"]
    rates = sorted({p["rate"] for p in ports if p["state"] == "Active"})
    summary = f"{len(ports) - len(down)}/{len(ports)} ports active" + (
        f" at {', '.join(rates)} Gb/s" if rates else ""
    )
    details = {"ports": ports}
    if down:
        names = ", ".join(f"{p['ca']}/{p['port']} ({p['state']})" for p in down)
        return [Check("infiniband (ibstat)", WARN, f"{summary}; not active: {names}", details)]
    return [Check("infiniband (ibstat)", OK, summary, details)]


def _ibstat_ports(text: str) -> list[dict[str, str]]:
    """Ports from ``ibstat`` output: CA name, port number, State, Rate, Link layer."""
    ports: list[dict[str, str]] = []
    ca = ""
    for raw in text.splitlines():
        line = raw.strip()
        if match := re.match(r"CA '([^']+)'", line):
            ca = match.group(1)
        elif match := re.match(r"Port (\d+):", line):
            ports.append({"ca": ca, "port": match.group(1), "state": "?", "rate": "?", "link_layer": "?"})
        elif ports and ":" in line:
            key, value = (part.strip() for part in line.split(":", 1))
            field_name = {"State": "state", "Rate": "rate", "Link layer": "link_layer"}.get(key)
            if field_name:
                ports[-1][field_name] = value
    return ports


def check_ibv_devinfo(probe: Probe) -> list[Check]:
    out, why = probe.run(["ibv_devinfo"])
    if out is None:
        return [_missing_rdma_tool(probe, "rdma (ibv_devinfo)", why)]
    states = re.findall(r"state:\s+(PORT_\w+)", out)
    devices = re.findall(r"hca_id:\s+(\S+)", out)
    if not devices:
        return [Check("rdma (ibv_devinfo)", WARN, "ibv_devinfo found no RDMA devices")]
    active = states.count("PORT_ACTIVE")
    summary = f"{len(devices)} device(s) ({', '.join(devices)}), {active}/{len(states)} ports PORT_ACTIVE"
    return [Check("rdma (ibv_devinfo)", OK if active == len(states) else WARN, summary)]


def _missing_rdma_tool(probe: Probe, name: str, why: str) -> Check:
    devices = _rdma_devices(probe)
    if devices:
        return Check(
            name,
            WARN,
            f"{why}, but RDMA devices exist ({', '.join(devices)}): install rdma-core / infiniband-diags",
        )
    return Check(name, SKIPPED, f"{why}; no RDMA devices in /sys/class/infiniband")


def _rdma_devices(probe: Probe) -> list[str]:
    root = probe.path("/sys/class/infiniband")
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


# ---------------------------------------------------------------------------------------------
# Scheduler, file systems, containers


def check_slurm(probe: Probe) -> list[Check]:
    out, why = probe.run(["sinfo", "-h", "-o", "%P|%a|%D|%t"])
    if out is None:
        return [Check("slurm", SKIPPED, why)]
    rows = [line.split("|") for line in out.splitlines() if line.count("|") == 3]
    bad = [
        f"{p}: {n} node(s) {s}"
        for p, _, n, s in rows
        if re.match(r"(down|drain|drng|fail|maint)", s.rstrip("*~#"))
    ]
    version_out, _ = probe.run(["scontrol", "--version"])
    version = version_out.strip() if version_out else "scontrol unavailable"
    job = probe.env.get("SLURM_JOB_ID")
    summary = f"{version}; {len({r[0] for r in rows})} partition(s)" + (f"; inside job {job}" if job else "")
    details = {
        "partitions": [dict(zip(("partition", "avail", "nodes", "state"), r, strict=True)) for r in rows]
    }
    if bad:
        return [Check("slurm", WARN, f"{summary}; unavailable: {'; '.join(bad[:4])}", details)]
    return [Check("slurm", OK, summary, details)]


def check_lustre(probe: Probe) -> list[Check]:
    target = probe.run_dir.resolve()
    existing = next((p for p in (target, *target.parents) if p.exists()), Path("/"))
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
        hcas = _rdma_devices(probe)
        if not _nccl_list_matches(env["NCCL_IB_HCA"], hcas, strip_port=True):
            checks.append(
                Check(
                    "env NCCL_IB_HCA",
                    FAIL,
                    f"NCCL_IB_HCA={env['NCCL_IB_HCA']!r} matches no RDMA "
                    f"device ({', '.join(hcas) or 'none found'})",
                )
            )
    if env.get("NCCL_IB_DISABLE") == "1" and _rdma_devices(probe):
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
