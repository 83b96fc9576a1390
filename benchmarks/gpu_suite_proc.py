"""What the GPU suite (``gpu_suite.py``) reads of this machine and its processes: /proc (a
process's files, its descendants, whether it mapped the CUDA driver), stopping a command's process
group, a free port, Prometheus text, the GPUs nvidia-smi lists, the CPU time of finished children,
and a ``python -m hpcpipe`` command forked from hpcpipe's zygote as the steps see a subprocess."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO, Protocol

from hpcpipe.launch.zygote import Launch, run_hpcpipe, run_script

# What the dry run's zygote imports besides hpcpipe's own preload: the CLI and the libraries of
# the recipes the steps train (peft is never preloaded: it starts a thread).
DRY_RUN_PRELOAD = ("hpcpipe.cli.app", "torchvision", "transformers")
ZYGOTE = "gpu-suite"


class Command(Protocol):
    """A step's running command: a ``subprocess.Popen`` or a ``ForkedCommand``."""

    pid: int
    args: list[str]
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class ForkedCommand:
    """``python -m hpcpipe ARGS`` (or ``python SCRIPT ARGS``) forked from hpcpipe's zygote
    (``hpcpipe.launch.zygote``: torch, the trainer and the CLI imported once, not once per
    command), in a session of its own with its
    output in ``log``, seen as the ``subprocess.Popen`` the steps use. The CPU dry run's commands
    start this way; each ``cpu_s`` is the CPU the zygote reaped (the suite's RUSAGE_CHILDREN never
    sees it)."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str], log: BinaryIO) -> None:
        self.args = args
        self.pid = 0
        self.returncode: int | None = None
        self.cpu_s = 0.0
        self._error: BaseException | None = None
        self._started = threading.Event()
        how = Launch(new_session=True, output=log.fileno(), started=self._on_start, ended=self._on_end)
        self._thread = threading.Thread(target=self._run, args=(cwd, env, how, log), daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    def _on_start(self, pid: int) -> None:
        self.pid = pid
        self._started.set()

    def _on_end(self, cpu_s: float) -> None:
        self.cpu_s = cpu_s

    def _run(self, cwd: Path, env: dict[str, str], how: Launch, log: BinaryIO) -> None:
        try:
            if self.args[1:3] == ["-m", "hpcpipe"]:
                done = run_hpcpipe(self.args[3:], cwd, env, how, DRY_RUN_PRELOAD, zygote_name=ZYGOTE)
            else:
                script, args = Path(self.args[1]), self.args[2:]
                done = run_script(script, args, cwd, env, how, DRY_RUN_PRELOAD, zygote_name=ZYGOTE)
            self.returncode = done.returncode
        except BaseException as exc:  # the zygote could not start it: raised in the caller
            self._error = exc
            self.returncode = 1
        finally:
            log.close()
            self._started.set()

    def poll(self) -> int | None:
        return None if self._thread.is_alive() else self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


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


def stop(proc: Command) -> None:
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
