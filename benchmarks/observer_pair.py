"""What the observer benchmarks share (``observability_overhead.py``, ``otel_overhead.py``): on
every gloo rank, two Trainers of the quickstart's GPT on the same in-memory tokens, one with the
observers under test ("on") and one without ("off"), timed in rotated blocks."""

from __future__ import annotations

import argparse
from pathlib import Path

from ddp_harness import join_group
from harness import block_parser, compare_loops, trainer_loop
from in_memory_gpt import in_memory_trainer, quickstart_job, random_tokens

# Observers that are on in the quickstart and not under test: off in both Trainers.
QUIET = ["observe.gpu.enabled=false", "observe.imbalance.every_steps=0"]
# --smoke (harness.parse_with_smoke): one block of 2 steps, logged at each, 1 sequence per rank
PAIR_TOY = {"repeats": 1, "steps": 2, "log_every": 1, "batch": 1, "vocab": 256}


def pair_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options of the pair: repeats, steps per block, ranks, logging, batch and vocabulary."""
    parser = block_parser(doc, repeats=11, steps=40)
    parser.add_argument("--nproc", type=int, default=2, help="DDP ranks (gloo on CPU)")
    parser.add_argument("--log-every", type=int, default=10, help="observe.log_every")
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--vocab", type=int, default=4096)
    return parser


def describe(args: argparse.Namespace) -> str:
    """The first line of the report: what ran."""
    return (
        f"{args.nproc} gloo ranks, quickstart GPT, {args.batch} seq/rank/step, {args.repeats} repeats x "
        f"{args.steps} steps, interleaved; log every {args.log_every}"
    )


class ObserverPair:
    """The "on" and "off" Trainers of this rank, in ``out/on/run`` and ``out/off/run``; both log
    every ``args.log_every`` steps, and differ only by ``on_sets`` and ``off_sets``."""

    def __init__(
        self,
        rank: int,
        args: argparse.Namespace,
        port: int,
        out: Path,
        on_sets: list[str],
        off_sets: list[str],
    ) -> None:
        logging = f"observe.log_every={args.log_every}"
        jobs = {
            name: quickstart_job(out / name, args.nproc, args.batch, args.vocab, [logging, *sets])
            for name, sets in (("on", on_sets), ("off", off_sets))
        }
        ctx = join_group(rank, args.nproc, port, jobs["on"].parallel)
        seq_len = jobs["on"].model.seq_len
        tokens = random_tokens(args.vocab, seq_len)
        self.on, self.off = (
            in_memory_trainer(job, tokens, args.vocab, ctx, out / name / "run") for name, job in jobs.items()
        )
        self.args = args
        self.tokens_per_step = args.batch * args.nproc * seq_len

    def time(self) -> dict[str, list[float]]:
        """Tokens per second of each in ``args.repeats`` rotated blocks, every rank in lockstep."""
        loops = {"on": trainer_loop(self.on), "off": trainer_loop(self.off)}
        a = self.args
        return compare_loops(loops, a.repeats, a.steps, self.tokens_per_step, warmup=a.log_every)

    def close(self) -> None:
        self.on.close()
        self.off.close()
