"""`hpcpipe plan memory`'s figures against what a real run holds, at small size on the CPU.

For hpcpipe's GPT (both variants), in fp32 and under bf16 autocast (as ``train.precision=bf16``
trains: fp32 weights, autocast matmuls), on one process and on two tensor-parallel ranks (gloo,
DTensor; sequence parallel, as the GPT's plan is):

- parameters, gradients and AdamW state (one process, fp32): the planner's bytes against the bytes
  of the model's tensors, its gradients after a backward, and the optimizer's state after a step;
- activations: the planner's activations (less the layer its backward recomputes) + the loss's
  log-probabilities + the 16-bit weight casts autograd saves, against the bytes glibc has handed
  out on rank 0 after the forward and the loss that it had not before (what the backward will
  need; every thread's, as gloo frees some tensors on its own; the lesser of two runs), for each
  ``train.activation_checkpointing``. The CPU's RMSNorm is the composite one, which keeps its
  normalized input besides its input; CUDA's fused kernel (the planner's) keeps the input and a
  statistic per row: the check adds those copies to the plan for llama (``cpu_norm_copies``).

Prints a table and a JSON line.

    .venv/bin/python benchmarks/plan_memory_check.py
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness import emit, parse_with_smoke
from hpcpipe.config import ModelConfig
from hpcpipe.models.gpt import GPT, mlp_hidden
from hpcpipe.plan.memory import RESIDUAL_BYTES, Layout, ModelShape, layer_kept, memory_per_gpu
from hpcpipe.train.activation_checkpointing import apply_activation_checkpointing

MIB = 2**20
MODES = ("none", "selective", "full")
# planned / measured for the activations: set on 4 blocks x 4 x 256 tokens (0.929 to 0.997), not
# on the default size this script reports
BOUND = (0.90, 1.02)
PRECISIONS = ("fp32", "bf16")


def shape_of(cfg: ModelConfig, vocab: int) -> ModelShape:
    llama = cfg.variant == "llama"
    return ModelShape(
        cfg.n_layers,
        cfg.d_model,
        cfg.n_heads,
        vocab,
        cfg.seq_len,
        mlp_hidden(cfg),
        cfg.n_heads,
        gated_mlp=llama,
        tied_embeddings=True,
        rotary=llama,
    )


def _in_use() -> int:
    """Bytes glibc's allocator has handed out (every thread's: gloo frees some tensors on its own)."""
    import ctypes
    import gc

    fields = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"

    class Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in fields.split()]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Info
    gc.collect()
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


def kept_after_forward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str) -> int:
    """Bytes live after the forward and the loss (under autocast, as the trainer runs them) that were
    not before: what the backward will need. The lesser of two runs (the first warms allocators)."""
    kept = []
    for _ in range(2):
        before = _in_use()
        with (
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"),
            sdpa_kernel(SDPBackend.FLASH_ATTENTION),
        ):
            loss = F.cross_entropy(_local(model(x)).flatten(0, 1).float(), y.flatten())
        kept.append(_in_use() - before)
        del loss
    return min(kept)


def planned_kept(shape: ModelShape, layout: Layout) -> float:
    """The plan's bytes that stay live from the forward to the backward: its activations less the
    layer recomputed in the backward, the log-probabilities (the 16-bit logits are freed once the
    loss has its fp32 copy), and the 16-bit weight casts where autograd saved them (no
    recomputation; otherwise autocast's cache drops them as its region ends)."""
    plan = memory_per_gpu(shape, layout)
    sbh = shape.seq_len * layout.micro_batch * shape.hidden
    everything = layer_kept(shape, layout, "none").per_rank(layout)
    recomputed = max(0.0, everything - layer_kept(shape, layout, layout.recompute).per_rank(layout)) * sbh
    log_probs = shape.seq_len * layout.micro_batch * shape.vocab * 4
    casts = plan["weight_casts"] if layout.recompute == "none" else 0.0
    return plan["activations"] - recomputed + log_probs + casts + cpu_norm_copies(shape, layout)


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def states(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, int]:
    """Bytes of the weights, their gradients and AdamW's state after one step."""
    optimizer = torch.optim.AdamW(model.parameters())
    F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    optimizer.step()
    params = list(model.parameters())
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    return {
        "parameters": sum(p.numel() * p.element_size() for p in params),
        "gradients": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
        "optimizer": sum(t.numel() * t.element_size() for t in state),  # master weights: fp32 already
    }


def cpu_norm_copies(shape: ModelShape, layout: Layout) -> float:
    """The normalized inputs the CPU's composite RMSNorm keeps beyond CUDA's fused one: two per layer
    kept (every layer without recomputation) and the final norm's."""
    if not shape.gated_mlp:  # gpt2: LayerNorm keeps its input and two statistics on both
        return 0.0
    layers = shape.layers if layout.recompute == "none" else 0  # recomputed: freed by now
    split = layout.tp if layout.sequence_parallel else 1
    return (2 * layers + 1) * RESIDUAL_BYTES / split * shape.seq_len * layout.micro_batch * shape.hidden


def build(cfg: ModelConfig, vocab: int, mode: str, tp: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = GPT(cfg, vocab)
    if tp > 1:
        from torch.distributed.device_mesh import init_device_mesh

        from hpcpipe.models.gpt_parallel import gpt_tensor_parallel_plan
        from hpcpipe.train.tensor_parallel import apply_tensor_parallel

        apply_tensor_parallel(model, gpt_tensor_parallel_plan(cfg, tp), init_device_mesh("cpu", (tp,)))
    apply_activation_checkpointing(list(model.blocks), mode)
    return model


def model_and_batch(variant: str, args: argparse.Namespace) -> tuple[ModelConfig, torch.Tensor, torch.Tensor]:
    """The GPT shape of ``args`` and one batch: inputs and targets, (B, T) each, alike on every rank."""
    cfg = ModelConfig(variant=variant, n_layers=args.layers, d_model=args.d_model,
                      n_heads=args.heads, seq_len=args.seq_len)  # fmt: skip
    seeded = torch.Generator().manual_seed(0)
    batch = torch.randint(0, args.vocab, (2, args.batch, args.seq_len), generator=seeded)
    return cfg, batch[0], batch[1]


def activation_rows(rank: int, tp: int, args: argparse.Namespace, out: Any) -> None:
    """Every variant x precision x recompute on ``tp`` ranks (a process each); rank 0's rows to ``out``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=tp)
    rows = []
    for variant in ("gpt2", "llama"):
        cfg, x, y = model_and_batch(variant, args)
        for precision in PRECISIONS:
            for mode in MODES:
                model = build(cfg, args.vocab, mode, tp)
                measured = kept_after_forward(model, x, y, precision)
                layout = Layout(tp=tp, precision=precision, micro_batch=args.batch, recompute=mode)  # type: ignore[arg-type]
                shape = shape_of(cfg, args.vocab)
                planned = planned_kept(shape, layout)
                rows.append({"variant": variant, "precision": precision, "tp": tp, "recompute": mode,
                             "planned_mib": planned / MIB, "measured_mib": measured / MIB,
                             "ratio": planned / measured})  # fmt: skip
    if rank == 0:
        out.put(rows)
    torch.distributed.destroy_process_group()


def spawn_rows(tp: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    queue = mp.get_context("spawn").Queue()
    mp.start_processes(activation_rows, args=(tp, args, queue), nprocs=tp, start_method="spawn", join=True)
    return queue.get()  # type: ignore[no-any-return]


def state_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for variant in ("gpt2", "llama"):
        cfg, x, y = model_and_batch(variant, args)
        torch.manual_seed(0)
        measured = states(GPT(cfg, args.vocab), x, y)
        plan = memory_per_gpu(shape_of(cfg, args.vocab), Layout(precision="fp32"))
        for part in ("parameters", "gradients", "optimizer"):
            # the plan counts no biases (gpt2 has them; llama has none), the model does
            rows.append(
                {"variant": variant, "part": part, "planned_mib": plan[part] / MIB,
                 "measured_mib": measured[part] / MIB, "ratio": plan[part] / measured[part]}
            )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8, help="micro-batch")
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--port", type=int, default=29517, help="the gloo group's port on 127.0.0.1")
    toy = {"layers": 1, "d_model": 32, "heads": 2, "seq_len": 32, "batch": 2, "vocab": 64}
    args = parse_with_smoke(parser, toy)
    torch.set_num_threads(2)
    rows = [*spawn_rows(1, args), *spawn_rows(2, args), *state_rows(args)]
    print(f"{'variant':<8}{'what':<34}{'planned MiB':>12}{'measured MiB':>14}{'planned/measured':>18}")
    for r in rows:
        what = r["part"] if "part" in r else f"activations ({r['precision']}, tp {r['tp']}, {r['recompute']})"
        print(
            f"{r['variant']:<8}{what:<34}{r['planned_mib']:>12.1f}{r['measured_mib']:>14.1f}{r['ratio']:>18.3f}"
        )
    sizes = {
        "layers": args.layers,
        "d_model": args.d_model,
        "heads": args.heads,
        "seq_len": args.seq_len,
        "micro_batch": args.batch,
        "vocab": args.vocab,
    }
    outside = [r for r in rows if "recompute" in r and not BOUND[0] <= r["ratio"] <= BOUND[1]]
    print(f"activations outside {BOUND[0]}-{BOUND[1]}: {len(outside)} of {len(rows) - 6}")
    emit(
        {
            "benchmark": "plan_memory_check",
            "shape": sizes,
            "rows": rows,
            "bound": BOUND,
            "outside": len(outside),
        }
    )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
