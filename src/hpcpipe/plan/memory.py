"""Per-GPU memory of a transformer under a parallel layout: ``hpcpipe plan memory``.

Every figure is a closed form of the model shape and the layout; the accounting, and where it
comes from:

- **Parameters** of a decoder-only transformer: per layer, attention ``2 h^2 + 2 h k d`` (q and the
  output projection, and k, v over ``k`` key-value heads of width ``d = h / heads``), the MLP
  ``2 h f`` (GELU) or ``3 h f`` (SwiGLU), two norms ``2 h``; the token embedding ``V h`` (and a
  position table ``s h`` without RoPE) and, untied, an LM head ``V h``; biases are not counted. A
  pipeline stage holds ``L / (p v)`` layers per virtual stage; the first also holds the embedding
  and the last the head. Tensor parallelism divides all of it by ``t``.
- **Weights, gradients, optimizer** (AdamW, mixed precision, as the ZeRO paper counts it): 2 + 2 + 12
  bytes per parameter in bf16/fp16 (16-bit weights and gradients, fp32 master weights and two
  moments), 4 + 4 + 8 in fp32. ZeRO stage 1 shards the optimizer over the ``dp`` ranks, 2 also the
  gradients, 3 (FSDP) also the weights.
- **Activations** per layer and micro-batch (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", with attention through flash/SDPA kernels, so no
  ``s^2`` score matrix): the tensors autograd keeps, in units of ``s b h`` elements: attention
  ``5 + 2 k / heads`` (two norm and projection inputs, q, k, v and the attention output; with RoPE
  ``1 + k / heads`` more: the rotated halves of q and k), MLP
  ``2 + 2 f / h`` (GELU: fc input, GELU input and output) or ``2 + 4 f / h`` (SwiGLU), times the
  activation bytes; 17 elements = 34 bytes for GPT-2's ``f = 4 h`` in 16-bit, the paper's 34.
  Sequence parallelism divides all of it by ``t``. Selective recomputation keeps only the matmul and
  attention outputs and each block's input; full keeps each block's input (``s b h``); both add
  what one layer recomputes while its backward runs.
- **Pipeline in flight**: the first stage holds the activations of ``min(m, p)`` micro-batches under
  1F1B, ``m`` under GPipe, and ``p (1 + (p - 1) / (p v))`` layer-groups under interleaved 1F1B
  (Narayanan et al. 2021).
- **Logits**: ``s b V / t`` elements in the activation dtype plus an fp32 copy for the loss.
- **Communication buffers**: ZeRO-3/FSDP gathers two layers ahead (weights in 16-bit, gradients
  before their reduce-scatter in fp32); ZeRO 0-2 uses two gradient buckets (25 MB each, DDP's);
  tensor parallelism gathers one layer input ``s b h`` per rank.

What the closed form leaves out, so ``fits`` keeps 10% of the GPU free for it: the CUDA context
and NCCL's own buffers, allocator fragmentation, and temporary tensors inside kernels.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b"]
Recompute = Literal["none", "selective", "full"]

GIB = 1024**3
HEADROOM = 0.9  # of the GPU's memory the plan may fill
DDP_BUCKET_BYTES = 25 * 1024**2


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    ffn: int  # MLP hidden width f
    kv_heads: int  # = heads without grouped-query attention
    gated_mlp: bool = True  # SwiGLU (3 matrices) rather than GELU (2)
    tied_embeddings: bool = False
    rotary: bool = True  # RoPE on q and k (Llama), rather than learned positions (GPT-2)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attention = 2 * h * h + 2 * h * kv
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn
        return attention + mlp + 2 * h

    def embedding_params(self) -> int:
        """The token embedding, and the position table of a model without RoPE (GPT-2's)."""
        return self.vocab * self.hidden + (0 if self.rotary else self.seq_len * self.hidden)

    def total_params(self) -> int:
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.layers * self.layer_params() + self.embedding_params() + head + self.hidden

    def layer_activation_elements(self) -> float:
        """Elements kept by autograd per layer, in units of ``s b h`` (no recomputation)."""
        attention = 5 + 2 * self.kv_heads / self.heads
        if self.rotary:  # the rotated halves of q and k, kept for RoPE's multiply
            attention += 1 + self.kv_heads / self.heads
        mlp = 2 + (4 if self.gated_mlp else 2) * self.ffn / self.hidden
        return attention + mlp

    def selective_activation_elements(self) -> float:
        """Kept under selective recomputation: the outputs of q, k, v, attention, its output
        projection, the MLP's input matmuls and output matmul, and the block's input."""
        qkv = 1 + 2 * self.kv_heads / self.heads
        mlp_in = (2 if self.gated_mlp else 1) * self.ffn / self.hidden
        return 1 + qkv + 1 + 1 + mlp_in + 1


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 3  # 0: replicated (DDP), 1-3: ZeRO stages (3 = FSDP)
    virtual_stages: int = 1
    micro_batch: int = 1
    micro_batches: int = 1  # per step per pipeline: global batch / (micro_batch * dp)
    schedule: Schedule = "1f1b"
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    recompute: Recompute = "none"
    sequence_parallel: bool = True

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: int  # nvidia-smi's memory.total
    peak_tflops: float  # dense bf16 tensor-core peak


GPUS: dict[str, Gpu] = {
    "a100-40": Gpu("A100 40GB", 40960 * 1024**2, 312.0),
    "a100-80": Gpu("A100 80GB", 81920 * 1024**2, 312.0),
    "h100": Gpu("H100 80GB SXM", 81559 * 1024**2, 989.0),
    "h200": Gpu("H200 141GB", 143771 * 1024**2, 989.0),
}


def memory_per_gpu(shape: ModelShape, layout: Layout) -> dict[str, float]:
    """Bytes per GPU of the busiest pipeline stage (the first, which holds the most micro-batches
    in flight), by part, and their ``total``."""
    weights = _stage_params(shape, layout) / layout.tp
    param_bytes, grad_bytes, optim_bytes = (4, 4, 8) if layout.precision == "fp32" else (2, 2, 12)
    dp, zero = layout.dp, layout.zero
    parts = {
        "parameters": weights * param_bytes / (dp if zero >= 3 else 1),
        "gradients": weights * grad_bytes / (dp if zero >= 2 else 1),
        "optimizer": weights * optim_bytes / (dp if zero >= 1 else 1),
        "activations": _activations(shape, layout),
        "logits": _logits(shape, layout),
        "buffers": _buffers(shape, layout),
    }
    parts["total"] = sum(parts.values())
    return parts


def _stage_params(shape: ModelShape, layout: Layout) -> float:
    """Parameters of the first pipeline stage (its layers, the embedding, and the head when the
    model has one stage, or ties it to the embedding)."""
    layers = math.ceil(shape.layers / layout.pp)
    params = layers * shape.layer_params() + shape.embedding_params()
    if layout.pp == 1 and not shape.tied_embeddings:
        params += shape.vocab * shape.hidden + shape.hidden
    return float(params)


def _activation_bytes(layout: Layout) -> int:
    return 4 if layout.precision == "fp32" else 2


def _activations(shape: ModelShape, layout: Layout) -> float:
    """Activations kept by the first stage: its layers x the micro-batches in flight."""
    sbh = shape.seq_len * layout.micro_batch * shape.hidden
    split = layout.tp if layout.sequence_parallel else 1
    per_layer = {
        "none": shape.layer_activation_elements(),
        "selective": shape.selective_activation_elements(),
        "full": 1.0,
    }[layout.recompute]
    layers = math.ceil(shape.layers / layout.pp)  # the first stage's, over its v virtual stages
    kept = per_layer * sbh / split * layers * in_flight(layout)
    working = (shape.layer_activation_elements() - per_layer) * sbh / split  # what one layer recomputes
    return (kept + working) * _activation_bytes(layout)


def in_flight(layout: Layout) -> float:
    """Micro-batches whose activations the first stage holds at its peak."""
    p, m, v = layout.pp, layout.micro_batches, layout.virtual_stages
    if p == 1:
        return 1.0
    if layout.schedule == "gpipe":
        return float(m)
    if layout.schedule == "interleaved-1f1b":
        return min(float(m), p * (1 + (p - 1) / (p * v)))
    return float(min(m, p))


def _logits(shape: ModelShape, layout: Layout) -> float:
    """The last stage's logits (in the activation dtype) and their fp32 copy for the loss; the
    busiest stage is the first, but with one stage they coincide."""
    if layout.pp > 1:
        return 0.0
    elements = shape.seq_len * layout.micro_batch * shape.vocab / layout.tp
    return elements * (_activation_bytes(layout) + 4)


def _buffers(shape: ModelShape, layout: Layout) -> float:
    layer = shape.layer_params() / layout.tp
    # ZeRO-3 gathers two layers ahead (16-bit weights, fp32 gradients); otherwise two buckets.
    sharded = layout.zero >= 3 and layout.dp > 1
    data_parallel = 2 * layer * (2 + 4) if sharded else 2 * DDP_BUCKET_BYTES
    tensor_parallel = 0.0
    if layout.tp > 1:
        tensor_parallel = shape.seq_len * layout.micro_batch * shape.hidden * _activation_bytes(layout)
    return data_parallel + tensor_parallel


def fits(total_bytes: float, gpu: Gpu) -> bool:
    return total_bytes <= HEADROOM * gpu.memory_bytes


def describe(shape: ModelShape, layout: Layout) -> dict[str, Any]:
    return {"shape": asdict(shape), "layout": asdict(layout), "params": shape.total_params()}
