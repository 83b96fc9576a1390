"""GPU telemetry through NVML (nvidia-ml-py), sampled off the training thread.

A daemon thread reads this rank's GPU every ``observe.gpu.interval_s`` seconds and keeps the
latest ``GpuSample``; the Prometheus collectors and the imbalance check read that sample, never
NVML itself, so a scrape or a check never waits on the driver. Every query is guarded: a field
the GPU or driver does not support stays None and is not exported.

Without a GPU (a CPU rank, no driver, no NVML library) nothing starts and ``off_reason`` says why,
once. dcgm-exporter's names (``DCGM_FI_DEV_*`` with its ``gpu``, ``UUID``, ``device``,
``modelName`` and ``Hostname`` labels and its units) can be mirrored, so existing DCGM dashboards
show hpcpipe's GPUs; they are exported as gauges, as their names carry no ``_total``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger("hpcpipe.observe.gpu")

# NVML clock-event (throttle) reason bits that mean the GPU runs slower than it could.
SLOWDOWN_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


def slowdown_names(reasons: int) -> list[str]:
    """Names of the slowdown bits set in an NVML clock-event reason mask."""
    return [name for bit, name in SLOWDOWN_REASONS.items() if reasons & bit]


@dataclass(frozen=True)
class GpuSample:
    index: int
    uuid: str
    name: str
    time: float
    util_ratio: float | None = None
    mem_used_bytes: float | None = None
    mem_total_bytes: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    energy_j: float | None = None
    sm_clock_hz: float | None = None
    mem_clock_hz: float | None = None
    clock_event_reasons: int | None = None
    ecc_corrected: float | None = None
    ecc_uncorrected: float | None = None
    remapped_correctable: float | None = None
    remapped_uncorrectable: float | None = None
    remap_failure: float | None = None
    pcie_replays: float | None = None
    nvlink_tx_bytes: float | None = None
    nvlink_rx_bytes: float | None = None

    @property
    def throttled(self) -> float | None:
        """1.0 when a slowdown reason (power cap, thermal, hardware slowdown) is active."""
        if self.clock_event_reasons is None:
            return None
        return float(bool(slowdown_names(self.clock_event_reasons)))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_sample(nvml: Any, handle: Any, index: int) -> GpuSample:
    """One reading of every supported field of ``handle``."""

    def get(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except nvml.NVMLError:
            return None

    util = get(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    memory = get(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    power_mw = get(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    energy_mj = get(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
    sm_mhz = get(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
    mem_mhz = get(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM))
    reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    remap = get(lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    ecc = {
        kind: get(functools.partial(nvml.nvmlDeviceGetTotalEccErrors, handle, kind, nvml.NVML_VOLATILE_ECC))
        for kind in (nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
    }
    tx, rx = _nvlink_bytes(nvml, handle, get)
    return GpuSample(
        index=index,
        uuid=_text(get(lambda: nvml.nvmlDeviceGetUUID(handle)) or f"GPU-{index}"),
        name=_text(get(lambda: nvml.nvmlDeviceGetName(handle)) or "unknown"),
        time=time.time(),
        util_ratio=None if util is None else util.gpu / 100.0,
        mem_used_bytes=None if memory is None else float(memory.used),
        mem_total_bytes=None if memory is None else float(memory.total),
        temp_c=get(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
        power_w=None if power_mw is None else power_mw / 1000.0,
        energy_j=None if energy_mj is None else energy_mj / 1000.0,
        sm_clock_hz=None if sm_mhz is None else sm_mhz * 1e6,
        mem_clock_hz=None if mem_mhz is None else mem_mhz * 1e6,
        clock_event_reasons=None if reasons_fn is None else get(lambda: int(reasons_fn(handle))),
        ecc_corrected=ecc[nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED],
        ecc_uncorrected=ecc[nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED],
        remapped_correctable=None if remap is None else float(remap[0]),
        remapped_uncorrectable=None if remap is None else float(remap[1]),
        remap_failure=None if remap is None else float(bool(remap[3])),
        pcie_replays=get(lambda: nvml.nvmlDeviceGetPcieReplayCounter(handle)),
        nvlink_tx_bytes=tx,
        nvlink_rx_bytes=rx,
    )


def _nvlink_bytes(nvml: Any, handle: Any, get: Callable[[Callable[[], Any]], Any]) -> tuple[Any, Any]:
    """NVLink data bytes sent and received since driver load (None without NVLink)."""
    ids = [getattr(nvml, f"NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{d}", None) for d in ("TX", "RX")]
    if None in ids or not hasattr(nvml, "nvmlDeviceGetFieldValues"):
        return None, None
    values = get(lambda: nvml.nvmlDeviceGetFieldValues(handle, ids))
    if values is None or any(v.nvmlReturn != 0 for v in values):
        return None, None
    tx, rx = (float(v.value.ullVal) * 1024 for v in values)  # NVML counts KiB
    return tx, rx


class GpuSampler:
    """The latest ``GpuSample`` of one GPU, refreshed on a daemon thread."""

    def __init__(self, interval_s: float, gpu_index: int | None, uuid: str | None, nvml: Any = None) -> None:
        self.interval_s = interval_s
        self.gpu_index = gpu_index
        self.uuid = uuid
        self._nvml = nvml
        self.latest: GpuSample | None = None
        self.off_reason: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Start sampling; False (with ``off_reason``) when there is nothing to sample."""
        if self.gpu_index is None:
            self.off_reason = "no GPU on this rank"
            return False
        nvml, initialized = None, False
        try:
            nvml = self._nvml or _import_nvml()
            nvml.nvmlInit()
            initialized = True
            handle = self._handle(nvml)
            self.latest = read_sample(nvml, handle, self.gpu_index)
        except Exception as exc:  # the library, the driver, or the device: all mean "no telemetry"
            self.off_reason = f"NVML unavailable: {exc or type(exc).__name__}"
            if nvml is not None and initialized:  # NVML counts its inits: this one is undone
                with contextlib.suppress(Exception):
                    nvml.nvmlShutdown()
            return False
        self._thread = threading.Thread(
            target=self._run, args=(nvml, handle), name="hpcpipe-gpu", daemon=True
        )
        self._thread.start()
        return True

    def _handle(self, nvml: Any) -> Any:
        if self.uuid:
            try:
                return nvml.nvmlDeviceGetHandleByUUID(self.uuid)
            except nvml.NVMLError:
                pass  # a MIG or renamed device: fall back to the index
        return nvml.nvmlDeviceGetHandleByIndex(self.gpu_index)

    def _run(self, nvml: Any, handle: Any) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.latest = read_sample(nvml, handle, self.latest.index if self.latest else 0)
            except Exception as exc:  # never kill training over telemetry
                log.warning("GPU telemetry stopped: %s", exc)
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5)
            with contextlib.suppress(Exception):
                (self._nvml or _import_nvml()).nvmlShutdown()


def _import_nvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


# -- Prometheus collectors -----------------------------------------------------------------------

_HPCPIPE_GAUGES = (
    ("utilization_ratio", "util_ratio", "GPU busy fraction over the last sample period."),
    ("memory_used_bytes", "mem_used_bytes", "Device memory in use (all processes)."),
    ("memory_total_bytes", "mem_total_bytes", "Device memory."),
    ("temperature_celsius", "temp_c", "GPU core temperature."),
    ("power_watts", "power_w", "Board power draw."),
    ("sm_clock_hertz", "sm_clock_hz", "SM clock."),
    ("memory_clock_hertz", "mem_clock_hz", "Memory clock."),
    ("clock_event_reasons", "clock_event_reasons", "NVML clock-event (throttle) reason bit mask."),
    ("throttled", "throttled", "1 while a power, thermal or hardware slowdown reason is active."),
    ("remapped_rows_correctable", "remapped_correctable", "Rows remapped after correctable errors."),
    ("remapped_rows_uncorrectable", "remapped_uncorrectable", "Rows remapped after uncorrectable errors."),
    ("row_remap_failure", "remap_failure", "1 when a row remapping failed (replace the GPU)."),
)
_HPCPIPE_COUNTERS = (
    ("energy_joules", "energy_j", "Energy since the driver loaded."),
    ("ecc_corrected_errors", "ecc_corrected", "Corrected (single-bit) ECC errors since the driver loaded."),
    ("ecc_uncorrected_errors", "ecc_uncorrected", "Uncorrected (double-bit) ECC errors since driver load."),
    ("pcie_replays", "pcie_replays", "PCIe replay count."),
    ("nvlink_transmit_bytes", "nvlink_tx_bytes", "NVLink data bytes sent."),
    ("nvlink_receive_bytes", "nvlink_rx_bytes", "NVLink data bytes received."),
)
# dcgm-exporter name, sample field, scale to DCGM's unit.
_DCGM_FIELDS = (
    ("DCGM_FI_DEV_GPU_UTIL", "util_ratio", 100.0),
    ("DCGM_FI_DEV_FB_USED", "mem_used_bytes", 1 / 2**20),
    ("DCGM_FI_DEV_GPU_TEMP", "temp_c", 1.0),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", 1.0),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy_j", 1000.0),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_hz", 1e-6),
    ("DCGM_FI_DEV_MEM_CLOCK", "mem_clock_hz", 1e-6),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "clock_event_reasons", 1.0),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_corrected", 1.0),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_uncorrected", 1.0),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "remapped_correctable", 1.0),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "remapped_uncorrectable", 1.0),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "remap_failure", 1.0),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replays", 1.0),
)


class GpuCollector:
    """``hpcpipe_gpu_*`` series from the sampler's latest sample (and DCGM's names if asked)."""

    def __init__(self, sampler: GpuSampler, labels: dict[str, str], dcgm_names: bool) -> None:
        self.sampler = sampler
        self.labels = labels  # run, rank, node, recipe
        self.dcgm_names = dcgm_names

    def describe(self) -> list[Metric]:
        return []  # names depend on what the GPU supports: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        sample = self.sampler.latest
        if sample is None:
            return
        names = [*self.labels, "gpu", "uuid", "model"]
        values = [*self.labels.values(), str(sample.index), sample.uuid, sample.name]
        families: list[tuple[type, tuple[tuple[str, str, str], ...]]] = [
            (GaugeMetricFamily, _HPCPIPE_GAUGES),
            (CounterMetricFamily, _HPCPIPE_COUNTERS),
        ]
        for family_type, fields in families:
            for suffix, attr, doc in fields:
                value = getattr(sample, attr)
                if value is not None:
                    family = family_type(f"hpcpipe_gpu_{suffix}", doc, labels=names)
                    family.add_metric(values, float(value))
                    yield family
        if self.dcgm_names:
            yield from self._dcgm(sample)

    def _dcgm(self, sample: GpuSample) -> Iterator[Metric]:
        names = ["gpu", "UUID", "device", "modelName", "Hostname"]
        node = self.labels.get("node", "")
        values = [str(sample.index), sample.uuid, f"nvidia{sample.index}", sample.name, node]
        for name, attr, scale in _DCGM_FIELDS:
            value = getattr(sample, attr)
            if value is not None:
                family = GaugeMetricFamily(name, f"{name} (dcgm-exporter name, from NVML)", labels=names)
                family.add_metric(values, float(value) * scale)
                yield family
