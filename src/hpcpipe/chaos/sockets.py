"""Listening TCP sockets of a process tree, read from ``/proc`` (Linux), and whose they are.

hpcpipe's only server is the Prometheus exporter (``observe/prometheus.py``), one per rank on
``observe.prometheus.port + local_rank``. Everything else a training run listens on belongs to
torch.distributed: the elastic agent's c10d rendezvous store (in the launcher), the workers'
TCPStore on MASTER_PORT (in rank 0) and gloo's pair listeners (in every worker). hpcpipe binds
them all to loopback in a run on one host, so a local run's every listener must be there.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from random import Random
from typing import Any

from hpcpipe.launch.agent import command_line
from hpcpipe.launch.fork_server import is_fork_server

LISTEN = "0A"  # the TCP state column of /proc/net/tcp{,6}


@dataclass(frozen=True)
class Listener:
    pid: int
    address: str  # as bound: 127.0.0.1, ::, 0.0.0.0, ...
    port: int
    owner: str = "?"  # hpcpipe | torch | unknown
    role: str = ""

    @property
    def loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        return (mapped or ip).is_loopback

    def shown(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"


def free_port_base(rng: Random, count: int, low: int = 20000, high: int = 40000) -> tuple[int, int]:
    """(a base port whose ``count`` ports are all free on every address, attempts it took)."""
    for attempt in range(1, 101):
        base = rng.randrange(low, high - count)
        if all(_port_free(base + offset) for offset in range(count)):
            return base, attempt
    raise RuntimeError(f"no {count} free consecutive ports in [{low}, {high}) after 100 draws")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:  # [::] covers IPv4 too
        try:
            probe.bind(("::", port))
        except OSError:
            return False
    return True


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants (every process's parent read from /proc/PID/stat)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry)] = _parent(int(entry))
    tree, frontier = [root], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        tree += children
        frontier = children
    return tree


def listening_sockets(pids: list[int]) -> list[Listener]:
    """Every TCP socket in LISTEN state that one of ``pids`` holds open."""
    inodes = _socket_inodes(pids)
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == LISTEN and fields[9] in inodes:
                    address, port = _decode(fields[1])
                    found.append(Listener(inodes[fields[9]], address, port))
    return sorted(found, key=lambda s: (s.pid, s.port))


def _socket_inodes(pids: list[int]) -> dict[str, int]:
    """socket inode -> the pid holding it (fds read as ``socket:[INODE]`` links)."""
    inodes = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes[link[8:-1]] = pid
    return inodes


def _decode(field: str) -> tuple[str, int]:
    """``0100007F:1F90`` -> ("127.0.0.1", 8080): each 32-bit word is in host (little-endian) order."""
    hex_address, hex_port = field.split(":")
    raw = b"".join(bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, len(hex_address), 8))
    return str(ipaddress.ip_address(raw)), int(hex_port, 16)


def workers(pids: list[int]) -> dict[int, int | None]:
    """pid -> MASTER_PORT of every worker among ``pids`` (rank 0 serves torch's TCPStore there).

    A spawned worker shows RANK and MASTER_PORT in ``/proc/PID/environ``. A worker forked from
    the agent's fork server (``parallel.worker_start``) got them after it started, where /proc
    does not show them: it is known by its parent, the fork server, and its port stays None."""
    found: dict[int, int | None] = {}
    servers = {pid for pid in pids if is_fork_server(pid, command_line(pid))}
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            env = dict(
                v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in v
            )
            if "RANK" in env and "MASTER_PORT" in env:
                found[pid] = int(env["MASTER_PORT"])
            elif _parent(pid) in servers:
                found[pid] = None
    return found


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def classify(
    listeners: list[Listener], exporters: set[int], launcher: int, ranks: dict[int, int | None]
) -> list[Listener]:
    """Each listener with its owner and role (see the module docstring); ``ranks`` is ``workers()``."""
    out = []
    for s in listeners:
        if s.port in exporters:
            owner, role = "hpcpipe", "prometheus exporter"
        elif s.pid in ranks and s.port == ranks[s.pid]:
            owner, role = "torch", "TCPStore (MASTER_PORT)"
        elif s.pid == launcher:
            owner, role = "torch", "c10d rendezvous store (agent)"
        elif s.pid in ranks:
            # a forked worker's MASTER_PORT is unknown: its TCPStore counts with the gloo pairs
            owner, role = "torch", "gloo listener" if ranks[s.pid] is not None else "gloo or TCPStore"
        else:  # a process that is neither the launcher nor a rank: nothing is known to listen there
            owner, role = "unknown", f"pid {s.pid}"
        out.append(Listener(s.pid, s.address, s.port, owner, role))
    return out


def violations(listeners: list[Listener]) -> list[Listener]:
    """The listeners of a local run that accept connections from beyond loopback, whoever owns
    them: torch's too (its rendezvous store, rank 0's TCPStore, gloo's pairs), which a
    single-host run binds to loopback as well (``launch/rendezvous.py``, ``group_store``)."""
    return [s for s in listeners if not s.loopback]


def describe(listeners: list[Listener]) -> str:
    """One line: each role's bind addresses, e.g. ``hpcpipe prometheus exporter 127.0.0.1:2000``."""
    groups: Counter[tuple[str, str, str]] = Counter()
    for s in listeners:
        pairs = s.owner == "torch" and s.role.startswith("gloo")  # many, on ports that vary
        where = s.address if pairs else s.shown()
        groups[(s.owner, s.role, where)] += 1
    parts = [f"{o} {r} {w}" + (f" x{n}" if n > 1 else "") for (o, r, w), n in sorted(groups.items())]
    return "; ".join(parts) or "no listeners"


def exporters_answer(proc: subprocess.Popen[Any], ports: set[int], timeout_s: float) -> bool:
    """True once every exporter serves /metrics; False if the run ends or time runs out first."""
    deadline = time.monotonic() + timeout_s
    waiting = set(ports)
    while waiting and proc.poll() is None and time.monotonic() < deadline:
        for port in sorted(waiting):
            url = f"http://127.0.0.1:{port}/metrics"
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    waiting.discard(port)
        time.sleep(0.5 if waiting else 0)
    return not waiting


def stop_tree(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the run's process group and every descendant (torch's agent starts its workers in
    sessions of their own, so the group alone would leave them running)."""
    tree = process_tree(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in tree[1:]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
