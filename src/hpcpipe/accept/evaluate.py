"""PASS/FAIL rows from thresholds and measurements: pure functions, no measuring.

Measurements are the JSON-able results of the benchmark modules, keyed by section
(``connectivity``, ``collectives``, ``compute``, ``throughput``, ``scaling``); a section that
could not be measured holds ``{"error": "..."}``. Every threshold becomes one row; a row passes
only when its figure was measured and reaches the threshold, and a failing row's detail names the
rank or host responsible where the measurement can tell.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from hpcpipe.accept.thresholds import (
    CollectiveThresholds,
    ComputeThresholds,
    ConnectivityThresholds,
    ScalingThresholds,
    Thresholds,
    ThroughputThresholds,
)
from hpcpipe.bench.bus import format_size, parse_size


@dataclass(frozen=True)
class Row:
    section: str
    check: str
    measured: float | None
    required: float
    unit: str
    comparison: str  # ">=" (at least) or "<=" (at most)
    passed: bool
    detail: str  # the whole finding: measured vs required, then where
    where: str = ""  # the rank or host responsible (or why nothing was measured)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 1e5 else f"{value:.4g}"


def row(
    section: str,
    check: str,
    measured: float | None,
    required: float,
    unit: str,
    where: str = "",
    at_most: bool = False,
    why_missing: str = "",
) -> Row:
    """A row; its detail says measured vs required, then ``where`` (the rank or host responsible)."""
    comparison = "<=" if at_most else ">="
    if measured is None:
        reason = f"not measured: {why_missing}"
        return Row(section, check, None, required, unit, comparison, False, reason, reason)
    passed = measured <= required if at_most else measured >= required
    detail = f"{fmt(measured)} vs required {comparison} {fmt(required)} {unit}".rstrip()
    if where:
        detail += f"; {where}"
    return Row(section, check, measured, required, unit, comparison, passed, detail, where)


def evaluate(th: Thresholds, measurements: dict[str, Any], launched_world: int) -> list[Row]:
    """Every row of the thresholds file, in file order."""
    sections: list[tuple[str, Any, Callable[[Any, dict[str, Any] | None], list[Row]]]] = [
        ("connectivity", th.connectivity, lambda s, m: connectivity_rows(s, m, launched_world)),
        ("collectives", th.collectives, collective_rows),
        ("compute", th.compute, compute_rows),
        ("throughput", th.throughput, throughput_rows),
        ("scaling", th.scaling, scaling_rows),
    ]
    rows: list[Row] = []
    for key, section, rows_of in sections:
        if section is not None:
            rows += _judged(key, measurements.get(key), rows_of(section, measurements.get(key)))
    return rows


def _judged(section: str, result: dict[str, Any] | None, rows: list[Row]) -> list[Row]:
    """``rows``, plus a failing one when the section's benchmark failed and no row says so: an
    error that no row judged (a section that made no rows) left the report at PASS."""
    why = result.get("error") if result is not None else None
    if why is None or any(not r.passed for r in rows):
        return rows
    return [*rows, row(section, f"{section} benchmark", None, 0, "errors", at_most=True, why_missing=why)]


def _error(result: dict[str, Any] | None) -> str | None:
    if result is None:
        return "the benchmark did not run"
    return result.get("error")


def connectivity_rows(th: ConnectivityThresholds, result: dict[str, Any] | None, launched: int) -> list[Row]:
    required = th.min_world_size or launched
    why = _error(result)
    if why is not None or result is None:
        rows = [row("connectivity", "ranks reachable", None, required, "ranks", why_missing=why or "")]
        if th.max_rtt_ms is not None:
            rows.append(_unmeasured_rtt(th.max_rtt_ms, why or ""))
        return rows
    ranks = result["ranks"]
    hosts = ", ".join(f"{h} ({sum(r['host'] == h for r in ranks)} ranks)" for h in result["hosts"])
    missing = sorted(set(range(required)) - {r["rank"] for r in ranks})
    where = f"hosts: {hosts}" + (f"; missing ranks: {missing}" if missing else "")
    rows = [row("connectivity", "ranks reachable", float(result["world_size"]), required, "ranks", where)]
    if th.max_rtt_ms is not None:
        timed = [r for r in ranks if r.get("rtt_ms") is not None]
        if not timed:
            rows.append(_unmeasured_rtt(th.max_rtt_ms, "a single rank has no peer"))
        else:
            worst = max(timed, key=lambda r: r["rtt_ms"])
            rows.append(
                row(
                    "connectivity",
                    "rank 0 round trip",
                    worst["rtt_ms"],
                    th.max_rtt_ms,
                    "ms",
                    f"slowest: rank {worst['rank']} on {worst['host']}",
                    at_most=True,
                )
            )
    return rows


def collective_rows(th: CollectiveThresholds, result: dict[str, Any] | None) -> list[Row]:
    why = _error(result)
    measured = (
        {}
        if why is not None or result is None
        else {(r["collective"], r["requested_bytes"]): r for r in result["results"]}
    )
    hosts = [] if result is None else result.get("hosts", [])
    unfit = {} if result is None else result.get("unfit", {})
    rows = []
    for name, sizes in th.busbw_gbps.items():
        for size_text, required in sizes.items():
            size = parse_size(str(size_text))
            check = f"{name} busbw @ {format_size(size)}"
            found = measured.get((name, size))
            if found is None:
                if str(size) in unfit:  # this size alone: the others were measured
                    why_size = (
                        f"collectives.busbw_gbps.{name}.{size_text}: {format_size(size)} {unfit[str(size)]}"
                    )
                else:
                    why_size = why or "size not in the sweep"
                rows.append(row("collectives", check, None, required, "GB/s", why_missing=why_size))
                continue
            rows.append(_collective_row(check, found, required, hosts))
    return rows


def _collective_row(check: str, found: dict[str, Any], required: float, hosts: list[str]) -> Row:
    def host(rank: int) -> str:
        return hosts[rank] if rank < len(hosts) else "?"

    if found["correct"] is False:
        wrong = "wrong result on " + ", ".join(f"rank {r} on {host(r)}" for r in found["wrong_ranks"])
        return Row("collectives", check, found["busbw_gbps"], required, "GB/s", ">=", False, wrong, wrong)
    times = found["per_rank_time_s"]
    slowest = found["slowest_rank"]
    where = (
        f"slowest: rank {slowest} on {host(slowest)}, {times[slowest] * 1e3:.3g} ms "
        f"vs median {statistics.median(times) * 1e3:.3g} ms"
    )
    return row("collectives", check, found["busbw_gbps"], required, "GB/s", where)


def compute_rows(th: ComputeThresholds, result: dict[str, Any] | None) -> list[Row]:
    wanted = [(f"matmul_{d}", f"matmul {d}", v, "TFLOP/s") for d, v in th.matmul_tflops.items()]
    for key, label, value in (
        ("memory_copy", "memory bandwidth", th.memory_bandwidth_gbps),
        ("host_to_device", "host to device", th.host_to_device_gbps),
        ("device_to_host", "device to host", th.device_to_host_gbps),
    ):
        if value is not None:
            wanted.append((key, label, value, "GB/s"))
    why = _error(result)
    rows = []
    for key, label, required, unit in wanted:
        if why is not None or result is None:
            rows.append(row("compute", label, None, required, unit, why_missing=why or ""))
            continue
        per_rank = [(r["figures"].get(key, {}), r) for r in result["ranks"]]
        skipped = [(f, r) for f, r in per_rank if f.get("value") is None]
        if skipped:
            figure, rank = skipped[0]
            reason = figure.get("skipped") or "not in the measurement"
            rows.append(
                row(
                    "compute",
                    label,
                    None,
                    required,
                    unit,
                    why_missing=f"rank {rank['rank']} on {rank['host']}: {reason}",
                )
            )
            continue
        worst_figure, worst = min(per_rank, key=lambda pair: pair[0]["value"])
        where = f"lowest: rank {worst['rank']} on {worst['host']} ({worst['device_name']})"
        rows.append(row("compute", label, worst_figure["value"], required, unit, where))
    return rows


def throughput_rows(th: ThroughputThresholds, result: dict[str, Any] | None) -> list[Row]:
    why = _error(result)
    unit = (
        "tokens/s/device"
        if result is None or result.get("unit", "tokens") == "tokens"
        else "samples/s/device"
    )
    check = f"{th.preset} throughput"
    if why is not None or result is None:
        rows = [row("throughput", check, None, th.min_per_s_per_device, unit, why_missing=why or "")]
        if th.min_mfu is not None:
            rows.append(row("throughput", f"{th.preset} MFU", None, th.min_mfu, "", why_missing=why or ""))
        return rows
    where = f"{result['world_size']} ranks on {', '.join(result.get('hosts') or ['?'])}"
    rows = [row("throughput", check, result["per_s_per_device"], th.min_per_s_per_device, unit, where)]
    if th.min_mfu is not None:
        rows.append(
            row(
                "throughput",
                f"{th.preset} MFU",
                result.get("mfu"),
                th.min_mfu,
                "",
                where,
                why_missing="the device's peak FLOP/s is unknown (set observe.peak_tflops)",
            )
        )
    return rows


def scaling_rows(th: ScalingThresholds, result: dict[str, Any] | None) -> list[Row]:
    why = _error(result)
    larger = sorted(set(th.nproc))[1:]
    if why is not None or result is None:
        return [
            row("scaling", f"{th.mode} efficiency N={n}", None, th.min_efficiency, "", why_missing=why or "")
            for n in larger
        ]
    by_n = {r["nproc"]: r for r in result["rows"] if r["mode"] == th.mode}
    base = by_n[min(by_n)]
    rows = []
    for n in larger:
        found = by_n.get(n)
        if found is None:
            rows.append(
                row(
                    "scaling",
                    f"{th.mode} efficiency N={n}",
                    None,
                    th.min_efficiency,
                    "",
                    why_missing=f"no run at N={n}",
                )
            )
            continue
        where = (
            f"step time {found['step_time_s'] * 1e3:.3g} ms at N={n} vs "
            f"{base['step_time_s'] * 1e3:.3g} ms at N={base['nproc']}"
        )
        rows.append(
            row("scaling", f"{th.mode} efficiency N={n}", found["efficiency"], th.min_efficiency, "", where)
        )
    return rows


def _unmeasured_rtt(max_rtt_ms: float, why: str) -> Row:
    """The round-trip row when no round trip could be measured (it fails, saying why)."""
    return row("connectivity", "rank 0 round trip", None, max_rtt_ms, "ms", at_most=True, why_missing=why)
