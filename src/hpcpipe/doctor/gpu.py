"""GPU checks through NVML (model, memory, driver, ECC, temperature, power, NVLink) and topology."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
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
