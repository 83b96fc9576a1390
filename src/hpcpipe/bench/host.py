"""Host memory figures from /proc/meminfo, used to size benchmark buffers and by `doctor`."""

from __future__ import annotations

from pathlib import Path

# Assumed when /proc/meminfo cannot be read (not Linux): small enough for any development host.
FALLBACK_AVAILABLE_BYTES = 4 << 30


def meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    """/proc/meminfo in bytes ({'MemTotal': ..., 'MemAvailable': ...}); empty when unreadable."""
    figures: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return figures
    for line in lines:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
            figures[key.strip()] = int(parts[0]) * scale
    return figures


def available_host_memory() -> int:
    """Bytes the kernel says can be allocated without swapping (MemAvailable)."""
    return meminfo().get("MemAvailable", FALLBACK_AVAILABLE_BYTES)
