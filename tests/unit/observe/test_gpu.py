"""GPU telemetry: NVML readings become hpcpipe and DCGM series; no GPU costs nothing and says so.

The GPU here is a stand-in module with NVML's function names and error class (this machine has no
GPU and no driver); the real nvidia-ml-py is exercised by the no-driver test.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hpcpipe.observe.gpu import GpuCollector, GpuSampler, read_sample, slowdown_names


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """One H100-like GPU; ``reasons`` and ``sm_mhz`` can change between samples."""

    NVMLError = FakeNVMLError
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    NVML_VOLATILE_ECC = 0

    def __init__(self) -> None:
        self.reasons = 0x0
        self.sm_mhz = 1980
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if uuid != "GPU-abc":
            raise FakeNVMLError("not found")
        return "h0"

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"h{index}"

    def nvmlDeviceGetUUID(self, handle: Any) -> bytes:
        return b"GPU-abc"

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        return SimpleNamespace(used=40 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return 71

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return 612_500  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return 9_000_000  # mJ

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        return self.sm_mhz if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self.reasons

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        return (2, 1, 0, 0)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, kind: int, counter: int) -> int:
        return 5 if kind == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else 0

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        raise FakeNVMLError("not supported")  # an unsupported field: absent, not an error


def _series(collector: GpuCollector) -> dict[str, Any]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_sample_converts_nvml_units_to_base_units() -> None:
    nvml = FakeNVML()
    nvml.reasons = 0x40 | 0x1  # hardware thermal slowdown (+ idle, which is not a slowdown)
    sample = read_sample(nvml, "h0", 0)
    assert sample.util_ratio == 0.87
    assert sample.power_w == 612.5
    assert sample.energy_j == 9000.0
    assert sample.sm_clock_hz == 1980e6
    assert sample.mem_used_bytes == 40 * 2**30
    assert sample.pcie_replays is None
    assert sample.nvlink_tx_bytes is None  # no field-value API on this stand-in
    assert sample.throttled == 1.0
    assert slowdown_names(0x40 | 0x1) == ["hw_thermal"]
    assert read_sample(FakeNVML(), "h0", 0).throttled == 0.0


def test_sampler_refreshes_off_the_training_thread_and_exports_both_namings() -> None:
    nvml = FakeNVML()
    sampler = GpuSampler(0.05, gpu_index=0, uuid="GPU-abc", nvml=nvml)
    assert sampler.start()
    try:
        nvml.sm_mhz = 1200
        deadline = time.monotonic() + 5
        while sampler.latest is not None and sampler.latest.sm_clock_hz != 1200e6:
            assert time.monotonic() < deadline, "the sampler thread never refreshed"
            time.sleep(0.02)
        labels = {"run": "r", "rank": "0", "node": "n1", "recipe": "gpt"}
        series = _series(GpuCollector(sampler, labels, dcgm_names=True))
    finally:
        sampler.stop()
    assert nvml.shutdowns == 1
    util = series["hpcpipe_gpu_utilization_ratio"]
    assert util.value == 0.87
    assert util.labels == {**labels, "gpu": "0", "uuid": "GPU-abc", "model": "NVIDIA H100 80GB HBM3"}
    assert series["hpcpipe_gpu_energy_joules_total"].value == 9000.0
    assert series["hpcpipe_gpu_sm_clock_hertz"].value == 1200e6
    assert "hpcpipe_gpu_pcie_replays_total" not in series
    dcgm = series["DCGM_FI_DEV_GPU_UTIL"]
    assert dcgm.value == 87.0
    model = "NVIDIA H100 80GB HBM3"
    expected = {"gpu": "0", "UUID": "GPU-abc", "device": "nvidia0", "modelName": model, "Hostname": "n1"}
    assert dcgm.labels == expected
    assert series["DCGM_FI_DEV_FB_USED"].value == 40 * 1024  # MiB, as dcgm-exporter reports it
    assert series["DCGM_FI_DEV_SM_CLOCK"].value == 1200
    assert series["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].value == 9_000_000


def test_without_dcgm_names_only_hpcpipe_series() -> None:
    sampler = GpuSampler(60, gpu_index=0, uuid=None, nvml=FakeNVML())
    assert sampler.start()
    sampler.stop()
    series = _series(GpuCollector(sampler, {"run": "r", "rank": "0", "node": "n", "recipe": "gpt"}, False))
    assert series and all(name.startswith("hpcpipe_gpu_") for name in series)


def test_no_gpu_costs_nothing_and_says_why() -> None:
    cpu = GpuSampler(5, gpu_index=None, uuid=None)
    assert not cpu.start()
    assert cpu.off_reason == "no GPU on this rank"
    assert cpu._thread is None
    # The real nvidia-ml-py on a machine without an NVIDIA driver.
    pytest.importorskip("pynvml")
    no_driver = GpuSampler(5, gpu_index=0, uuid=None)
    if no_driver.start():  # pragma: no cover - only on a GPU machine
        no_driver.stop()
        pytest.skip("this machine has an NVIDIA driver")
    assert no_driver.off_reason is not None and no_driver.off_reason.startswith("NVML unavailable")
    assert no_driver._thread is None


def test_a_start_that_fails_after_nvml_init_undoes_the_init() -> None:
    """NVML counts its inits: a device that could not be read left the library initialised."""

    class Unreadable(FakeNVML):
        def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
            raise RuntimeError("GPU is lost")  # not an NVMLError: the sample fails

    nvml = Unreadable()
    sampler = GpuSampler(5, gpu_index=0, uuid="GPU-abc", nvml=nvml)
    assert not sampler.start() and sampler.off_reason == "NVML unavailable: GPU is lost"
    assert (nvml.inits, nvml.shutdowns) == (1, 1)
