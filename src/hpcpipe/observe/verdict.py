"""What limits a run: input-, communication-, host/launch- or compute-bound, from its run directory.

The evidence is the phase timers every training run logs (``metrics.jsonl``: ``data_time_s``,
``forward_time_s``, ``backward_time_s``, ``optimizer_time_s``, ``comm_time_s`` and the step time),
MFU where FLOPs are known, GPU utilisation from NVML (``gpu_util_ratio``), and, when a profiler
trace exists (``observe.profile``), the GPU's kernel-busy fraction of the traced steps. With
``observe.profile.tool: nsys`` the ``nsys stats`` exports add the NVTX step and phase times, the
share of kernel time in NCCL and the top kernels (``observe/nsys_stats.py``), and, without a
trace or NVML, the kernels' share of the captured steps' time as GPU busy.

Each limiter has a share of step time and a documented threshold (``Thresholds``; the defaults
are the usual targets: DataLoader idle < 5%, communication < 20%, GPU busy > 80%):

- input-bound: the data-wait share exceeds ``input_share``;
- communication-bound: the exposed-communication share exceeds ``comm_share``;
- host/launch-bound: step time in none of the phases (Python overhead, kernel launches,
  logging) exceeds ``host_share``, or, on a GPU, it is busy less than ``gpu_busy`` of the time;
- compute-bound: none of the above.

When several exceed their threshold, the one furthest over it (share / threshold) is the verdict.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hpcpipe.layout import RunLayout
from hpcpipe.observe.metrics import read_events, read_metrics
from hpcpipe.observe.nsys_stats import NsysEvidence, read_nsys_stats
from hpcpipe.observe.regions import ANNOTATION, LONG_PHASES

PHASE_KEYS = ("data", "forward", "backward", "optimizer", "comm")


@dataclass(frozen=True)
class Thresholds:
    input_share: float = 0.05
    comm_share: float = 0.20
    host_share: float = 0.15
    gpu_busy: float = 0.80


@dataclass(frozen=True)
class Evidence:
    rows: int  # training rows averaged
    step_time_s: float
    shares: dict[str, float]  # data, forward, backward, optimizer, comm, other: fractions of step time
    mfu: float | None = None
    gpu_busy: float | None = None
    gpu_busy_source: str | None = None  # "trace", "nvml" or "nsys"
    # (operator, self seconds: less its child operators) from the trace, the most first
    top_ops: list[tuple[str, float]] = field(default_factory=list)
    straggler: str | None = None  # the last imbalance event, described
    nsys: NsysEvidence | None = None  # the lowest rank's Nsight Systems capture (nsys stats CSVs)


@dataclass(frozen=True)
class Verdict:
    kind: str  # input-bound | communication-bound | host/launch-bound | compute-bound
    reason: str
    scores: dict[str, float]  # share / threshold per limiter: above 1 means over the threshold
    evidence: Evidence
    knobs: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.kind,
            "reason": self.reason,
            "scores": self.scores,
            "evidence": {
                **self.evidence.__dict__,
                "top_ops": [list(op) for op in self.evidence.top_ops],
                "nsys": asdict(self.evidence.nsys) if self.evidence.nsys is not None else None,
            },
            "knobs": self.knobs,
        }


KNOBS = {
    "input-bound": [
        "data.num_workers up (image recipes' DataLoader processes), data.persistent_workers: true",
        "data.pin_memory: true and data.prefetch_factor 4+ (batches ready before they are needed)",
        "data.cache_dir: stage the dataset to node-local disk (`hpcpipe data stage`)",
        "a larger train.micro_batch_size amortises per-batch loader overhead",
    ],
    "communication-bound": [
        "parallel.bucket_cap_mb: larger buckets (fewer all-reduces) or smaller (earlier overlap)",
        "a larger train.micro_batch_size or gradient accumulation: more compute per all-reduce",
        "train.precision: bf16 halves the bytes on the wire",
        "fewer, faster links: check `hpcpipe bench collectives` against the fabric's rating",
    ],
    "host/launch-bound": [
        "train.compile: true fuses kernels: fewer launches, less Python per step",
        "a larger train.micro_batch_size: more work per launch",
        "observe.log_every up: logging reads the loss back and synchronises",
        "parallel.threads_per_rank: leave cores for the loader and the Python thread",
    ],
    "compute-bound": [
        "train.precision: bf16 (tensor cores) if still fp32",
        "train.compile: true for fused kernels",
        "model shape: dimensions multiples of 64/128 for the matmul units (see `hpcpipe roofline`)",
    ],
}


def last_start(run_dir: Path) -> float:
    """When the run's last start that trained (a resume, a restart) brought its process group up;
    0 for a run that recorded none. Rows, traces and events before it describe an earlier attempt:
    a resumed run was judged by the slow data of the attempt before, and by its trace. A start
    that trained nothing (a finished run started again) is passed over."""
    starts = sorted(
        float(e["time"]) for e in read_events(run_dir) if e.get("event") == "group_start" and "time" in e
    )
    rows = [float(r["time"]) for r in training_rows(run_dir) if "time" in r]
    trained = [start for start in starts if any(t >= start for t in rows)]
    return trained[-1] if trained else 0.0


def training_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in read_metrics(run_dir) if "loss" in r and r.get("step_time_s")]


def evidence_from_rows(rows: list[dict[str, Any]]) -> Evidence:
    """Phase shares over the logged rows, the first (warm-up) row dropped when there are more."""
    if len(rows) > 1:
        rows = rows[1:]
    step = sum(float(r["step_time_s"]) for r in rows) / len(rows)
    shares = {}
    for phase in PHASE_KEYS:
        values = [float(r.get(f"{phase}_time_s") or 0.0) for r in rows]
        shares[phase] = sum(values) / len(values) / step if step > 0 else 0.0
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    mfus = [float(r["mfu"]) for r in rows if r.get("mfu") is not None]
    utils = [float(r["gpu_util_ratio"]) for r in rows if r.get("gpu_util_ratio") is not None]
    return Evidence(
        rows=len(rows),
        step_time_s=step,
        shares=shares,
        mfu=sum(mfus) / len(mfus) if mfus else None,
        gpu_busy=sum(utils) / len(utils) if utils else None,
        gpu_busy_source="nvml" if utils else None,
    )


def read_trace(path: Path, top: int = 8) -> tuple[float | None, list[tuple[str, float]]]:
    """(GPU kernel-busy fraction of the traced steps or None without GPU kernels, the top CPU
    operators by self time)."""
    trace = json.loads(path.read_text())
    # Chrome's trace format: an object with traceEvents, or the bare array of events.
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise ValueError("no list of trace events")
    events = [e for e in events if isinstance(e, dict) and _number(e.get("ts")) and _number(e.get("dur", 0))]
    # An evaluation or checkpoint save inside the window (marked by the trainer): not a step's work.
    long_phases = {ANNOTATION.format(phase=phase) for phase in LONG_PHASES}
    left_out = [
        (float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events if e.get("name") in long_phases
    ]

    def in_a_step(e: dict[str, Any]) -> bool:
        return not any(a <= float(e["ts"]) < b for a, b in left_out)

    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and "dur" in e]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e and in_a_step(e)]
    busy = None
    if steps and kernels:
        start = min(float(e["ts"]) for e in steps)
        end = max(float(e["ts"]) + float(e["dur"]) for e in steps)
        skipped = sum(min(b, end) - max(a, start) for a, b in left_out if min(b, end) > max(a, start))
        busy = min(1.0, _union_us(kernels, start, end) / max(end - start - skipped, 1e-9))
    ops: dict[str, float] = defaultdict(float)
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op" and "dur" in e and in_a_step(e)]
    for name, seconds in _self_times(cpu_ops):
        ops[name] += seconds
    return busy, sorted(ops.items(), key=lambda kv: -kv[1])[:top]


def _self_times(cpu_ops: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """(name, seconds) of each operator less its child operators on the same thread: inclusive
    times counted a nested call once per level (aten::layer_norm, native_layer_norm, ... each
    with the whole time)."""
    self_us = [float(e["dur"]) for e in cpu_ops]
    by_thread: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    for i, e in enumerate(cpu_ops):
        by_thread[(e.get("pid"), e.get("tid"))].append(i)
    for indices in by_thread.values():
        # Parents before their children: by start, the longer first when two start together.
        indices.sort(key=lambda i: (float(cpu_ops[i]["ts"]), -float(cpu_ops[i]["dur"])))
        open_ops: list[tuple[float, int]] = []  # (end, index) of the operators enclosing this one
        for i in indices:
            start = float(cpu_ops[i]["ts"])
            while open_ops and open_ops[-1][0] <= start:
                open_ops.pop()
            if open_ops:
                self_us[open_ops[-1][1]] -= float(cpu_ops[i]["dur"])
            open_ops.append((start + float(cpu_ops[i]["dur"]), i))
    return [(str(e["name"]), max(0.0, us) / 1e6) for e, us in zip(cpu_ops, self_us, strict=True)]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _union_us(kernels: list[dict[str, Any]], start: float, end: float) -> float:
    """Microseconds in [start, end] covered by at least one kernel (streams overlap)."""
    spans = sorted((max(float(k["ts"]), start), min(float(k["ts"]) + float(k["dur"]), end)) for k in kernels)
    total, cur_start, cur_end = 0.0, None, None
    for a, b in spans:
        if b <= a:
            continue
        if cur_end is None or a > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = a, b
        else:
            cur_end = max(cur_end, b)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def classify(evidence: Evidence, limits: Thresholds) -> Verdict:
    shares = evidence.shares
    scores = {
        "input-bound": shares["data"] / limits.input_share,
        "communication-bound": shares["comm"] / limits.comm_share,
        "host/launch-bound": shares["other"] / limits.host_share,
    }
    if evidence.gpu_busy is not None:
        idle = (1.0 - evidence.gpu_busy) / max(1.0 - limits.gpu_busy, 1e-9)
        scores["host/launch-bound"] = max(scores["host/launch-bound"], idle)
    worst = max(scores, key=scores.__getitem__)
    kind = worst if scores[worst] > 1.0 else "compute-bound"
    knobs = KNOBS[kind]
    if evidence.straggler:  # a slow rank makes every other rank look communication-bound
        knobs = ["first fix the straggler (`imbalance` events in events.jsonl name its phase)", *knobs]
    return Verdict(kind, _reason(kind, evidence, limits), scores, evidence, knobs)


def _reason(kind: str, ev: Evidence, limits: Thresholds) -> str:
    s = ev.shares
    if kind == "input-bound":
        return f"the loop waits for data {s['data']:.0%} of each step (target < {limits.input_share:.0%})"
    if kind == "communication-bound":
        return f"exposed communication is {s['comm']:.0%} of each step (target < {limits.comm_share:.0%})"
    if kind == "host/launch-bound":
        busy = f"; GPU busy {ev.gpu_busy:.0%} ({ev.gpu_busy_source})" if ev.gpu_busy is not None else ""
        return f"{s['other']:.0%} of each step is in no phase (target < {limits.host_share:.0%}){busy}"
    compute = s["forward"] + s["backward"] + s["optimizer"]
    mfu = f", MFU {ev.mfu:.1%}" if ev.mfu is not None else ""
    return f"forward + backward + optimizer are {compute:.0%} of each step{mfu}; no other limiter over target"


def profile_run(run_dir: Path, limits: Thresholds) -> tuple[Verdict, Path | None]:
    """The verdict for ``run_dir`` and the trace it used (None: phase timers only)."""
    from hpcpipe.errors import UserError

    started = last_start(run_dir)
    rows = [r for r in training_rows(run_dir) if float(r.get("time", started)) >= started]
    if not rows:
        raise UserError(f"{run_dir}: no training rows in metrics.jsonl (is it a run directory?)")
    evidence = evidence_from_rows(rows)
    traces = sorted(
        t for t in RunLayout(run_dir).profile.glob("rank*.trace.json") if t.stat().st_mtime >= started
    )
    trace = traces[0] if traces else None
    if trace is not None:
        try:
            busy, ops = read_trace(trace)
        except (OSError, ValueError) as exc:
            raise UserError(f"{trace}: not a readable profiler trace ({exc})") from None
        if busy is not None:
            evidence = replace(evidence, gpu_busy=busy, gpu_busy_source="trace")
        evidence = replace(evidence, top_ops=ops)
    evidence = _with_nsys(evidence, read_nsys_stats(run_dir, since=started))
    straggler = [
        e
        for e in read_events(run_dir)
        if e.get("event") == "imbalance" and float(e.get("time", started)) >= started
    ]
    if straggler:
        evidence = replace(evidence, straggler=_straggler(straggler[-1], len(straggler)))
    return classify(evidence, limits), trace


def _with_nsys(evidence: Evidence, nsys: NsysEvidence | None) -> Evidence:
    """The capture's summary; its kernels' share of step time as GPU busy when neither a torch
    trace nor NVML said how busy the GPU was."""
    if nsys is None:
        return evidence
    evidence = replace(evidence, nsys=nsys)
    if evidence.gpu_busy is None and nsys.gpu_busy is not None:
        evidence = replace(evidence, gpu_busy=nsys.gpu_busy, gpu_busy_source="nsys")
    return evidence


def _straggler(event: dict[str, Any], count: int) -> str:
    return (
        f"rank {event.get('slowest_rank')} on {event.get('host')} is a straggler "
        f"({event.get('phase')} phase, imbalance {float(event.get('ratio', 0)):.0%}, "
        f"{count} imbalance event(s)); the other ranks' exposed communication is mostly waiting for it"
    )
