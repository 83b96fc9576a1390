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
- **Activations** per layer and micro-batch: what hpcpipe's GPT keeps for its backward, tensor by
  tensor (flash/SDPA attention, so no ``s^2`` score matrix), in bytes per ``s b h`` element.
  hpcpipe keeps fp32 weights and autocasts the matmuls, so the residual stream, each block's input
  and the norms' inputs are fp32 (``r = 4``) in every precision, and matmul outputs are 16-bit
  (``a = 2``; 4 in fp32). Without recomputation: the two norms' inputs ``2 r`` (CUDA's fused
  RMSNorm and LayerNorm keep the input and a statistic per row); the matmuls' inputs, each cast on
  its own under autocast (q, k, v and the MLP's input matmuls: ``3 + 2`` SwiGLU, ``3 + 1`` GELU
  casts of ``a``; one shared fp32 tensor per norm in fp32); q, k, v after RoPE ``(1 + 2 k / heads)
  a``; the attention output ``a``; the MLP ``4 f / h a`` (SwiGLU: gate, its SiLU, up, the product)
  or ``2 f / h a`` (GELU: its input and output); SDPA's fp32 log-sum-exp. Selective recomputation
  (``train/activation_checkpointing.py``: every matmul, attention and collective output) keeps the
  block's input ``r``, q, k, v, the attention output, the MLP's input matmuls and both output
  matmuls ``2 a``; full keeps the block's input ``r``; both hold one layer's recomputation while
  its backward runs.
- **Tensor parallelism** (DTensor, the GPT's plan with sequence parallelism): the norms' and
  blocks' inputs are split by sequence, q/k/v, attention and the MLP's columns by heads, but the
  matmuls' inputs are the all-gathered whole sequence on every rank, and selective also keeps the
  two all-gather outputs (``2 r``) and the row-wise matmuls' partial sums (``2 a``) whole, their
  reduce-scatters split. Megatron's count divides everything by ``t``; this does not.
- **Pipeline in flight**: the first stage holds the activations of ``min(m, p)`` micro-batches under
  1F1B, ``m`` under GPipe, and ``p (1 + (p - 1) / (p v))`` layer-groups under interleaved 1F1B
  (Narayanan et al. 2021); the last stage one under 1F1B (each backward right after its forward),
  ``m`` under GPipe. The busier of the two is the plan.
- **Logits**: on the stage with the head, ``s b V`` elements whole on every tensor-parallel rank
  (the head's output is all-gathered, ``Replicate()``) in ``a`` bytes, and the loss's fp32
  log-probabilities per micro-batch in flight; the final norm's and the head's inputs.
- **Weight casts**: under autocast every matmul weight of the stage is cast to 16-bit in its
  forward and held until the forward ends (saved for the backward without recomputation): ``2``
  bytes per weight over ``t``, not sharded by ZeRO (FSDP gathers the fp32 weights).
- **Communication buffers**: ZeRO-3/FSDP gathers two layers ahead (weights in 16-bit, gradients
  before their reduce-scatter in fp32); ZeRO 0-2 uses two gradient buckets (25 MB each, DDP's);
  tensor parallelism gathers one layer input ``s b h`` per rank (the norm's fp32 output).

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
# hpcpipe keeps fp32 weights and autocasts the matmuls: the residual stream, the blocks' inputs and
# the norms' inputs and outputs stay fp32 in every precision.
RESIDUAL_BYTES = 4


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
    """Bytes per GPU of the busiest pipeline stage, by part, and their ``total``: the first (the
    most micro-batches in flight, the embedding) or the last (the head and the logits)."""
    first = stage_memory(shape, layout, last=False)
    if layout.pp == 1:
        return first
    return max(first, stage_memory(shape, layout, last=True), key=lambda parts: parts["total"])


def stage_memory(shape: ModelShape, layout: Layout, *, last: bool) -> dict[str, float]:
    """Bytes per GPU of the first pipeline stage, or of the last (with one stage, the same)."""
    head = last or layout.pp == 1
    weights = _stage_params(shape, layout, last=last) / layout.tp
    param_bytes, grad_bytes, optim_bytes = (4, 4, 8) if layout.precision == "fp32" else (2, 2, 12)
    dp, zero = layout.dp, layout.zero
    flight = in_flight_last(layout) if last else in_flight(layout)
    parts = {
        "parameters": weights * param_bytes / (dp if zero >= 3 else 1),
        "gradients": weights * grad_bytes / (dp if zero >= 2 else 1),
        "optimizer": weights * optim_bytes / (dp if zero >= 1 else 1),
        "activations": _activations(shape, layout, flight)
        + (_head_inputs(shape, layout) * flight if head else 0),
        "logits": _logits(shape, layout, flight) if head else 0.0,
        "weight_casts": _weight_casts(shape, layout, head),
        "buffers": _buffers(shape, layout),
    }
    parts["total"] = sum(parts.values())
    return parts


def _stage_params(shape: ModelShape, layout: Layout, *, last: bool = False) -> float:
    """Parameters of the first pipeline stage (its layers and the embedding) or the last (its layers,
    the final norm and the head: a copy of a tied embedding there); with one stage, all of them."""
    params = math.ceil(shape.layers / layout.pp) * shape.layer_params()
    if layout.pp == 1:
        head = 0 if shape.tied_embeddings else shape.vocab * shape.hidden
        return float(params + shape.embedding_params() + head + shape.hidden)
    if last:
        return float(params + shape.vocab * shape.hidden + shape.hidden)
    return float(params + shape.embedding_params())


def _activation_bytes(layout: Layout) -> int:
    """Bytes of a matmul's output: 16-bit under autocast, 4 in fp32."""
    return 4 if layout.precision == "fp32" else 2


@dataclass(frozen=True)
class Kept:
    """Bytes kept per ``s b h`` element of one layer, by how tensor parallelism splits them."""

    sequence: float  # between the parallel regions: split by sequence parallelism, else whole
    heads: float  # inside attention and the MLP: this rank's heads and MLP columns
    full: float  # the whole sequence on every rank (all-gathered inputs, row-wise partial sums)

    def per_rank(self, layout: Layout) -> float:
        split = layout.tp if layout.sequence_parallel else 1
        return self.sequence / split + self.heads / layout.tp + self.full


def layer_kept(shape: ModelShape, layout: Layout, recompute: Recompute) -> Kept:
    """What autograd (or checkpointing's policy) keeps of one layer under ``recompute``: see the
    module docstring."""
    a, r = _activation_bytes(layout), RESIDUAL_BYTES
    autocast = a < r
    n_in = 2 if shape.gated_mlp else 1  # MLP input matmuls: gate and up, or fc
    qkv = 1 + 2 * shape.kv_heads / shape.heads
    lse = 4 * shape.heads / shape.hidden  # SDPA's fp32 log-sum-exp per row and head
    split = layout.tp > 1 and layout.sequence_parallel
    if recompute == "full":
        return Kept(sequence=r, heads=0.0, full=0.0)
    if recompute == "selective":
        heads = (qkv + 1 + n_in * shape.ffn / shape.hidden) * a + lse
        if layout.tp == 1:
            return Kept(sequence=r, heads=heads, full=2 * a)
        if split:  # two all-gathers (the norms' outputs), two partial sums and their reduce-scatters
            return Kept(sequence=r + 2 * a, heads=heads, full=2 * r + 2 * a)
        return Kept(sequence=r, heads=heads, full=4 * a)  # partial sums and their all-reduces
    mlp = (4 if shape.gated_mlp else 2) * shape.ffn / shape.hidden
    casts = (3 + n_in) if autocast else 2  # each matmul casts its input; fp32 shares one
    return Kept(sequence=2 * r, heads=(qkv + 1 + mlp) * a + lse, full=casts * a)


def _activations(shape: ModelShape, layout: Layout, flight: float) -> float:
    """A stage's layers x the micro-batches in flight, and the layer its backward recomputes."""
    sbh = shape.seq_len * layout.micro_batch * shape.hidden
    kept = layer_kept(shape, layout, layout.recompute).per_rank(layout)
    everything = layer_kept(shape, layout, "none").per_rank(layout)
    layers = math.ceil(shape.layers / layout.pp)  # a stage's, over its v virtual stages
    return (kept * layers * flight + max(0.0, everything - kept)) * sbh


def _head_inputs(shape: ModelShape, layout: Layout) -> float:
    """The final norm's input (the residual stream) and the LM head's (all-gathered; cast under
    autocast), per micro-batch."""
    sbh = shape.seq_len * layout.micro_batch * shape.hidden
    split = layout.tp if layout.sequence_parallel else 1
    return (RESIDUAL_BYTES / split + _activation_bytes(layout)) * sbh


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


def in_flight_last(layout: Layout) -> float:
    """Micro-batches whose activations the last stage holds: under 1F1B it runs each backward
    right after its forward; interleaved, its other v - 1 chunks warm up one round (p each)."""
    p, m, v = layout.pp, layout.micro_batches, layout.virtual_stages
    if p == 1:
        return 1.0
    if layout.schedule == "gpipe":
        return float(m)
    if layout.schedule == "interleaved-1f1b":
        return min(float(m), ((v - 1) * p + 1) / v)
    return 1.0


def _logits(shape: ModelShape, layout: Layout, flight: float) -> float:
    """The head's logits, whole on every tensor-parallel rank (the head's output is all-gathered,
    ``Replicate()``), in the activation dtype, and the fp32 log-probabilities the loss keeps for
    each micro-batch in flight."""
    elements = shape.seq_len * layout.micro_batch * shape.vocab
    return elements * (_activation_bytes(layout) + 4 * flight)


def _weight_casts(shape: ModelShape, layout: Layout, head: bool) -> float:
    """Under autocast, the 16-bit copy of every matmul weight of the stage, cast in its forward and
    held until the step's forward ends (its backward, without recomputation): whole layers, not
    ZeRO shards, since FSDP gathers fp32 weights and autocast casts them after."""
    if layout.precision == "fp32":
        return 0.0
    matmuls = math.ceil(shape.layers / layout.pp) * (shape.layer_params() - 2 * shape.hidden)
    if head:
        matmuls += shape.vocab * shape.hidden
    return matmuls / layout.tp * _activation_bytes(layout)


def _buffers(shape: ModelShape, layout: Layout) -> float:
    layer = shape.layer_params() / layout.tp
    # ZeRO-3 gathers two layers ahead (16-bit weights, fp32 gradients); otherwise two buckets.
    sharded = layout.zero >= 3 and layout.dp > 1
    data_parallel = 2 * layer * (2 + 4) if sharded else 2 * DDP_BUCKET_BYTES
    tensor_parallel = 0.0
    if layout.tp > 1:  # the gathered layer input: the norm's output, in the residual stream's dtype
        tensor_parallel = shape.seq_len * layout.micro_batch * shape.hidden * RESIDUAL_BYTES
    return data_parallel + tensor_parallel


def fits(total_bytes: float, gpu: Gpu) -> bool:
    return total_bytes <= HEADROOM * gpu.memory_bytes


def describe(shape: ModelShape, layout: Layout) -> dict[str, Any]:
    return {"shape": asdict(shape), "layout": asdict(layout), "params": shape.total_params()}
