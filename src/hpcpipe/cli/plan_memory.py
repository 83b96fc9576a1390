"""`hpcpipe plan memory`: per-GPU memory of a model under a layout, and the layouts that fit N GPUs."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from hpcpipe.cli.common import JsonOption, console, load_job, print_whole, write_json
from hpcpipe.errors import UserError
from hpcpipe.plan.layouts import Bandwidths
from hpcpipe.plan.memory import GIB, GPUS, HEADROOM, Layout, ModelShape, fits, memory_per_gpu
from hpcpipe.plan.memory_inputs import (
    ShapeFlags,
    bandwidths,
    check_layout,
    gpu_named,
    micro_batches,
    resolve_shape,
    shape_from_job,
)

PARTS = ("parameters", "gradients", "optimizer", "activations", "logits", "weight_casts", "buffers")


def _opt(help_text: str) -> Any:
    return typer.Option(help=help_text, show_default=False)


def memory(
    source: Annotated[
        str | None,
        typer.Argument(
            help="A preset or config YAML whose model (hpcpipe's GPT: model.*), layout (parallel.tp, "
            "parallel.pp, strategy) and batch (train.*) are planned; flags override each value.",
            show_default=False,
        ),
    ] = None,
    layers: Annotated[int | None, _opt("Transformer layers L.")] = None,
    hidden: Annotated[int | None, _opt("Hidden size h (d_model).")] = None,
    heads: Annotated[int | None, _opt("Attention heads.")] = None,
    kv_heads: Annotated[
        int | None, _opt("Key-value heads (grouped-query attention); default: --heads.")
    ] = None,
    ffn: Annotated[int | None, _opt("MLP hidden width f; default 4 h.")] = None,
    vocab: Annotated[int | None, _opt("Vocabulary size V.")] = None,
    seq: Annotated[int | None, _opt("Sequence length s.")] = None,
    mlp: Annotated[
        str | None,
        _opt("swiglu (3 matrices and RoPE: Llama) or gelu (2, learned positions: GPT-2); default swiglu."),
    ] = None,
    tp: Annotated[int | None, _opt("Tensor-parallel degree t.")] = None,
    pp: Annotated[int | None, _opt("Pipeline stages p.")] = None,
    dp: Annotated[
        int | None, _opt("Data-parallel degree d (default: --gpus, else the job's nodes x nproc, / (t p)).")
    ] = None,
    zero: Annotated[
        int | None, _opt("Data-parallel sharding: 0 replicated (DDP), 1-3 ZeRO stages (3 = FSDP); default 3.")
    ] = None,
    virtual_stages: Annotated[int | None, _opt("Virtual stages per rank v (interleaved 1F1B).")] = None,
    micro_batch: Annotated[int | None, _opt("Sequences per micro-batch b.")] = None,
    global_batch: Annotated[int | None, _opt("Sequences per optimizer step.")] = None,
    precision: Annotated[str | None, _opt("bf16, fp16 or fp32 (default bf16).")] = None,
    recompute: Annotated[str | None, _opt("Activation checkpointing: none, selective or full.")] = None,
    gpu: Annotated[str, typer.Option(help=f"The GPU to fit: {', '.join(GPUS)}.")] = "h100",
    gpus: Annotated[int | None, _opt("Search every layout of this many GPUs that fits, ranked.")] = None,
    gpus_per_node: Annotated[
        int, typer.Option(help="GPUs per node: tensor parallelism stays inside one.")
    ] = 8,
    intra_gbs: Annotated[
        float | None, _opt("Intra-node all-reduce bus bandwidth, GB/s (default 200).")
    ] = None,
    inter_gbs: Annotated[float | None, _opt("Inter-node bandwidth per GPU, GB/s (default 25).")] = None,
    intra_bench: Annotated[
        Path | None, _opt("An `hpcpipe bench collectives --json` result on one node: its all-reduce busbw.")
    ] = None,
    inter_bench: Annotated[Path | None, _opt("The same across nodes.")] = None,
    top: Annotated[int, typer.Option(help="Layouts shown by --gpus.")] = 10,
    json_out: JsonOption = None,
) -> None:
    """Per-GPU memory of a transformer under a parallel layout, part by part, and whether it fits
    each GPU; with --gpus N, every layout of N GPUs that fits, ranked by a throughput model.

    Memory (plan/memory.py): weights, gradients and AdamW state at 2 + 2 + 12 bytes per parameter
    in bf16 (ZeRO's accounting), sharded by tp x pp and by the ZeRO stage over dp; activations per
    layer as hpcpipe's GPT keeps them (fp32 residual stream and norm inputs, 16-bit matmul outputs
    under autocast; with tensor parallelism the all-gathered inputs whole on every rank), times the
    micro-batches a stage holds (first stage, 1F1B: p; interleaved: p (1 + (p-1)/(p v)); GPipe: all;
    the last stage one under 1F1B); the logits, whole on every tp rank; the 16-bit weight casts;
    communication buffers. A layout fits when it needs at most 90% of the GPU.

    Ranking (plan/layouts.py): compute 6 P T / (G peak) over (1 - bubble), bubble (p-1)/(v m + p-1),
    4 TP all-reduces per layer and micro-batch on the intra-node bandwidth, the data-parallel
    reduce-scatter and all-gather(s) on the inter-node bandwidth, none overlapped: compute at full
    peak, communication never hidden. A model to rank layouts by, not a prediction of step time.

    Examples:

      hpcpipe plan memory gpt-1t --gpu a100-80 --zero 0              (Megatron-LM's 1T layout)

      hpcpipe plan memory gpt-1t --gpu a100-80 --zero 0 --gpus 3072  (and the layouts that fit, ranked)

      hpcpipe plan memory llama-405b --gpus 16384 --intra-bench busbw-node.json

      hpcpipe plan memory --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336
      --vocab 128256 --seq 8192 --tp 2 --dp 4 --micro-batch 1 --global-batch 64
    """
    if gpus is not None and gpus < 1:
        raise UserError(f"--gpus must be 1 or more (got {gpus})")
    if gpus is not None and (gpus_per_node < 1 or top < 1):  # refused before any table is printed
        raise UserError("--gpus-per-node and --top must be 1 or more")
    bw = bandwidths(intra_gbs, inter_gbs, intra_bench, inter_bench) if gpus is not None else None
    job = load_job(source, None) if source is not None else None
    given = ShapeFlags(layers, hidden, heads, kv_heads, ffn, vocab, seq, _gated(mlp), None)
    shape = resolve_shape(shape_from_job(job) if job is not None else None, given)
    target = gpu_named(gpu)
    layout = _layout(
        job, tp, pp, dp, zero, virtual_stages, micro_batch, global_batch, precision, recompute, gpus
    )
    check_layout(shape, layout)
    if gpus is not None and layout.gpus != gpus:
        raise UserError(f"--tp x --pp x --dp = {layout.gpus}, not --gpus {gpus}")
    parts = memory_per_gpu(shape, layout)
    result: dict[str, Any] = {
        "shape": asdict(shape),
        "params": shape.total_params(),
        "layout": asdict(layout),
        "bytes_per_gpu": parts,
        "fits": {name: fits(parts["total"], g) for name, g in GPUS.items()},
        "headroom": HEADROOM,
    }
    _print_memory(shape, layout, parts)
    if gpus is not None and bw is not None:
        result["search"] = _search(shape, layout, gpus, gpus_per_node, target, top, bw)
    write_json(result, json_out)


def _gated(mlp: str | None) -> bool | None:
    if mlp is None:
        return None
    if mlp not in ("swiglu", "gelu"):
        raise UserError(f"--mlp {mlp}: expected swiglu or gelu")
    return mlp == "swiglu"


def _layout(
    job: Any,
    tp: int | None,
    pp: int | None,
    dp: int | None,
    zero: int | None,
    virtual: int | None,
    micro: int | None,
    global_batch: int | None,
    precision: str | None,
    recompute: str | None,
    gpus: int | None,
) -> Layout:
    """Flags over the job's values over the defaults; UserError naming a flag below 1."""
    p = job.parallel if job is not None else None
    t = job.train if job is not None else None
    tp_ = _pick("--tp", tp, p.tp if p else None, 1)
    pp_ = _pick("--pp", pp, getattr(p, "pp", None), 1)
    world = gpus if gpus is not None else (p.node_range[1] * p.nproc if p else tp_ * pp_)
    derived = world // (tp_ * pp_) if world % (tp_ * pp_) == 0 else 1
    dp_ = _pick("--dp", dp, None, derived)
    virtual_ = _pick("--virtual-stages", virtual, getattr(p, "virtual_stages", None), 1)
    micro_ = _pick("--micro-batch", micro, t.micro_batch_size if t else None, 1)
    # By default one micro-batch per pipeline stage: the fewest a pipeline schedule runs.
    batch = _pick("--global-batch", global_batch, t.global_batch_size if t else None, micro_ * dp_ * pp_)
    precision = precision or (t.precision if t else "bf16")
    recompute = recompute or (t.activation_checkpointing if t else "none")
    if precision not in ("bf16", "fp16", "fp32"):
        raise UserError(f"--precision {precision}: expected bf16, fp16 or fp32")
    if recompute not in ("none", "selective", "full"):
        raise UserError(f"--recompute {recompute}: expected none, selective or full")
    schedule = "interleaved-1f1b" if virtual_ > 1 else str(getattr(p, "pp_schedule", "1f1b"))
    return Layout(
        tp=tp_,
        pp=pp_,
        dp=dp_,
        zero=_zero(job, zero, tp_, pp_, dp_),
        virtual_stages=virtual_,
        micro_batch=micro_,
        micro_batches=micro_batches(batch, micro_, dp_),
        schedule=schedule,  # type: ignore[arg-type]
        precision=precision,  # type: ignore[arg-type]
        recompute=recompute,  # type: ignore[arg-type]
    )


def _pick(flag: str, given: int | None, from_job: int | None, default: int) -> int:
    value = given if given is not None else from_job if from_job is not None else default
    if value < 1:
        raise UserError(f"{flag} must be 1 or more (got {value})")
    return int(value)


def _zero(job: Any, zero: int | None, tp: int, pp: int, dp: int) -> int:
    """The ZeRO stage the job trains with, its strategy resolved as the trainer resolves it
    (``train/parallel.py resolve_strategy``: ``auto`` is DDP (0), or FSDP2 (3) beside tensor or
    pipeline parallelism; one data-parallel rank never wraps)."""
    if zero is not None:
        return zero
    if job is None:
        return 3
    strategy = job.parallel.strategy
    if strategy == "deepspeed":
        return job.parallel.zero_stage if job.parallel.zero_stage is not None else 3
    from hpcpipe.train.parallel import resolve_strategy  # torch: only for a job's strategy

    return 0 if resolve_strategy(strategy, dp, max(tp, pp)) in ("ddp", "single") else 3


def _print_memory(shape: ModelShape, layout: Layout, parts: dict[str, float]) -> None:
    billions = shape.total_params() / 1e9
    console.print(
        f"[bold]{billions:,.1f}B parameters[/]: {shape.layers} layers, hidden {shape.hidden}, "
        f"{shape.heads} heads ({shape.kv_heads} kv), MLP {shape.ffn}, vocabulary {shape.vocab}, "
        f"sequence {shape.seq_len}"
    )
    console.print(
        f"layout: tp {layout.tp} x pp {layout.pp} x dp {layout.dp} = {layout.gpus} GPUs, "
        f"ZeRO {layout.zero}, v {layout.virtual_stages} ({layout.schedule}), micro-batch "
        f"{layout.micro_batch} x {layout.micro_batches}, {layout.precision}, recompute {layout.recompute}"
    )
    table = Table(title="per GPU (the busiest pipeline stage: the first, or the last with the head)")
    table.add_column("part")
    table.add_column("GiB", justify="right")
    for part in PARTS:
        table.add_row(part, f"{parts[part] / GIB:,.2f}")
    table.add_row("[bold]total[/]", f"[bold]{parts['total'] / GIB:,.2f}[/]")
    print_whole(table)
    verdicts = []
    for g in GPUS.values():
        verdict = "[green]fits[/]" if fits(parts["total"], g) else "[red]does not fit[/]"
        verdicts.append(f"{g.name} ({g.memory_bytes / GIB:.0f} GiB): {verdict}")
    console.print(f"at most {HEADROOM:.0%} of a GPU: " + "; ".join(verdicts))


def _search(
    shape: ModelShape,
    given: Layout,
    gpus: int,
    gpus_per_node: int,
    gpu: Any,
    top: int,
    bw: Bandwidths,
) -> dict[str, Any]:
    from hpcpipe.plan.layouts import rank_of, rank_of_split, search

    global_batch = given.micro_batch * given.micro_batches * given.dp
    found = search(shape, gpus, gpu, bw, global_batch, gpus_per_node, given)
    rank, split_rank = rank_of(found, given), rank_of_split(found, given)
    _print_search(found[:top], gpu, bw, gpus, global_batch, len(found))
    for what, at in (
        ("the given layout", rank),
        ("the fastest layout of its tp x pp x dp split", split_rank),
    ):
        if at is not None:
            slower = found[at - 1].step_s / found[0].step_s - 1
            console.print(f"{what} ranks #{at} of {len(found)}: {slower:.1%} above the best step time")
    if rank is None:
        console.print(
            "the given layout does not fit, or is not among the searched ones (micro-batch 1, 2, 4, 8)"
        )
    return {
        "gpu": gpu.name,
        "gpus": gpus,
        "global_batch": global_batch,
        "bandwidths_gbs": asdict(bw),
        "fitting_layouts": len(found),
        "given_layout_rank": rank,
        "best_step_s": found[0].step_s if found else None,
        "given_layout_step_s": found[rank - 1].step_s if rank else None,
        "given_split_best_rank": split_rank,
        "top": [
            {"layout": asdict(c.layout), "bytes_per_gpu": c.memory["total"], "step": c.parts_s}
            for c in found[:top]
        ],
    }


def _print_search(found: list[Any], gpu: Any, bw: Any, gpus: int, batch: int, total: int) -> None:
    if not found:
        console.print(f"[red]no layout of {gpus} GPUs fits[/] the {gpu.name} (global batch {batch})")
        return
    table = Table(
        title=f"{total} layouts of {gpus} x {gpu.name} fit; fastest first "
        f"(intra {bw.intra_node_gbs:g} GB/s, inter {bw.inter_node_gbs:g} GB/s: {bw.source})"
    )
    for name in (
        "#",
        "tp",
        "pp",
        "dp",
        "v",
        "ZeRO",
        "micro",
        "recompute",
        "GiB/GPU",
        "bubble",
        "step s",
        "tok/s/GPU",
    ):
        table.add_column(name, justify="right")
    for index, c in enumerate(found, start=1):
        lay = c.layout
        table.add_row(
            str(index),
            str(lay.tp),
            str(lay.pp),
            str(lay.dp),
            str(lay.virtual_stages),
            str(lay.zero),
            f"{lay.micro_batch}x{lay.micro_batches}",
            lay.recompute,
            f"{c.memory['total'] / GIB:.1f}",
            f"{c.parts_s['bubble_fraction']:.1%}",
            f"{c.step_s:.2f}",
            f"{c.tokens_per_s_per_gpu:,.0f}",
        )
    print_whole(table)
