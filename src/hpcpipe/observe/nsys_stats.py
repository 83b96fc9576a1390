"""What a run's Nsight Systems reports say, read from their ``nsys stats`` CSV exports.

A run profiled with ``observe.profile.tool: nsys`` leaves one report per rank in
``<run_dir>/profile/nsys/<job>.rank<R>.nsys-rep``; after the run, ``nsys stats --report
nvtx_sum,cuda_gpu_kern_sum --format csv --output <job>.rank<R>`` (the launcher and the sbatch
script run it: ``STATS_ARGS``) writes ``<job>.rank<R>_nvtx_sum.csv`` and
``<job>.rank<R>_cuda_gpu_kern_sum.csv`` next to it. Their columns are the reports' own
(``nvtx_sum.py`` and ``cuda_gpu_kern_sum.py`` in the Nsight Systems package): ``Time (%)``,
``Total Time (ns)``, ``Instances``, ``Avg (ns)``, ``Med (ns)``, ``Min (ns)``, ``Max (ns)``,
``StdDev (ns)``, then ``Style`` and ``Range`` (NVTX, named ``<domain>:<range>``) or ``Name``
(kernels).

From the lowest rank's pair, ``read_nsys_stats`` gives what ``hpcpipe profile`` adds to its
verdict: the step time and per-step phase times from hpcpipe's NVTX ranges (``observe/nvtx.py``:
``hpcpipe:step``, ``hpcpipe:data``, ...), the kernel time, the share of it in NCCL kernels, and
the top kernels.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout
from hpcpipe.observe.nvtx import DOMAIN, STEP_RANGE

STATS_REPORTS = ("nvtx_sum", "cuda_gpu_kern_sum")
# `nsys stats` options for one report, before `--output PREFIX REPORT` (one spelling for the
# launcher and the sbatch template).
STATS_ARGS = ("stats", "--report", ",".join(STATS_REPORTS), "--format", "csv", "--force-export=true")
NVTX_CSV, KERNEL_CSV = (f"_{report}.csv" for report in STATS_REPORTS)
PHASE_RANGES = ("data", "forward", "comm", "backward", "optimizer")
# The phase timers split DDP's backward at the gradient hook's mark on the device timeline; the NVTX
# ranges are pushed and popped by the training thread, which cannot see that mark (it comes from
# the autograd thread, and the wait is the GPU's), so its `backward` range holds the gradient sync
# and `comm` only the OOM guard's all-reduce: said beside the shares, which can disagree with the
# verdict table's comm.
HOST_SIDE = "(host-side NVTX ranges; backward includes exposed gradient sync)"
_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def report_dir(run_dir: Path, tool: str) -> Path:
    """Where a run's Nsight reports go: ``<run_dir>/profile/nsys`` or ``.../ncu``."""
    return RunLayout(run_dir).profile / tool


@dataclass(frozen=True)
class SummaryRow:
    name: str
    total_s: float
    instances: int


def read_summary(path: Path, name_column: str) -> list[SummaryRow]:
    """The rows of one ``nsys stats`` CSV export; anything else is a UserError naming the file."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror})") from None
    # nsys may print a title or progress lines before the table: start at its header.
    start = next((i for i, line in enumerate(lines) if line.lstrip('"').startswith("Time (%)")), None)
    if start is None:
        raise UserError(f'{path}: not an nsys stats CSV export (no "Time (%)" header)')
    reader = csv.DictReader(lines[start:])
    columns = reader.fieldnames or []
    total = next((c for c in columns if c.startswith("Total Time (")), None)
    missing = [c for c in ("Instances", name_column) if c not in columns] + ([] if total else ["Total Time"])
    if missing or total is None:
        raise UserError(f"{path}: not an nsys stats CSV export (no {missing[0]!r} column)")
    unit = _UNITS.get(total[len("Total Time (") : -1])
    if unit is None:
        raise UserError(f"{path}: unknown time unit in column {total!r}")
    return [_row(path, start + n + 2, row, total, unit, name_column) for n, row in enumerate(reader)]


def _row(path: Path, line: int, row: dict[str, str], total: str, unit: float, name: str) -> SummaryRow:
    try:
        seconds = float(row[total].replace(",", "")) * unit  # a "column" export groups digits
        return SummaryRow(row[name], seconds, int(row["Instances"].replace(",", "")))
    except (TypeError, ValueError, AttributeError):
        raise UserError(f"{path}: line {line} is not a summary row: {row}") from None


@dataclass(frozen=True)
class NsysEvidence:
    """One rank's Nsight Systems capture, summarised."""

    report: str  # the exports' prefix, <job>.rank<R>
    steps: int = 0  # hpcpipe:step ranges in the capture
    step_time_s: float = 0.0  # their mean
    phase_s: dict[str, float] = field(default_factory=dict)  # per step: data, forward, comm, ...
    regions: dict[str, tuple[float, int]] = field(default_factory=dict)  # other hpcpipe ranges: mean s, count
    kernel_s: float = 0.0  # all GPU kernels over the capture
    nccl_s: float = 0.0  # of which NCCL's
    top_kernels: list[tuple[str, float, int]] = field(default_factory=list)  # (name, seconds, launches)

    @property
    def gpu_busy(self) -> float | None:
        """Kernel time (NCCL's included, as in a torch trace) over the captured steps' time. The
        summary has no timestamps, so kernels that overlap on several streams (NCCL beside
        compute) count twice: an upper bound, capped at 1."""
        steps_s = self.steps * self.step_time_s
        return min(1.0, self.kernel_s / steps_s) if steps_s > 0 and self.kernel_s else None

    def describe(self) -> list[str]:
        """What ``hpcpipe profile`` prints about the capture."""
        lines = []
        step = self.step_time_s
        if self.steps and step > 0:
            shares = ", ".join(f"{p} {self.phase_s.get(p, 0.0) / step:.1%}" for p in PHASE_RANGES)
            lines.append(
                f"nsys {self.report}: {self.steps} captured step(s) of {step * 1000:.1f} ms; "
                f"NVTX phases {HOST_SIDE} {shares}; "
                f"data wait {self.phase_s.get('data', 0.0) * 1000:.1f} ms per step"
            )
        elif self.steps:  # an export whose steps add up to no time: no shares to give
            lines.append(
                f"nsys {self.report}: {self.steps} captured step(s) with a total time of 0 in the export; "
                "no NVTX phase shares"
            )
        if self.kernel_s:
            nccl = self.nccl_s / self.kernel_s
            busy = self.gpu_busy
            lines.append(
                f"GPU kernels {self.kernel_s * 1000:.1f} ms over the capture: NCCL {nccl:.0%}, compute "
                f"{1 - nccl:.0%}" + (f"; kernels fill at most {busy:.0%} of the step time" if busy else "")
            )
            top = ", ".join(f"{_short(n)} {s * 1000:.1f} ms ({k}x)" for n, s, k in self.top_kernels[:5])
            lines.append(f"top kernels: {top}")
        return lines


def read_nsys_stats(run_dir: Path, top: int = 8, since: float = 0.0) -> NsysEvidence | None:
    """The lowest rank's ``nsys stats`` exports in ``run_dir`` summarised, of the newest capture
    taken at or after ``since`` (the run's last start); None when there are none. A requeued
    Slurm job's capture (``<job>.requeue1.rank0``) sits beside the one before it (``<job>.rank0``),
    which described an earlier attempt and sorted first by name."""
    captured = {p: _captured_at(p) for p in _exports(report_dir(run_dir, "nsys"))}
    found = [p for p, at in captured.items() if at >= since]
    if not found:
        return None
    prefix = min(found, key=lambda p: (_rank(p.name), -captured[p], p.name))
    evidence = NsysEvidence(report=prefix.name)
    nvtx, kernels = Path(f"{prefix}{NVTX_CSV}"), Path(f"{prefix}{KERNEL_CSV}")
    if nvtx.is_file():
        evidence = _with_ranges(evidence, read_summary(nvtx, "Range"))
    if kernels.is_file():
        evidence = _with_kernels(evidence, read_summary(kernels, "Name"), top)
    return evidence


def _exports(directory: Path) -> set[Path]:
    suffixes = (NVTX_CSV, KERNEL_CSV)
    if not directory.is_dir():
        return set()
    return {
        directory / p.name[: -len(s)] for p in directory.iterdir() for s in suffixes if p.name.endswith(s)
    }


def _captured_at(prefix: Path) -> float:
    """When the capture was written: its report's mtime, else its CSVs'. The sbatch script and
    the launcher export every report again after each start: the CSVs' own times say nothing."""
    report = Path(f"{prefix}.nsys-rep")
    paths = [report] if report.is_file() else [Path(f"{prefix}{NVTX_CSV}"), Path(f"{prefix}{KERNEL_CSV}")]
    return max((p.stat().st_mtime for p in paths if p.is_file()), default=0.0)


def _rank(name: str) -> int:
    match = re.search(r"\.rank(\d+)$", name)
    return int(match.group(1)) if match else 1 << 30


def _with_ranges(evidence: NsysEvidence, rows: list[SummaryRow]) -> NsysEvidence:
    ours = {row.name.split(":", 1)[1]: row for row in rows if row.name.startswith(f"{DOMAIN}:")}
    step = ours.pop(STEP_RANGE, None)
    if step is None or step.instances == 0:
        return evidence
    phases = {name: ours.pop(name).total_s / step.instances for name in PHASE_RANGES if name in ours}
    regions = {name: (row.total_s / max(row.instances, 1), row.instances) for name, row in ours.items()}
    return replace(
        evidence,
        steps=step.instances,
        step_time_s=step.total_s / step.instances,
        phase_s=phases,
        regions=regions,
    )


def _with_kernels(evidence: NsysEvidence, rows: list[SummaryRow], top: int) -> NsysEvidence:
    total = sum(row.total_s for row in rows)
    nccl = sum(row.total_s for row in rows if row.name.lstrip().lower().startswith("nccl"))
    ranked = sorted(rows, key=lambda row: -row.total_s)[:top]
    top_kernels = [(row.name, row.total_s, row.instances) for row in ranked]
    return replace(evidence, kernel_s=total, nccl_s=nccl, top_kernels=top_kernels)


def _short(kernel: str, width: int = 60) -> str:
    """A kernel's name without its argument list, cut to ``width`` characters."""
    name = kernel.split("(", 1)[0] if not kernel.startswith("void ") else kernel[5:].split("(", 1)[0]
    return name if len(name) <= width else name[: width - 1] + "…"
