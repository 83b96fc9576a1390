"""`hpcpipe plan memory`'s figures against what a real run holds, at small size on the CPU.

For hpcpipe's GPT (both variants) in fp32, one process:

- parameters, gradients and AdamW state: the planner's bytes against the bytes of the model's
  tensors, its gradients after a backward, and the optimizer's state after a step (exact counts);
- activations: the planner's activations + logits against the peak of live memory over one forward
  and backward (the profiler's memory view: every allocation and free, in order), less the
  gradients that backward accumulates meanwhile, for each ``train.activation_checkpointing``.

Allocations are deterministic: one run is the result. Prints a table and a JSON line.

    .venv/bin/python benchmarks/plan_memory_check.py
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness import emit, parse_with_smoke
from hpcpipe.config import ModelConfig
from hpcpipe.models.gpt import GPT, mlp_hidden
from hpcpipe.plan.memory import Layout, ModelShape, memory_per_gpu
from hpcpipe.train.activation_checkpointing import apply_activation_checkpointing

MIB = 2**20


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


def peak_live(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Peak live bytes allocated during one forward and backward (the profiler's memory events)."""
    from torch.profiler import ProfilerActivity, profile

    with (
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
        sdpa_kernel(SDPBackend.FLASH_ATTENTION),
    ):
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    live = peak = 0
    for event in events:
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


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
    toy = {"layers": 1, "d_model": 32, "heads": 2, "seq_len": 32, "batch": 2, "vocab": 64}
    args = parse_with_smoke(parser, toy)
    torch.set_num_threads(2)
    rows = []
    for variant in ("gpt2", "llama"):
        cfg = ModelConfig(
            variant=variant,
            n_layers=args.layers,
            d_model=args.d_model,
            n_heads=args.heads,
            seq_len=args.seq_len,
        )
        shape = (2, args.batch, args.seq_len)
        x, y = torch.randint(0, args.vocab, shape, generator=torch.Generator().manual_seed(0))
        torch.manual_seed(0)
        measured_states = states(GPT(cfg, args.vocab), x, y)
        for mode in ("none", "selective", "full"):
            torch.manual_seed(0)
            model = GPT(cfg, args.vocab)
            apply_activation_checkpointing(list(model.blocks), mode)
            grads = measured_states["gradients"]
            measured = peak_live(model, x, y) - grads  # the gradients accumulate during backward
            layout = Layout(precision="fp32", micro_batch=args.batch, recompute=mode)
            plan = memory_per_gpu(shape_of(cfg, args.vocab), layout)
            planned = plan["activations"] + plan["logits"]
            row = {
                "variant": variant,
                "recompute": mode,
                "planned_mib": planned / MIB,
                "measured_mib": measured / MIB,
            }
            row["ratio"] = planned / measured
            rows.append(row)
        plan = memory_per_gpu(shape_of(cfg, args.vocab), Layout(precision="fp32"))
        for part in ("parameters", "gradients", "optimizer"):
            # the plan counts no biases (gpt2 has them; llama has none), the model does
            rows.append(
                {"variant": variant, "part": part, "planned_mib": plan[part] / MIB,
                 "measured_mib": measured_states[part] / MIB, "ratio": plan[part] / measured_states[part]}
            )  # fmt: skip
    print(f"{'variant':<8}{'what':<22}{'planned MiB':>12}{'measured MiB':>14}{'planned/measured':>18}")
    for r in rows:
        what = f"activations ({r['recompute']})" if "recompute" in r else r["part"]
        print(
            f"{r['variant']:<8}{what:<22}{r['planned_mib']:>12.1f}{r['measured_mib']:>14.1f}{r['ratio']:>18.3f}"
        )
    sizes = {
        "layers": args.layers,
        "d_model": args.d_model,
        "heads": args.heads,
        "seq_len": args.seq_len,
        "micro_batch": args.batch,
        "vocab": args.vocab,
    }
    emit({"benchmark": "plan_memory_check", "shape": sizes, "rows": rows})


if __name__ == "__main__":
    main()
