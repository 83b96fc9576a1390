"""InfiniBand / RDMA checks (`ibstat`, `ibv_devinfo`)."""

from __future__ import annotations

import re

from hpcpipe.doctor.probe import (
    OK,
    SKIPPED,
    WARN,
    Check,
    Probe,
)

# ---------------------------------------------------------------------------------------------
# Network: InfiniBand / RDMA


def check_ibstat(probe: Probe) -> list[Check]:
    out, why = probe.run(["ibstat"])
    if out is None:
        return [_missing_rdma_tool(probe, "infiniband (ibstat)", why)]
    ports = _ibstat_ports(out)
    if not ports:
        return [Check("infiniband (ibstat)", WARN, "ibstat lists no ports")]
    down = [p for p in ports if p["state"] != "Active"]
    rates = sorted({p["rate"] for p in ports if p["state"] == "Active"})
    summary = f"{len(ports) - len(down)}/{len(ports)} ports active" + (
        f" at {', '.join(rates)} Gb/s" if rates else ""
    )
    details = {"ports": ports}
    if down:
        names = ", ".join(f"{p['ca']}/{p['port']} ({p['state']})" for p in down)
        return [Check("infiniband (ibstat)", WARN, f"{summary}; not active: {names}", details)]
    return [Check("infiniband (ibstat)", OK, summary, details)]


def _ibstat_ports(text: str) -> list[dict[str, str]]:
    """Ports from ``ibstat`` output: CA name, port number, State, Rate, Link layer."""
    ports: list[dict[str, str]] = []
    ca = ""
    for raw in text.splitlines():
        line = raw.strip()
        if match := re.match(r"CA '([^']+)'", line):
            ca = match.group(1)
        elif match := re.match(r"Port (\d+):", line):
            ports.append({"ca": ca, "port": match.group(1), "state": "?", "rate": "?", "link_layer": "?"})
        elif ports and ":" in line:
            key, value = (part.strip() for part in line.split(":", 1))
            field_name = {"State": "state", "Rate": "rate", "Link layer": "link_layer"}.get(key)
            if field_name:
                ports[-1][field_name] = value
    return ports


def check_ibv_devinfo(probe: Probe) -> list[Check]:
    out, why = probe.run(["ibv_devinfo"])
    if out is None:
        return [_missing_rdma_tool(probe, "rdma (ibv_devinfo)", why)]
    states = re.findall(r"state:\s+(PORT_\w+)", out)
    devices = re.findall(r"hca_id:\s+(\S+)", out)
    if not devices:
        return [Check("rdma (ibv_devinfo)", WARN, "ibv_devinfo found no RDMA devices")]
    active = states.count("PORT_ACTIVE")
    summary = f"{len(devices)} device(s) ({', '.join(devices)}), {active}/{len(states)} ports PORT_ACTIVE"
    return [Check("rdma (ibv_devinfo)", OK if active == len(states) else WARN, summary)]


def _missing_rdma_tool(probe: Probe, name: str, why: str) -> Check:
    devices = rdma_devices(probe)
    if devices:
        return Check(
            name,
            WARN,
            f"{why}, but RDMA devices exist ({', '.join(devices)}): install rdma-core / infiniband-diags",
        )
    return Check(name, SKIPPED, f"{why}; no RDMA devices in /sys/class/infiniband")


def rdma_devices(probe: Probe) -> list[str]:
    root = probe.path("/sys/class/infiniband")
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []
