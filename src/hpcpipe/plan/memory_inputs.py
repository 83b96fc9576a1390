"""What ``hpcpipe plan memory`` plans for: a model shape and a layout, from a job's config (a preset or
YAML) and from the command line, the command line winning; and the bandwidths of its ranking."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from hpcpipe.config import JobConfig
from hpcpipe.config.parallel import micro_batches_needed
from hpcpipe.errors import UserError
from hpcpipe.plan.layouts import Bandwidths
from hpcpipe.plan.memory import GPUS, Gpu, Layout, ModelShape


@dataclass
class ShapeFlags:
    """Command-line values of the shape; None: from the job, else required."""

    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    ffn: int | None = None
    vocab: int | None = None
    seq_len: int | None = None
    gated_mlp: bool | None = None
    tied_embeddings: bool | None = None
    rotary: bool | None = None


FLAG_NAMES = {
    "layers": "--layers",
    "hidden": "--hidden",
    "heads": "--heads",
    "kv_heads": "--kv-heads",
    "ffn": "--ffn",
    "vocab": "--vocab",
    "seq_len": "--seq",
    "micro_batch": "--micro-batch",
    "global_batch": "--global-batch",
    "tp": "--tp",
    "pp": "--pp",
    "dp": "--dp",
    "virtual_stages": "--virtual-stages",
    "gpus": "--gpus",
    "gpus_per_node": "--gpus-per-node",
}


def _tokenizer_vocab(job: JobConfig) -> int:
    """The tokenizer's vocabulary: the BPE's configured size, or the byte tokenizer's."""
    if job.data.tokenizer == "bytes":
        from hpcpipe.data.tokens.tokenizer import BYTE_VOCAB_SIZE

        return BYTE_VOCAB_SIZE
    return job.data.vocab_size


def shape_from_job(job: JobConfig) -> ShapeFlags:
    """The shape of hpcpipe's own GPT in ``job`` (recipes with ``own_transformer``); the vocabulary is
    model.vocab_size, else the BPE tokenizer's size (data.vocab_size), else unknown here."""
    from hpcpipe.models.gpt import mlp_hidden
    from hpcpipe.recipes.registry import recipe_class

    if not recipe_class(job.run.recipe).own_transformer:  # its model. keys are not a transformer's
        raise UserError(
            f"run.recipe {job.run.recipe!r} trains no hpcpipe transformer: give the model's shape "
            "(--layers, --hidden, --heads, --vocab, --seq) instead of the job"
        )
    m = job.model
    return ShapeFlags(
        layers=m.n_layers,
        hidden=m.d_model,
        heads=m.n_heads,
        kv_heads=m.kv_heads,
        ffn=mlp_hidden(m),
        vocab=m.vocab_size or _tokenizer_vocab(job),
        seq_len=m.seq_len,
        gated_mlp=m.variant == "llama",
        tied_embeddings=True,  # the GPT ties its LM head to the token embedding
        rotary=m.variant == "llama",
    )


def resolve_shape(from_job: ShapeFlags | None, given: ShapeFlags) -> ModelShape:
    """The command line over the job; UserError naming the flag that is missing or not > 0."""
    values: dict[str, Any] = {}
    for f in fields(ShapeFlags):
        value = getattr(given, f.name)
        if value is None and from_job is not None:
            value = getattr(from_job, f.name)
        values[f.name] = value
    if values["kv_heads"] is None:
        values["kv_heads"] = values["heads"]
    values["gated_mlp"] = True if values["gated_mlp"] is None else values["gated_mlp"]
    if values["rotary"] is None:  # Llama-style (SwiGLU and RoPE) or GPT-2-style (GELU, learned)
        values["rotary"] = values["gated_mlp"]
    values["tied_embeddings"] = bool(values["tied_embeddings"])
    for name in ("layers", "hidden", "heads", "kv_heads", "vocab", "seq_len"):
        _positive(name, values[name], needed=True)
    if values["ffn"] is None:
        values["ffn"] = 4 * values["hidden"]
    _positive("ffn", values["ffn"], needed=True)
    shape = ModelShape(**values)
    if shape.hidden % shape.heads or shape.heads % shape.kv_heads:
        raise UserError(
            f"--hidden ({shape.hidden}) must be a multiple of --heads ({shape.heads}), and --heads of "
            f"--kv-heads ({shape.kv_heads})"
        )
    return shape


def _positive(name: str, value: int | None, needed: bool = False) -> None:
    flag = FLAG_NAMES.get(name, name)
    if value is None:
        if needed:
            raise UserError(f"{flag} is required (or give a preset or config that has the model's shape)")
        return
    if value < 1:
        raise UserError(f"{flag} must be 1 or more (got {value})")


def check_layout(shape: ModelShape, layout: Layout) -> None:
    """UserError naming the flag when the layout cannot split the model."""
    for name in ("tp", "pp", "dp", "virtual_stages", "micro_batch", "micro_batches"):
        _positive(name, getattr(layout, name))
    divided = (("--heads", shape.heads), ("--kv-heads", shape.kv_heads), ("--ffn", shape.ffn))
    for what, value in (*divided, ("--seq", shape.seq_len)):  # the sequence: sequence parallelism
        if value % layout.tp:
            raise UserError(f"--tp {layout.tp} must divide {what} ({value})")
    if layout.pp * layout.virtual_stages > shape.layers:
        raise UserError(
            f"--pp {layout.pp} x --virtual-stages {layout.virtual_stages} is more stages than --layers "
            f"({shape.layers})"
        )
    need = micro_batches_needed(layout.pp, layout.schedule, layout.micro_batches)
    if need is not None:  # the trainer's own rule (config/parallel.py check_micro_batches)
        raise UserError(
            f"--pp {layout.pp} ({layout.schedule}) needs {need} {layout.pp} micro-batches per step; "
            f"--global-batch / (--micro-batch x --dp) gives {layout.micro_batches}"
        )
    if layout.zero not in (0, 1, 2, 3):
        raise UserError(f"--zero must be 0, 1, 2 or 3 (got {layout.zero})")


def micro_batches(global_batch: int, micro_batch: int, dp: int) -> int:
    if global_batch % (micro_batch * dp):
        raise UserError(
            f"--global-batch ({global_batch}) must be a multiple of --micro-batch ({micro_batch}) "
            f"x --dp ({dp})"
        )
    return global_batch // (micro_batch * dp)


def gpu_named(name: str) -> Gpu:
    gpu = GPUS.get(name.lower())
    if gpu is None:
        raise UserError(f"--gpu {name}: unknown GPU; one of {', '.join(GPUS)}")
    return gpu


def bandwidths(
    intra_gbs: float | None, inter_gbs: float | None, intra_bench: Path | None, inter_bench: Path | None
) -> Bandwidths:
    """Given GB/s, else the all-reduce bus bandwidth of an `hpcpipe bench collectives --json` file,
    else the defaults."""
    bw = Bandwidths()
    sources = []
    intra = intra_gbs if intra_gbs is not None else _bench_busbw(intra_bench, "--intra-bench")
    inter = inter_gbs if inter_gbs is not None else _bench_busbw(inter_bench, "--inter-bench")
    for name, value, given, bench in (
        ("intra", intra, intra_gbs, intra_bench),
        ("inter", inter, inter_gbs, inter_bench),
    ):
        if value is None or value > 0:
            continue
        if given is None:  # measured: a one-rank file (it named a flag the user did not pass)
            raise UserError(
                f"--{name}-bench {bench}: its all_reduce bus bandwidth is {value:g} GB/s (one rank "
                "moves nothing): measure on 2 or more ranks"
            )
        raise UserError(f"--{name}-gbs must be a number > 0 (got {value:g})")
    if intra is not None:
        bw = replace(bw, intra_node_gbs=intra)
        sources.append("intra-node " + ("given" if intra_gbs is not None else f"measured ({intra_bench})"))
    if inter is not None:
        bw = replace(bw, inter_node_gbs=inter)
        sources.append("inter-node " + ("given" if inter_gbs is not None else f"measured ({inter_bench})"))
    return replace(bw, source=", ".join(sources) or "default")


def _bench_busbw(path: Path | None, flag: str) -> float | None:
    """The largest all-reduce's bus bandwidth (GB/s) in a bench collectives result."""
    if path is None:
        return None
    try:
        body = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{flag} {path}: not a readable JSON file ({exc})") from None
    results = body.get("results", []) if isinstance(body, dict) else []
    results = results if isinstance(results, list) else []
    rows = [
        r
        for r in results
        if isinstance(r, dict) and r.get("collective") == "all_reduce" and _number(r.get("busbw_gbps"))
    ]
    if not rows:
        raise UserError(
            f"{flag} {path}: no all_reduce results with busbw_gbps "
            "(run hpcpipe bench collectives -c all_reduce --json FILE)"
        )
    largest = max(rows, key=lambda r: r.get("size_bytes", 0) if _number(r.get("size_bytes")) else 0)
    return float(largest["busbw_gbps"])


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
