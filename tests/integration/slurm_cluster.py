"""A real two-node Slurm cluster on this machine: munge, slurmctld, and two slurmd, each slurmd in
its own network namespace joined to the host by a veth pair on a bridge.

Debian's slurmd refuses to run twice with one hostname in one network namespace, hence the
namespaces; each node gets its own address, ``NodeHostname``/``NodeAddr`` and an
``/etc/netns/<ns>/hosts`` (``ip netns exec`` bind-mounts it over ``/etc/hosts``). Everything
lives under one temporary directory and is torn down by ``stop()``, which is safe to call on a
half-started cluster. Needs root (CAP_NET_ADMIN) and the Debian packages slurm-wlm and munge;
``missing_capability()`` says, in one line, what is absent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.77.0"
# `ip netns exec` remounts /sys, which hides the host's cgroup mounts; slurmd initialises its
# cgroup plugin even with proctrack/linuxproc, so the node's private mount namespace gets the
# cgroup v1 controllers back (the host uses v1; nothing here constrains anything).
_CGROUP_V1 = (
    "mount -t tmpfs cgroup_root /sys/fs/cgroup && for c in cpuset memory freezer devices; do "
    "mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c || exit 1; done"
)
BRIDGE = "hpbr0"
CTL_ADDR = f"{SUBNET}.1"
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "srun")


def job_overrides(work: Path, name: str) -> list[str]:
    """``--set`` values that make a job run on this cluster: its run and data under ``work``,
    hpcpipe from this interpreter on the nodes, gloo over the namespaces' ``eth0``."""
    return [
        f"run.name={name}",
        f"run.out_dir={work / 'runs'}",
        f"data.prepared_dir={work / 'prepared'}",
        f"launch.slurm.hpcpipe={sys.executable} -m hpcpipe",
        "launch.slurm.env={GLOO_SOCKET_IFNAME: eth0}",
        "observe.progress=false",
    ]


def missing_capability() -> str | None:
    """Why this machine cannot start the cluster (one line), or None."""
    if os.geteuid() != 0:
        return "the Slurm cluster needs root (network namespaces, slurmd)"
    absent = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if absent:
        return f"not installed: {', '.join(absent)} (apt-get install slurm-wlm munge)"
    probe = subprocess.run(["ip", "netns", "add", "hp-probe"], capture_output=True, text=True, check=False)
    subprocess.run(["ip", "netns", "del", "hp-probe"], capture_output=True, check=False)
    if probe.returncode != 0:
        return f"cannot create network namespaces (CAP_NET_ADMIN): {probe.stderr.strip()}"
    return None


@dataclass
class Node:
    name: str
    addr: str
    netns: str
    veth_host: str


@dataclass
class SlurmCluster:
    root: Path
    nodes: list[Node] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    cpus_per_node: int = 2

    @classmethod
    def create(cls, root: Path, n_nodes: int = 2) -> SlurmCluster:
        tag = f"{os.getpid() % 10000}"
        nodes = [Node(f"n{i}", f"{SUBNET}.{10 + i}", f"hpn{i}-{tag}", f"hpv{i}-{tag}") for i in (1, 2)][
            :n_nodes
        ]
        return cls(root=root, nodes=nodes)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> SlurmCluster:
        try:
            self._network()
            self._munge()
            self._write_conf()
            self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
            for node in self.nodes:
                (self.root / f"spool-{node.name}").mkdir(exist_ok=True)
                slurmd = f"exec slurmd -D -N {node.name} -f {self.conf}"
                self._spawn(
                    f"slurmd-{node.name}", self.in_node(node, "sh", "-c", f"{_CGROUP_V1} && {slurmd}")
                )
            self._wait_idle(timeout_s=60)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Cancel jobs, stop daemons (TERM, then KILL), delete namespaces, links and /etc/netns."""
        if self.procs and shutil.which("scancel"):
            subprocess.run(
                ["scancel", "--full", "--user=root"],
                env=self.env,
                capture_output=True,
                check=False,
                timeout=20,
            )
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        self.procs.clear()
        self._kill_leftovers()
        for node in self.nodes:
            subprocess.run(["ip", "netns", "del", node.netns], capture_output=True, check=False)
            subprocess.run(["ip", "link", "del", node.veth_host], capture_output=True, check=False)
            shutil.rmtree(f"/etc/netns/{node.netns}", ignore_errors=True)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)

    # -- what tests use ----------------------------------------------------------------------

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment for Slurm commands (sbatch, squeue...) talking to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def in_node(self, node: Node, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", node.netns, *argv]

    def job_state(self, job_id: str) -> str:
        out = self.run("scontrol", "show", "job", job_id).stdout
        for token in out.split():
            if token.startswith("JobState="):
                return token.split("=", 1)[1]
        return "UNKNOWN"

    def wait_state(self, job_id: str, states: set[str], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        state = "UNKNOWN"
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.5)  # scontrol answers in milliseconds: an ended job is seen within 0.5 s
        raise TimeoutError(f"job {job_id} still {state} after {timeout_s:.0f} s (wanted {sorted(states)})")

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- pieces ------------------------------------------------------------------------------

    def _network(self) -> None:
        sh = _sh
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{CTL_ADDR}/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        hosts = (
            "127.0.0.1 localhost\n"
            + f"{CTL_ADDR} {socket.gethostname()}\n"
            + "".join(f"{n.addr} {n.name}\n" for n in self.nodes)
        )
        for node in self.nodes:
            sh("ip", "netns", "add", node.netns)
            sh(
                "ip",
                "link",
                "add",
                node.veth_host,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                node.netns,
            )
            sh("ip", "link", "set", node.veth_host, "master", BRIDGE, "up")
            sh("ip", "netns", "exec", node.netns, "ip", "addr", "add", f"{node.addr}/24", "dev", "eth0")
            sh("ip", "netns", "exec", node.netns, "ip", "link", "set", "eth0", "up")
            sh("ip", "netns", "exec", node.netns, "ip", "link", "set", "lo", "up")
            etc = Path(f"/etc/netns/{node.netns}")
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts)

    def _munge(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(parents=True, exist_ok=True)
        munge.chmod(0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = munge / "munge.socket"
        cmd = [
            "munged",
            "-F",
            "-f",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--log-file={munge / 'munged.log'}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--seed-file={munge / 'munged.seed'}",
        ]
        self._spawn("munged", cmd)
        _wait_for(self.munge_socket.exists, 20, "munged socket")

    def _write_conf(self) -> None:
        state = self.root / "state"
        state.mkdir(exist_ok=True)
        (self.root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        lines = [
            "ClusterName=hpcpipe-test",
            f"SlurmctldHost={socket.gethostname()}({CTL_ADDR})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire also holds a requeued job back this long (default 120 s).
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            f"StateSaveLocation={state}",
            f"SlurmdSpoolDir={self.root}/spool-%n",
            f"SlurmctldPidFile={self.root}/slurmctld.pid",
            f"SlurmdPidFile={self.root}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.root}/slurmctld.log",
            f"SlurmdLogFile={self.root}/slurmd-%n.log",
            "SlurmctldPort=6817",
            "SlurmdPort=6818",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=10",
            "MinJobAge=600",
            "JobRequeue=1",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        for node in self.nodes:
            lines.append(
                f"NodeName={node.name} NodeHostname={node.name} NodeAddr={node.addr} "
                f"CPUs={self.cpus_per_node} RealMemory=4000 State=UNKNOWN"
            )
        names = ",".join(n.name for n in self.nodes)
        lines.append(
            f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
        )
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.root / f"{name}.out").open("wb")
        # Its own process group: stop() signals the daemon and whatever it started.
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        self.procs.append(proc)

    def _wait_idle(self, timeout_s: float) -> None:
        def idle() -> bool:
            out = self.run("sinfo", "--noheader", "--format=%T").stdout.split()
            return len(out) >= 1 and all(state.rstrip("*") == "idle" for state in out)

        _wait_for(idle, timeout_s, "both nodes idle in sinfo", self._diagnose)

    def _diagnose(self) -> str:
        tail = [
            f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(self.root.glob("*.out"))
        ]
        return self.run("sinfo", "-N", "-l").stdout + "\n".join(tail)

    def _kill_leftovers(self) -> None:
        """slurmstepd and job processes outlive slurmd; end those that use this cluster's files."""
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if str(self.root).encode() in environ or str(self.root).encode() in cmdline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)


def _sh(*argv: str) -> None:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")


def _wait_for(ready, timeout_s: float, what: str, diagnose=None) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.5)
    detail = diagnose() if diagnose else ""
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{detail}")
