"""GPU checks through NVML (model, memory, driver, ECC, temperature, power, NVLink) and topology."""

from __future__ import annotations

import re
from typing import Any

from hpcpipe.doctor.probe import (
    FAIL,
    GIB,
    HOT_GPU_C,
    OK,
    SKIPPED,
    WARN,
    Check,
    Probe,
)

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
        return [_gpu_row(nvml, i, driver) for i in range(count)]
    finally:
        nvml.nvmlShutdown()


def _gpu_row(nvml: Any, index: int, driver: str) -> Check:
    """One GPU's row. A GPU that NVML cannot reach (fallen off the bus: GpuIsLost) fails on its
    own row, so the other GPUs are still reported and doctor exits 1."""
    try:
        return _gpu(nvml, index, driver)
    except nvml.NVMLError as exc:
        return Check(f"gpu {index}", FAIL, f"NVML cannot query it: {_nvml_error(exc)}")


def _nvml_error(exc: Exception) -> str:
    return f"{exc} ({type(exc).__name__})" if str(exc) else type(exc).__name__


def _gpu(nvml: Any, index: int, driver: str) -> Check:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = _text(nvml.nvmlDeviceGetName(handle))
    memory = nvml.nvmlDeviceGetMemoryInfo(handle).total
    query = _Queries(nvml, handle)
    details: dict[str, Any] = {"name": name, "memory_bytes": memory, "driver": driver}
    problems = _health(nvml, query, details)
    active, links = _nvlinks(nvml, query)
    details.update(nvlink_active=active, nvlink_links=links)
    if links and active < links:
        problems.append((WARN, f"NVLink {active}/{links} links active"))
    if query.failed:
        details["failed_queries"] = query.failed
        problems.append((FAIL, query.failures()))
    ecc, temp = details["ecc_uncorrected_volatile"], details["temperature_c"]
    summary = (
        f"{name}, {memory / GIB:.0f} GiB, driver {driver}, ECC {ecc if ecc is not None else 'n/a'}, "
        f"{temp if temp is not None else '?'} C, " + (f"NVLink {active}/{links}" if links else "no NVLink")
    )
    worst = FAIL if any(s == FAIL for s, _ in problems) else WARN if problems else OK
    return Check(f"gpu {index}", worst, summary + "".join(f"; {t}" for _, t in problems), details)


def _health(nvml: Any, query: _Queries, details: dict[str, Any]) -> list[tuple[str, str]]:
    """(status, text) for ECC errors, row remapping and heat; the readings go into ``details``."""
    problems: list[tuple[str, str]] = []
    ecc = query(
        "nvmlDeviceGetTotalEccErrors", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
    )
    details["ecc_uncorrected_volatile"] = ecc
    if ecc:
        problems.append((FAIL, f"{ecc} uncorrected ECC errors since boot"))
    remap = query("nvmlDeviceGetRemappedRows")
    if remap is not None and (remap[3] or remap[2]):
        problems.append(
            (
                FAIL if remap[3] else WARN,
                "row remapping failed" if remap[3] else "row remap pending (reset the GPU)",
            )
        )
    temp = query("nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU)
    details["temperature_c"] = temp
    if temp is not None and temp >= HOT_GPU_C:
        problems.append((WARN, f"{temp} C (throttles soon)"))
    power = query("nvmlDeviceGetPowerUsage")
    limit = query("nvmlDeviceGetEnforcedPowerLimit")
    details.update(
        power_w=None if power is None else power / 1000, power_limit_w=None if limit is None else limit / 1000
    )
    return problems


def _nvlinks(nvml: Any, query: _Queries) -> tuple[int, int]:
    """(active, present) NVLink links; a link NVML reports as not supported is not present, nor
    is a link number past this GPU's links (the loop goes to NVML's maximum: InvalidArgument)."""
    active = present = 0
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        state = query("nvmlDeviceGetNvLinkState", link, absent=("NVMLError_InvalidArgument",))
        if "NvLinkState" in query.failed:
            break  # once is enough to report a GPU that cannot answer
        if state is None:
            continue
        present += 1
        active += int(state == getattr(nvml, "NVML_FEATURE_ENABLED", 1))
    return active, present


# pynvml's errors for a query this GPU or driver does not have: the value is n/a, not a fault.
_NOT_SUPPORTED = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")


class _Queries:
    """NVML queries on one GPU, each ``nvmlDeviceGet*`` name called with the handle first. A query
    the GPU does not support reads None (n/a). Any other NVML error (GpuIsLost, Unknown, ...)
    also reads None but is kept in ``failed``, so the row FAILs naming the query rather than
    reading OK with every value missing."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml, self.handle = nvml, handle
        self.failed: dict[str, str] = {}  # query (without nvmlDeviceGet) -> error

    def __call__(self, name: str, *args: Any, absent: tuple[str, ...] = ()) -> Any:
        try:
            return getattr(self.nvml, name)(self.handle, *args)
        except self.nvml.NVMLError as exc:
            kinds = tuple(getattr(self.nvml, kind, None) for kind in (*_NOT_SUPPORTED, *absent))
            if not isinstance(exc, tuple(k for k in kinds if isinstance(k, type))):
                self.failed.setdefault(name.removeprefix("nvmlDeviceGet"), _nvml_error(exc))
            return None

    def failures(self) -> str:
        """'Temperature, PowerUsage failed: GPU is lost (NVMLError_GpuIsLost)', one part per error."""
        by_error: dict[str, list[str]] = {}
        for name, error in self.failed.items():
            by_error.setdefault(error, []).append(name)
        return "; ".join(f"{', '.join(names)} failed: {error}" for error, names in by_error.items())


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def check_topology(probe: Probe) -> list[Check]:
    out, why = probe.run(["nvidia-smi", "topo", "-m"])
    if out is None:
        return [Check("gpu topology", SKIPPED, why)]
    # A matrix row starts at the line's start; the header ("\tGPU0\tGPU1...") is indented.
    gpus = [line.split()[0] for line in out.splitlines() if re.match(r"^GPU\d+\s", line)]
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
