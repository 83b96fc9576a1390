"""Search the parallel layouts of a model on N GPUs that fit, ranked by a stated throughput model.

The model of one optimizer step on each GPU, every term a closed form (nothing is fitted):

- compute: ``6 P T / (G peak)`` for ``P`` parameters, ``T`` tokens per step and ``G`` GPUs at the
  GPU's dense bf16 peak (``8 P T`` with full recomputation: one more forward), divided by
  ``1 - bubble``;
- pipeline bubble: ``(p - 1) / (v m + p - 1)`` for ``p`` stages, ``v`` virtual stages per rank and
  ``m`` micro-batches (Narayanan et al. 2021);
- tensor parallelism: per layer and micro-batch, 4 all-reduces (2 forward, 2 backward; 6 with full
  recomputation) of ``s b h`` 16-bit activations, each ``2 (t - 1) / t`` of its bytes over the
  intra-node bandwidth;
- data parallelism: a reduce-scatter of the gradients and an all-gather of the weights (ZeRO-3
  gathers weights twice: forward and backward), each ``(d - 1) / d`` of the stage's 16-bit
  parameters over the inter-node bandwidth;
- pipeline point-to-point: an activation and its gradient per micro-batch and stage boundary over the
  inter-node bandwidth.

Compute runs at the GPU's full dense peak (real runs reach 40-60% of it) and communication is
counted as not overlapped with compute: the model is optimistic about compute and pessimistic
about layouts that communicate much. It ranks layouts; its step time is not a prediction.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

from hpcpipe.config.parallel import micro_batches_needed
from hpcpipe.plan.memory import GPUS, Gpu, Layout, ModelShape, Recompute, fits, memory_per_gpu

RECOMPUTE_ORDER: tuple[Recompute, ...] = ("none", "selective", "full")


@dataclass(frozen=True)
class Bandwidths:
    intra_node_gbs: float = 200.0  # GB/s bus bandwidth of an NVLink all-reduce (nccl-tests busbw)
    inter_node_gbs: float = 25.0  # GB/s per GPU across nodes (one 200 Gb/s NIC per GPU)
    source: str = "default"


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    memory: dict[str, float]
    step_s: float
    parts_s: dict[str, float]

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.parts_s["tokens"] / self.step_s / self.layout.gpus


def step_time(
    shape: ModelShape, layout: Layout, gpu: Gpu, bw: Bandwidths, global_batch: int
) -> dict[str, float]:
    """Seconds of one step by term (see the module doc), their ``total`` and the ``tokens``."""
    tokens = global_batch * shape.seq_len
    params = shape.total_params()
    flops = (8 if layout.recompute == "full" else 6) * params * tokens
    p, v, m, t, d = layout.pp, layout.virtual_stages, layout.micro_batches, layout.tp, layout.dp
    bubble = (p - 1) / (v * m + p - 1)
    compute = flops / (layout.gpus * gpu.peak_tflops * 1e12) / (1 - bubble)
    act_bytes = shape.seq_len * layout.micro_batch * shape.hidden * 2
    layers_per_rank = math.ceil(shape.layers / p)
    tp_collectives = 6 if layout.recompute == "full" else 4
    tensor = 0.0
    if t > 1:
        per = 2 * (t - 1) / t * act_bytes / (bw.intra_node_gbs * 1e9)
        tensor = layers_per_rank * m * tp_collectives * per
    stage_bytes = params / (t * p) * 2
    passes = 3 if layout.zero >= 3 else 2  # reduce-scatter + all-gather(s)
    data = passes * (d - 1) / d * stage_bytes / (bw.inter_node_gbs * 1e9) if d > 1 else 0.0
    pipe = 2 * m * v * act_bytes / t / (bw.inter_node_gbs * 1e9) if p > 1 else 0.0
    total = compute + tensor + data + pipe
    return {
        "compute": compute,
        "bubble_fraction": bubble,
        "tensor_parallel": tensor,
        "data_parallel": data,
        "pipeline_p2p": pipe,
        "total": total,
        "tokens": float(tokens),
    }


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def candidate_layouts(
    shape: ModelShape, gpus: int, gpus_per_node: int, global_batch: int, base: Layout
) -> Iterator[Layout]:
    """Every (tp, pp, dp, v, micro-batch, ZeRO stage, recomputation) that splits the model, the
    GPUs and the batch: tp within a node and dividing the heads, key-value heads, MLP width and
    sequence; pp x v stages of at least one layer each (the busiest holds ceil(L / p) layers); dp
    the rest; the micro-batches per step the schedule needs (the trainer refuses fewer)."""
    for tp in _divisors(gpus_per_node):
        if shape.heads % tp or shape.kv_heads % tp or shape.ffn % tp or shape.seq_len % tp or gpus % tp:
            continue
        for pp in _divisors(gpus // tp):
            if pp > shape.layers:
                break
            dp = gpus // (tp * pp)
            yield from _per_split(shape, tp, pp, dp, global_batch, base)


def _per_split(
    shape: ModelShape, tp: int, pp: int, dp: int, global_batch: int, base: Layout
) -> Iterator[Layout]:
    for micro in (1, 2, 4, 8):
        if global_batch % (micro * dp):
            continue
        m = global_batch // (micro * dp)
        if pp > 1 and m < pp:
            continue  # fewer micro-batches than stages: most of every step is bubble
        virtuals = [1] if pp == 1 else [v for v in (1, 2, 4, 8) if pp * v <= shape.layers]
        for v in virtuals:
            # One chunk per stage is plain 1F1B (p micro-batches in flight), whatever the base ran.
            plain = "1f1b" if base.schedule == "interleaved-1f1b" else base.schedule
            schedule = "interleaved-1f1b" if v > 1 else plain
            if micro_batches_needed(pp, schedule, m) is not None:
                continue  # the trainer refuses it (config/parallel.py check_micro_batches)
            zeros = (0, 1, 2, 3) if dp > 1 else (0,)
            for zero in zeros:
                for recompute in RECOMPUTE_ORDER:
                    yield replace(
                        base,
                        tp=tp,
                        pp=pp,
                        dp=dp,
                        zero=zero,
                        virtual_stages=v,
                        micro_batch=micro,
                        micro_batches=m,
                        schedule=schedule if pp > 1 else "1f1b",
                        recompute=recompute,
                    )


def search(
    shape: ModelShape,
    gpus: int,
    gpu: Gpu,
    bw: Bandwidths,
    global_batch: int,
    gpus_per_node: int = 8,
    base: Layout | None = None,
) -> list[Candidate]:
    """The layouts that fit ``gpu``, fastest first (ties: less memory first)."""
    found = []
    for layout in candidate_layouts(shape, gpus, gpus_per_node, global_batch, base or Layout()):
        memory = memory_per_gpu(shape, layout)
        if not fits(memory["total"], gpu):
            continue
        parts = step_time(shape, layout, gpu, bw, global_batch)
        found.append(Candidate(layout, memory, parts["total"], parts))
    found.sort(key=lambda c: (c.step_s, c.memory["total"]))
    return found


def _searched_fields(layout: Layout) -> tuple[object, ...]:
    """What the search varies: a layout is found only with every one of them equal. One data-
    parallel rank has nothing to shard over: any ZeRO stage is 0 there (the search tries only 0,
    and the default --zero 3 of a dp 1 layout was never found)."""
    zero = layout.zero if layout.dp > 1 else 0
    return (
        layout.tp, layout.pp, layout.dp, layout.virtual_stages, zero, layout.micro_batch, layout.recompute,
    )  # fmt: skip


def rank_of(candidates: list[Candidate], layout: Layout) -> int | None:
    """1-based rank of ``layout`` itself among ``candidates`` (None: it does not fit, or the search
    does not try it). Matching tp x pp x dp alone ranked the split's fastest variant (another ZeRO
    stage, recomputation or micro-batch) as if it were the given layout."""
    wanted = _searched_fields(layout)
    return next((i for i, c in enumerate(candidates, start=1) if _searched_fields(c.layout) == wanted), None)


def rank_of_split(candidates: list[Candidate], layout: Layout) -> int | None:
    """1-based rank of the fastest candidate with ``layout``'s tp, pp and dp (None when none fits)."""
    split = (layout.tp, layout.pp, layout.dp)
    return next(
        (i for i, c in enumerate(candidates, start=1) if (c.layout.tp, c.layout.pp, c.layout.dp) == split),
        None,
    )


__all__ = [
    "GPUS", "Bandwidths", "Candidate", "candidate_layouts", "rank_of", "rank_of_split", "search", "step_time"
]  # fmt: skip
