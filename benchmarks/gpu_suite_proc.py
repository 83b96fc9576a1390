"""What the GPU suite (``gpu_suite.py``) reads of this machine and its processes: /proc (a
process's files, its descendants, whether it mapped the CUDA driver), stopping a command's process
group, a free port, Prometheus text, the GPUs nvidia-smi lists, the CPU time of finished children."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path


def read_proc(pid: int, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/{name}").read_text(errors="replace")
    except OSError:
        return ""


def maps_libcuda(pid: int) -> bool:
    """Whether the CUDA driver library is mapped into ``pid`` (loaded by CUDA's initialisation)."""
    return "libcuda.so" in read_proc(pid, "maps")


def _parents() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = read_proc(int(entry.name), "stat")
            if stat:
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def process_tree(root: int) -> dict[int, int]:
    """``root``'s descendants: pid -> parent pid."""
    parents = _parents()
    tree: dict[int, int] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree[child] = parent
                frontier.append(child)
    return tree


def children(pid: int, tree: Mapping[int, int]) -> list[int]:
    return [child for child, parent in tree.items() if parent == pid]


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the command's process group, SIGKILL 10 s later if anything is left."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
            return


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {series name: value} (the first sample of each name)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) not in values:
            with contextlib.suppress(ValueError):
                values[match.group(1)] = float(match.group(3))
    return values


def gpu_memory_bytes() -> int:
    """The memory of the first visible GPU (nvidia-smi; CUDA_VISIBLE_DEVICES's first index)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    sizes = [int(line.strip()) for line in out.stdout.splitlines() if line.strip()]
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    index = int(first) if first.isdigit() and int(first) < len(sizes) else 0
    return sizes[index] * 2**20  # MiB


def children_cpu_s() -> float:
    """User + system CPU seconds of this process's waited-for children (all of their descendants)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def count_gpus() -> int:
    """Visible GPUs without touching CUDA in this process: nvidia-smi -L, CUDA_VISIBLE_DEVICES."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False, timeout=30)
    found = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        found = min(found, len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"]))
    return found
