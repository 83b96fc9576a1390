"""Straggler detection inside the training loop: which rank is slow, and in which phase.

In synchronous data parallelism every rank's step takes as long as the slowest rank's: the
others wait in the gradient all-reduce. So step time cannot name a straggler, but *busy time*
can: step time minus exposed communication (the wait), i.e. the time a rank spent on its own
work. On logged steps, every ``observe.imbalance.every_steps``, one all-gather of a small row per
rank (``FIELDS``: phase means over the logging interval, plus the GPU's SM clock, power and
clock-event reasons when telemetry has them) gives every rank the same table, and

    imbalance = (max - min) / median   of the ranks' busy time.

Above ``threshold`` (after ``warmup_steps``), for the same rank in ``consecutive`` checks in a
row, the slowest rank is named with its host and the
phase that is furthest above the other ranks' median for that phase (``data``, ``forward``,
``backward``, ``optimizer``, or ``other`` for time in none of them), and a throttled GPU
(slowdown reasons set, or an SM clock 10% under the median) is named as the cause.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from hpcpipe.config.observe import ImbalanceConfig
from hpcpipe.observe.gpu import slowdown_names

FIELDS = (
    "step_time_s",
    "data_time_s",
    "forward_time_s",
    "backward_time_s",
    "optimizer_time_s",
    "comm_time_s",
    "sm_clock_hz",
    "power_w",
    "clock_event_reasons",
)
WORK_PHASES = ("data", "forward", "backward", "optimizer")
CLOCK_DROP = 0.90  # an SM clock under 90% of the ranks' median counts as throttled
HOST_BYTES = 64


@dataclass(frozen=True)
class Imbalance:
    step: int
    ratio: float
    threshold: float
    slowest_rank: int
    host: str
    phase: str  # the slowest rank's phase furthest above the median of that phase
    phase_excess_s: float  # that phase: slowest rank's seconds per step minus the median
    busy_s: list[float]  # per rank: step time minus exposed communication, seconds per step
    cause: str | None  # a throttled GPU on the slowest rank, when telemetry says so
    streak: int = 0  # checks in a row, this one included, with this rank slowest and over threshold

    @property
    def over(self) -> bool:
        return self.ratio > self.threshold

    def to_event(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        excess_ms = self.phase_excess_s * 1000
        text = (
            f"rank imbalance {self.ratio:.0%} > {self.threshold:.0%} at step {self.step}: rank "
            f"{self.slowest_rank} on {self.host} is slowest, {self.phase} +{excess_ms:.1f} ms per step "
            f"over the median ({self.streak} checks in a row)"
        )
        return text + (f"; cause: {self.cause}" if self.cause else "")


def analyse(step: int, table: list[list[float]], hosts: list[str], threshold: float) -> Imbalance:
    """The imbalance of one gathered table (a row of ``FIELDS`` per rank; NaN: unknown)."""
    rows = [dict(zip(FIELDS, row, strict=True)) for row in table]
    busy = [_busy(r) for r in rows]
    median = statistics.median(busy)
    ratio = (max(busy) - min(busy)) / median if median > 0 else 0.0
    slowest = max(range(len(busy)), key=busy.__getitem__)
    phases = {p: [_num(r[f"{p}_time_s"]) for r in rows] for p in WORK_PHASES}
    phases["other"] = [b - sum(phases[p][i] for p in WORK_PHASES) for i, b in enumerate(busy)]
    excess = {p: v[slowest] - statistics.median(v) for p, v in phases.items()}
    phase = max(excess, key=excess.__getitem__)
    return Imbalance(
        step=step,
        ratio=ratio,
        threshold=threshold,
        slowest_rank=slowest,
        host=hosts[slowest] if slowest < len(hosts) else "?",
        phase=phase,
        phase_excess_s=excess[phase],
        busy_s=busy,
        cause=_gpu_cause(rows, slowest),
    )


def _num(value: float) -> float:
    return 0.0 if math.isnan(value) else value


def _busy(row: dict[str, float]) -> float:
    return max(0.0, _num(row["step_time_s"]) - _num(row["comm_time_s"]))


def _gpu_cause(rows: list[dict[str, float]], rank: int) -> str | None:
    row = rows[rank]
    reasons = row["clock_event_reasons"]
    named = slowdown_names(int(reasons)) if not math.isnan(reasons) else []
    clocks = [r["sm_clock_hz"] for r in rows if not math.isnan(r["sm_clock_hz"])]
    clock = row["sm_clock_hz"]
    slow_clock = bool(clocks) and not math.isnan(clock) and clock < CLOCK_DROP * statistics.median(clocks)
    if not named and not slow_clock:
        return None
    detail = []
    if not math.isnan(clock) and clocks:
        detail.append(f"SM clock {clock / 1e6:.0f} MHz vs median {statistics.median(clocks) / 1e6:.0f} MHz")
    if not math.isnan(row["power_w"]):
        detail.append(f"{row['power_w']:.0f} W")
    return f"GPU throttled ({', '.join(named) or 'low clock'}): " + ", ".join(detail)


GpuReading = Callable[[], tuple[float, float, float]]
"""(SM clock Hz, power W, clock-event reasons) of this rank's GPU; NaN where unknown."""


class ImbalanceDetector:
    """Runs ``check`` collectively on every rank; the same decision on every rank."""

    def __init__(
        self,
        cfg: ImbalanceConfig,
        rank: int,
        world_size: int,
        device: torch.device,
        node: str,
        gpu_reading: GpuReading,
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.gpu_reading = gpu_reading
        grouped = dist.is_available() and dist.is_initialized()
        self.enabled = cfg.every_steps > 0 and world_size > 1 and grouped
        self._last_check = 0
        self._streak = (-1, 0)  # (rank, checks in a row it was slowest and over threshold)
        self.hosts = self._gather_hosts(node) if self.enabled else [node]

    def _gather_hosts(self, node: str) -> list[str]:
        """Every rank's node name, as fixed-size byte rows (no pickling)."""
        mine = torch.zeros(HOST_BYTES, dtype=torch.uint8)
        raw = node.encode()[:HOST_BYTES]
        mine[: len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
        rows = [torch.zeros_like(mine, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(rows, mine.to(self.device))
        return [bytes(r.cpu().tolist()).rstrip(b"\0").decode(errors="replace") for r in rows]

    def due(self, step: int, interval_start: int) -> bool:
        """Whether the logged step ``step`` checks its interval (steps after ``interval_start``).

        A function of step numbers only, so every rank agrees. An interval that covers a step up
        to ``warmup_steps`` is never checked: the first steps (allocator, caches, DDP's bucket
        rebuild after step 1) differ between ranks for reasons no straggler has.
        """
        return (
            self.enabled
            and interval_start >= self.cfg.warmup_steps
            and step - self._last_check >= self.cfg.every_steps
        )

    def check(self, step: int, row: dict[str, Any]) -> Imbalance:
        """Gather every rank's ``row`` figures (a collective) and analyse them."""
        self._last_check = step
        clock, power, reasons = self.gpu_reading()
        mine = [_float(row.get(f)) for f in FIELDS[:6]] + [clock, power, reasons]
        local = torch.tensor(mine, dtype=torch.float64, device=self.device)  # (len(FIELDS),)
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(gathered, local)
        table = torch.stack(gathered).cpu().tolist()  # (world, len(FIELDS))
        result = analyse(step, table, self.hosts, self.cfg.threshold)
        self._streak = next_streak(self._streak, result)
        return replace(result, streak=self._streak[1])

    def sustained(self, result: Imbalance) -> bool:
        """Whether ``result`` raises an event: over threshold ``consecutive`` checks in a row."""
        return result.streak >= self.cfg.consecutive


def next_streak(streak: tuple[int, int], result: Imbalance) -> tuple[int, int]:
    """(rank, checks in a row) after ``result``: the count restarts when another rank is slowest."""
    rank, count = streak
    if not result.over:
        return (result.slowest_rank, 0)
    return (result.slowest_rank, count + 1 if rank == result.slowest_rank else 1)


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)
