"""`hpcpipe doctor` on a staged node: tools missing, failing, hanging or reporting problems."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from hpcpipe.doctor import (
    CHECKS,
    FAIL,
    OK,
    SKIPPED,
    WARN,
    Probe,
    check_env,
    check_gpus,
    check_ibstat,
    check_slurm,
    check_topology,
    run_checks,
    worst_status,
)

IBSTAT = """CA 'mlx5_0'
\tCA type: MT4129
\tPort 1:
\t\tState: Active
\t\tPhysical state: LinkUp
\t\tRate: 400
\t\tLink layer: InfiniBand
CA 'mlx5_1'
\tPort 1:
\t\tState: Down
\t\tPhysical state: Disabled
\t\tRate: 10
\t\tLink layer: InfiniBand
"""


def tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!{sys.executable}\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def node(tmp_path: Path) -> Probe:
    """An empty PATH, no NVML, a /sys with two network interfaces and no InfiniBand devices."""
    (tmp_path / "bin").mkdir()
    for iface in ("eth0", "lo"):
        (tmp_path / "root/sys/class/net" / iface).mkdir(parents=True)

    def no_nvml() -> types.ModuleType:
        raise ImportError("No module named 'pynvml'")

    return Probe(
        run_dir=tmp_path / "runs",
        env={"PATH": str(tmp_path / "bin")},
        sys_root=tmp_path / "root",
        load_nvml=no_nvml,
        timeout_s=10.0,  # a fake tool is a Python start: slow on a busy machine, never 10 s
    )


def by_name(checks: list[Any]) -> dict[str, Any]:
    return {c.name: c for c in checks}


def test_every_tool_missing_is_skipped_not_a_crash(node: Probe) -> None:
    start = time.perf_counter()
    checks = by_name(run_checks(node))
    assert time.perf_counter() - start < 15
    for name in (
        "gpus (nvml)",
        "gpu topology",
        "infiniband (ibstat)",
        "rdma (ibv_devinfo)",
        "slurm",
        "lustre",
        "containers",
    ):
        assert checks[name].status == SKIPPED, checks[name]
    assert "nvidia-smi not found on PATH" in checks["gpu topology"].summary
    assert "No module named 'pynvml'" in checks["gpus (nvml)"].summary
    assert (
        checks["cpu"].status in (OK, WARN) and checks["python"].status == OK and checks["torch"].status == OK
    )
    assert checks["environment"].status == OK
    assert len(CHECKS) == 15


def test_failing_and_hanging_tools_are_skipped_with_the_reason(node: Probe) -> None:
    bin_dir = Path(node.env["PATH"])
    tool(bin_dir, "nvidia-smi", "import sys; print('NVIDIA-SMI has failed', file=sys.stderr); sys.exit(9)")
    tool(bin_dir, "sinfo", "import time; time.sleep(30)")
    assert check_topology(node)[0].summary == "`nvidia-smi topo -m` exited 9: NVIDIA-SMI has failed"
    node.timeout_s = 1.0  # sinfo hangs: only it waits out the timeout
    start = time.perf_counter()
    (slurm,) = check_slurm(node)
    assert time.perf_counter() - start < 5
    assert slurm.status == SKIPPED and "timed out after 1 s" in slurm.summary


def test_ibstat_names_the_port_that_is_down(node: Probe) -> None:
    tool(Path(node.env["PATH"]), "ibstat", f"print({IBSTAT!r})")
    (check,) = check_ibstat(node)
    assert check.status == WARN
    assert check.summary == "1/2 ports active at 400 Gb/s; not active: mlx5_1/1 (Down)"


def test_rdma_devices_without_tools_warn(node: Probe) -> None:
    (node.sys_root / "sys/class/infiniband/mlx5_0").mkdir(parents=True)
    (check,) = check_ibstat(node)
    assert check.status == WARN and "mlx5_0" in check.summary and "infiniband-diags" in check.summary


def test_slurm_with_drained_nodes(node: Probe) -> None:
    bin_dir = Path(node.env["PATH"])
    tool(bin_dir, "sinfo", "print('gpu*|up|14|idle'); print('gpu*|up|2|drain'); print('debug|up|1|mix')")
    tool(bin_dir, "scontrol", "print('slurm 23.11.4')")
    (check,) = check_slurm(node)
    assert check.status == WARN
    assert check.summary == "slurm 23.11.4; 2 partition(s); unavailable: gpu*: 2 node(s) drain"
    # Not responding ("idle*") read as healthy; powered off for power saving ("idle~") is.
    tool(bin_dir, "sinfo", "print('gpu|up|4|idle*'); print('gpu|up|8|idle~')")
    (check,) = check_slurm(node)
    assert check.status == WARN and check.summary.endswith("unavailable: gpu: 4 node(s) idle*")


def test_an_allocation_is_reported_where_sinfo_is_missing(node: Probe) -> None:
    """The job's details came only after sinfo succeeded: a compute node without sinfo got SKIPPED."""
    node.env = {
        **node.env,
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_GPUS_ON_NODE": "4",
    }
    (check,) = check_slurm(node)
    assert check.status == OK
    assert check.summary == (
        "scontrol unavailable; sinfo unavailable (sinfo not found on PATH); inside job 4242 on n[1-2] "
        "(2 node(s), partition gpu, GPUs per node 4, gres -)"
    )
    assert check.details["job"]["id"] == "4242" and check.details["sinfo"] == "sinfo not found on PATH"
    # sinfo there but failing: the controller does not answer (srun steps and requeues need it).
    tool(
        Path(node.env["PATH"]),
        "sinfo",
        "import sys; print('Unable to contact slurm controller', file=sys.stderr); sys.exit(1)",
    )
    (check,) = check_slurm(node)
    assert check.status == WARN and "Unable to contact slurm controller" in check.summary


def test_the_topology_matrix_header_is_no_gpu(node: Probe) -> None:
    """The header line, indented ("\tGPU0\tNIC0"), was counted: one GPU read as two on PCIe."""
    matrix = "\tGPU0\tNIC0\tCPU Affinity\nGPU0\t X \tPHB\t0-31\nNIC0\tPHB\t X \t\n"
    tool(Path(node.env["PATH"]), "nvidia-smi", f"print({matrix!r}, end='')")
    (check,) = check_topology(node)
    assert (check.status, check.summary) == (OK, "1 GPU(s)")


class FakeNVML(types.SimpleNamespace):
    """pynvml's surface as check_gpus uses it, for two GPUs: one healthy, one with ECC errors."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):  # pynvml's name
        pass

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_TEMPERATURE_GPU = 0
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1

    def __init__(self) -> None:
        super().__init__(shut=False)

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return types.SimpleNamespace(total=80 << 30)

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        return 3 if h == 1 else 0

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        raise self.NVMLError_NotSupported("Not Supported")

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 41

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 120_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= 18:
            raise self.NVMLError_NotSupported("Not Supported")
        return 0 if (h == 0 and link == 5) else 1


def test_gpus_through_nvml(node: Probe) -> None:
    fake = FakeNVML()
    node.load_nvml = lambda: fake  # type: ignore[assignment, return-value]
    gpu0, gpu1 = check_gpus(node)
    assert gpu0.status == WARN and "NVLink 17/18 links active" in gpu0.summary
    assert gpu0.details["power_w"] == 120.0 and gpu0.details["temperature_c"] == 41
    assert gpu1.status == FAIL and "3 uncorrected ECC errors since boot" in gpu1.summary
    assert "driver 550.54.15" in gpu1.summary and fake.shut


class LostGPU(FakeNVML):
    """GPU 1 has fallen off the bus: NVML cannot even give a handle for it."""

    class NVMLError_GpuIsLost(FakeNVML.NVMLError):  # pynvml's name
        pass

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i == 1:
            raise self.NVMLError_GpuIsLost("GPU is lost")
        return i


def test_a_lost_gpu_fails_its_own_row_and_the_others_are_still_reported(node: Probe) -> None:
    """One lost GPU failed the whole list: a single 'gpus WARN' row, GPU 0 unreported, exit 0."""
    node.load_nvml = LostGPU
    gpu0, gpu1 = run_checks(node, (check_gpus,))
    assert gpu0.name == "gpu 0" and "NVIDIA H100" in gpu0.summary
    assert (gpu1.name, gpu1.status) == ("gpu 1", FAIL)
    assert gpu1.summary == "NVML cannot query it: GPU is lost (NVMLError_GpuIsLost)"
    assert worst_status([gpu0, gpu1]) == FAIL


class GpuWithFailingQueries(LostGPU):
    """GPU 1 gives a handle, name and memory, then every health query fails (not 'not supported')."""

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def __getattribute__(self, name: str) -> Any:
        health = ("TotalEccErrors", "RemappedRows", "Temperature", "PowerUsage", "EnforcedPowerLimit")
        if name.removeprefix("nvmlDeviceGet") in (*health, "NvLinkState"):
            call = super().__getattribute__(name)

            def failing(h: int, *args: Any) -> Any:
                if h == 1:
                    raise self.NVMLError_GpuIsLost("GPU is lost")
                return call(h, *args)

            return failing
        return super().__getattribute__(name)


def test_failing_health_queries_fail_the_row_and_unsupported_ones_read_na(node: Probe) -> None:
    """Every NVML error read as 'not supported': a GPU whose queries all failed was OK ('ECC n/a')."""
    node.load_nvml = GpuWithFailingQueries
    gpu0, gpu1 = check_gpus(node)
    assert gpu0.status == WARN and "failed" not in gpu0.summary  # RemappedRows is not supported: n/a
    assert gpu1.status == FAIL and gpu1.summary.endswith(
        "; TotalEccErrors, RemappedRows, Temperature, PowerUsage, EnforcedPowerLimit, NvLinkState"
        " failed: GPU is lost (NVMLError_GpuIsLost)"
    )
    assert gpu1.details["failed_queries"]["Temperature"] == "GPU is lost (NVMLError_GpuIsLost)"


def test_environment_variables_that_break_jobs(node: Probe) -> None:
    node.env = {
        **node.env,
        "NCCL_SOCKET_IFNAME": "ib0",
        "GLOO_SOCKET_IFNAME": "^eth,lo",
        "NCCL_P2P_DISABLE": "1",
        "NCCL_DEBUG": "INFO",
        "MASTER_ADDR": "no-such-host.invalid",
    }
    checks = by_name(check_env(node))
    assert (
        checks["env NCCL_SOCKET_IFNAME"].status == FAIL
        and "eth0, lo" in checks["env NCCL_SOCKET_IFNAME"].summary
    )
    assert checks["env GLOO_SOCKET_IFNAME"].status == FAIL  # every interface excluded
    assert checks["env NCCL_P2P_DISABLE"].status == WARN
    assert checks["env MASTER_ADDR"].status == FAIL
    assert "env NCCL_DEBUG" not in checks  # INFO is fine; TRACE is not
    node.env = {
        **node.env,
        "NCCL_SOCKET_IFNAME": "=eth0",
        "GLOO_SOCKET_IFNAME": "eth",
        "MASTER_ADDR": "localhost",
        "NCCL_P2P_DISABLE": "0",
    }
    assert [c.status for c in check_env(node)] == [OK]


def test_a_crashing_check_becomes_a_warning(node: Probe) -> None:
    def check_broken(probe: Probe) -> list[Any]:
        raise KeyError("surprise")

    (row,) = run_checks(node, (check_broken,))
    assert row.name == "broken" and row.status == WARN and "KeyError" in row.summary
    assert worst_status([row]) == WARN


def test_cli_json_and_exit_code(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = {"PATH": str(tmp_path), "NCCL_SOCKET_IFNAME": "nonexistent0"}
    proc = cli("doctor", "--run-dir", str(tmp_path / "runs"), "--json", "-", env=env, cwd=tmp_path)
    report = json.loads(proc.stdout)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["env NCCL_SOCKET_IFNAME"] == FAIL and report["status"] == FAIL
    assert proc.returncode == 1
    assert statuses["slurm"] == SKIPPED and statuses["disk (run dir)"] in (OK, WARN)
    assert os.environ.get("NCCL_SOCKET_IFNAME") != "nonexistent0"


@pytest.mark.parametrize("under", ["", "runs/x"])
def test_a_run_dir_that_is_a_file_or_under_one_fails_the_disk_check(node: Probe, under: str) -> None:
    """A file as --run-dir (or a path below one) passed: the first run then failed to mkdir."""
    from dataclasses import replace

    from hpcpipe.doctor.host import check_disk

    node.run_dir.write_text("not a directory")
    [check] = check_disk(replace(node, run_dir=node.run_dir / under))
    assert check.status == FAIL and f"{node.run_dir} is a file, not a directory" in check.summary


@pytest.mark.parametrize("raises", ["exists", "resolve"])
def test_a_run_dir_under_an_unreadable_folder_fails_disk_and_lustre(
    node: Probe, monkeypatch: pytest.MonkeyPatch, raises: str
) -> None:
    """PermissionError (Path.exists, or resolve through /proc/1/root) made 'disk WARN could not
    run this check' and exit 0."""
    from hpcpipe.doctor.cluster import check_lustre
    from hpcpipe.doctor.host import check_disk

    locked = node.run_dir.parent / "locked"
    real = getattr(Path, raises)

    def denied(path: Path, *args: Any) -> Any:  # as /proc/1/root is to an unprivileged container
        if path.is_relative_to(locked):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args)

    monkeypatch.setattr(Path, raises, denied)
    node.run_dir = locked / "runs"
    tool(Path(node.env["PATH"]), "lfs", "print('every OST fine')")
    rows = run_checks(node, (check_disk, check_lustre))
    assert [(c.name, c.status, c.summary) for c in rows] == [
        ("disk (run dir)", FAIL, f"{locked}/runs: not accessible (Permission denied)"),
        ("lustre", FAIL, f"{locked}/runs: not accessible (Permission denied)"),
    ]
