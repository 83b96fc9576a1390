"""Roofline placement of a GPT recipe's forward-pass operations at its configured sizes.

The roofline model (Williams, Waterman and Patterson, CACM 2009): an operation doing F FLOPs on
Q bytes of memory traffic has arithmetic intensity I = F / Q and cannot run faster than
min(P, I * W) for peak compute P and memory bandwidth W. Operations with I below the ridge point
P / W are memory-bound (faster memory helps, more FLOP/s does not), the rest compute-bound.

Each operation is counted for one micro-batch (B = train.micro_batch_size, T = model.seq_len,
M = B * T rows, C = d_model, F = MLP width, V = vocabulary, s = bytes per element of
train.precision), with the minimum traffic a fused kernel needs: read the operands once, write
the result once.

- matmul (m x k) @ (k x n): 2 m n k FLOPs; (m k + k n + m n) s bytes.
- attention through SDPA (flash / memory-efficient kernels never write the T x T scores):
  q k^T and p v are 2 * 2 B T^2 C FLOPs, halved for the causal mask the kernels skip;
  bytes read q, k, v and write the output, 4 M C s.
- element-wise operations (norms, activations, residual adds, the loss): the FLOPs per element
  in ``ELEMENTWISE_FLOPS``; bytes read the inputs and write the output once.

The backward pass runs the same shapes (about twice the FLOPs and bytes), so the placement of
each operation, and whether it is memory- or compute-bound, carries over to training.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from hpcpipe.config import JobConfig, ModelConfig
from hpcpipe.errors import UserError
from hpcpipe.recipes.registry import names_where, recipe_class

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2}
# FLOPs per output element of the element-wise operations, counting each add, multiply,
# compare and transcendental as one FLOP (the convention of FLOP counters such as fvcore).
ELEMENTWISE_FLOPS = {
    "layernorm": 7,  # mean, subtract, square, variance sum, multiply by rsqrt, scale, shift
    "rmsnorm": 4,  # square, sum, multiply by rsqrt, scale
    "gelu": 8,  # tanh approximation: x^3, two multiplies, add, tanh, add, two multiplies
    "swiglu": 5,  # silu(gate) = gate * sigmoid(gate) (exp, add, divide, multiply), times up
    "rope": 3,  # x * cos + rotate_half(x) * sin
    "residual": 1,
    "cross_entropy": 4,  # max, subtract, exp, sum over the vocabulary
}


@dataclass(frozen=True)
class Op:
    """One operation of the forward pass, ``count`` times per micro-batch (once per block, ...)."""

    name: str
    kind: str  # matmul | attention | elementwise
    flops: float
    bytes: float
    count: int = 1

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


@dataclass(frozen=True)
class Ceilings:
    """The two roofs, in FLOP/s and bytes/s, and where they came from."""

    peak_flops: float
    bandwidth: float
    source: str

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the memory roof meets the compute roof."""
        return self.peak_flops / self.bandwidth


def matmul(name: str, m: int, k: int, n: int, s: int, count: int = 1) -> Op:
    return Op(name, "matmul", 2.0 * m * n * k, float((m * k + k * n + m * n) * s), count)


def elementwise(
    name: str, kind: str, elements: int, reads: int, s: int, count: int = 1, extra: int = 0
) -> Op:
    """``reads`` input tensors of ``elements`` each, one output, ``extra`` parameter bytes."""
    return Op(
        name,
        "elementwise",
        float(ELEMENTWISE_FLOPS[kind] * elements),
        float((reads + 1) * elements * s + extra),
        count,
    )


def model_ops(model: ModelConfig, micro_batch: int, vocab_size: int, precision: str) -> list[Op]:
    """The forward-pass operations of one micro-batch of the GPT model (``hpcpipe.models.gpt``)."""
    from hpcpipe.models.gpt import mlp_hidden

    s = BYTES_PER_ELEMENT[precision]
    b, t, c, layers = micro_batch, model.seq_len, model.d_model, model.n_layers
    m, f, v = b * t, mlp_hidden(model), vocab_size
    norm = "layernorm" if model.variant == "gpt2" else "rmsnorm"
    norm_params = (2 if norm == "layernorm" else 1) * c * s
    ops = [
        elementwise(f"{norm} (ln_1, ln_2)", norm, m * c, 1, s, 2 * layers, norm_params),
        matmul("attn.qkv", m, c, c + 2 * model.kv_heads * (c // model.n_heads), s, layers),
        Op("attention (SDPA, causal)", "attention", 2.0 * b * t * t * c, float(4 * m * c * s), layers),
        matmul("attn.proj", m, c, c, s, layers),
        elementwise("residual add", "residual", m * c, 2, s, 2 * layers),
    ]
    if model.variant == "gpt2":
        ops += [
            matmul("mlp.fc", m, c, f, s, layers),
            elementwise("gelu", "gelu", m * f, 1, s, layers),
            matmul("mlp.proj", m, f, c, s, layers),
        ]
    else:
        ops += [
            elementwise("rope (q, k)", "rope", m * c, 1, s, 2 * layers),
            matmul("mlp.gate, mlp.up", m, c, f, s, 2 * layers),
            elementwise("silu(gate) * up", "swiglu", m * f, 2, s, layers),
            matmul("mlp.down", m, f, c, s, layers),
        ]
    ops += [
        elementwise(f"{norm} (ln_f)", norm, m * c, 1, s, 1, norm_params),
        matmul("lm_head", m, c, v, s),
        elementwise("cross-entropy", "cross_entropy", m * v, 1, s),
    ]
    return ops


def classify(ops: list[Op], ceilings: Ceilings) -> list[dict[str, Any]]:
    """Each op's intensity, bound, attainable FLOP/s and its share of the roofline time."""
    times = [op.count * max(op.flops / ceilings.peak_flops, op.bytes / ceilings.bandwidth) for op in ops]
    total = sum(times)
    rows = []
    for op, seconds in zip(ops, times, strict=True):
        attainable = min(ceilings.peak_flops, op.intensity * ceilings.bandwidth)
        rows.append(
            {
                **asdict(op),
                "intensity": op.intensity,
                "bound": "compute" if op.intensity >= ceilings.ridge else "memory",
                "attainable_tflops": attainable / 1e12,
                "time_s": seconds,
                "time_share": seconds / total,
            }
        )
    return rows


def vocab_size_of(job: JobConfig) -> int:
    """The model's vocabulary: model.vocab_size, else the tokenizer's configured size."""
    if job.model.vocab_size is not None:
        return job.model.vocab_size
    if job.data.tokenizer == "bytes":
        from hpcpipe.data.tokens.tokenizer import BYTE_VOCAB_SIZE

        return BYTE_VOCAB_SIZE
    return job.data.vocab_size


def roofline(job: JobConfig, ceilings: Ceilings) -> dict[str, Any]:
    """The roofline analysis of ``job``: ceilings, ridge point and every classified op."""
    if not recipe_class(job.run.recipe).own_transformer:
        known = ", ".join(names_where(lambda cls: cls.own_transformer))
        raise UserError(f"roofline: recipe {job.run.recipe!r} has no operation model (supported: {known})")
    ops = model_ops(job.model, job.train.micro_batch_size, vocab_size_of(job), job.train.precision)
    return {
        "name": job.run.name,
        "precision": job.train.precision,
        "micro_batch_size": job.train.micro_batch_size,
        "seq_len": job.model.seq_len,
        "peak_tflops": ceilings.peak_flops / 1e12,
        "bandwidth_gbps": ceilings.bandwidth / 1e9,
        "ridge_flop_per_byte": ceilings.ridge,
        "ceilings_source": ceilings.source,
        "ops": classify(ops, ceilings),
    }


def ceilings_from_compute(data: dict[str, Any], precision: str, source: str) -> Ceilings:
    """Ceilings from a ``bench compute --json`` result (one device, or the per-rank list of accept)."""
    key = f"matmul_{precision}"
    if not isinstance(data, dict):  # a list or a string: an AttributeError traceback
        raise UserError(f"{source}: not the output of `hpcpipe bench compute --json` (a JSON object)")
    devices = data.get("ranks") or [data]
    try:
        flops = min(float(d["figures"][key]["value"]) * 1e12 for d in devices)
        bandwidth = min(float(d["figures"]["memory_copy"]["value"]) * 1e9 for d in devices)
    except (KeyError, TypeError, ValueError):
        raise UserError(
            f"{source}: needs figures.{key}.value and figures.memory_copy.value "
            f"(the output of `hpcpipe bench compute --json`)"
        ) from None
    if not (0 < flops < math.inf and 0 < bandwidth < math.inf):
        raise UserError(f"{source}: ceilings must be positive and finite")
    return Ceilings(flops, bandwidth, source)
