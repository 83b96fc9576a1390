"""The side-by-side machinery every benchmark shares.

The project's rule for a claim: hpcpipe and its raw baseline measured side by side in one run,
in rotated order (a b, b a, ... with two arms; a b c, b c a, c a b, ... with three) so drift on a
shared machine hits every arm alike; medians over the repeats; a ratio, not an absolute time; a
table, then one JSON line carrying the context a ratio needs (``run_context``). Every script also
takes ``--smoke`` (``parse_with_smoke``): the same code path at toy size, which the test suite runs.

torch is imported inside the functions that need it: a launcher that imports this module stays
light until it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")
Loop = Callable[[int], Any]  # runs N optimizer steps


def rotation(names: Sequence[str], repeat: int) -> list[str]:
    """The order of the arms in round ``repeat``: each arm leads in turn."""
    shift = repeat % len(names)
    return [*names[shift:], *names[:shift]]


def measure_round(arms: Mapping[str, Callable[[], T]], repeat: int, out: dict[str, list[T]]) -> None:
    """One measurement of every arm, in round ``repeat``'s order, appended to ``out[arm]``."""
    for name in rotation(list(arms), repeat):
        out.setdefault(name, []).append(arms[name]())


def side_by_side(arms: Mapping[str, Callable[[], T]], repeats: int) -> dict[str, list[T]]:
    """``repeats`` rounds of every arm's measurement, rotated; each arm's values in round order."""
    out: dict[str, list[T]] = {name: [] for name in arms}
    for repeat in range(repeats):
        measure_round(arms, repeat, out)
    return out


def synchronize() -> None:
    """Wait for queued GPU work, then for every rank: a timed block starts and ends together
    everywhere, so the slowest rank sets its time."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_initialized():  # else nothing ran there: no context made just to wait
        torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()


def rate(loop: Loop, steps: int, items_per_step: int) -> float:
    """Items per second over ``steps`` steps of ``loop``."""
    synchronize()
    start = time.perf_counter()
    loop(steps)
    synchronize()
    return items_per_step * steps / (time.perf_counter() - start)


def compare_loops(
    loops: Mapping[str, Loop], repeats: int, steps: int, items_per_step: int, warmup: int = 2
) -> dict[str, list[float]]:
    """Items per second of each loop in ``repeats`` rotated rounds of ``steps``-step blocks, after
    ``warmup`` untimed steps of each (allocator, kernels, the first optimizer state)."""
    for loop in loops.values():
        loop(warmup)
    blocks = {name: partial(rate, loop, steps, items_per_step) for name, loop in loops.items()}
    return side_by_side(blocks, repeats)


def trainer_loop(trainer: Any) -> Loop:
    """hpcpipe's Trainer as a loop: ``n`` more optimizer steps from where it stands."""
    return lambda n: trainer.train_until(trainer.step + n)


@dataclass(frozen=True)
class Comparison:
    """Arm ``top`` over arm ``bottom``: the ratio of their medians (the figure), and the median
    of each round's own ratio (its two measurements ran back to back: steadier where the
    machine's speed drifts, as CPU steal on a shared host makes it)."""

    top: str
    bottom: str
    top_median: float
    bottom_median: float
    paired: float

    @classmethod
    def of(cls, runs: Mapping[str, Sequence[float]], top: str, bottom: str) -> Comparison:
        pairs = zip(runs[top], runs[bottom], strict=True)
        return cls(
            top,
            bottom,
            statistics.median(runs[top]),
            statistics.median(runs[bottom]),
            statistics.median(a / b for a, b in pairs),
        )

    @property
    def ratio(self) -> float:
        return self.top_median / self.bottom_median

    def fields(self, stem: str) -> dict[str, float]:
        """The JSON line's keys: ``{top}_{stem}`` and ``{bottom}_{stem}`` (the medians), ``ratio``
        and ``paired_ratio``."""
        return {
            f"{self.top}_{stem}": round(self.top_median, 1),
            f"{self.bottom}_{stem}": round(self.bottom_median, 1),
            "ratio": round(self.ratio, 4),
            "paired_ratio": round(self.paired, 4),
        }

    def summary(self, target: float | None = None) -> str:
        """``ratio top/bottom = R (target >= T); median of paired blocks P``."""
        goal = "" if target is None else f" (target >= {target})"
        head = f"ratio {self.top}/{self.bottom} = {self.ratio:.3f}{goal}"
        return f"{head}; median of paired blocks {self.paired:.3f}"


def block_parser(doc: str | None, repeats: int, steps: int) -> argparse.ArgumentParser:
    """A benchmark's options (its docstring for --help), starting with those of timed blocks:
    ``--repeats`` rounds, each a block of ``--steps`` optimizer steps per arm."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=repeats, help="rounds: timed blocks per arm")
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps per timed block")
    return parser


SMOKE_HELP = (
    "toy size: every stage of the script end to end, quickly (a check that it still runs, as "
    'the test suite does; its figures measure nothing, and the JSON line says "smoke": true)'
)
SMOKE_NOTE = "smoke run at toy size: the figures above check that the script runs, and measure nothing"
_this_run = argparse.Namespace(smoke=False)  # set by parse_with_smoke; read by emit


def parse_with_smoke(
    parser: argparse.ArgumentParser, toy: Mapping[str, object], argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """The benchmark's options, with ``--smoke`` added: the script's own code path at toy size, for
    ``tests/e2e/test_benchmarks_smoke.py``. ``toy`` maps option names (their ``dest``) to the
    values a smoke run takes; they replace the defaults, so an option given on the command line
    still wins. After a smoke run's table, ``emit`` says so and adds ``"smoke": true``."""
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    if unknown := sorted(set(toy) - set(vars(args))):
        raise ValueError(f"toy values for options the parser lacks: {unknown}")
    if args.smoke:
        parser.set_defaults(**toy)
        args = parser.parse_args(argv)
    _this_run.smoke = bool(args.smoke)
    return args


def print_table(label: str, unit: str, runs: Mapping[str, Sequence[float]], decimals: int = 1) -> None:
    """The side-by-side table: each arm's median, min and max."""
    print(f"{label:<10}{'median ' + unit:>14}{'min':>10}{'max':>10}")
    for name, xs in runs.items():
        med = statistics.median(xs)
        print(f"{name:<10}{med:>14,.{decimals}f}{min(xs):>10,.{decimals}f}{max(xs):>10,.{decimals}f}")


def cpu_model() -> str:
    """The processor's name as ``lscpu`` gives it ("Model name"); Python's guess without lscpu."""
    if shutil.which("lscpu"):
        env = {**os.environ, "LC_ALL": "C"}
        out = subprocess.run(["lscpu"], capture_output=True, text=True, env=env, check=False).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name":
                return value.strip()
    return platform.processor() or platform.machine()


def run_context() -> dict[str, object]:
    """What a ratio is never quoted without: torch and hpcpipe versions, cores, torch threads,
    Python, the device type, the CPU model and the date (UTC)."""
    import torch

    import hpcpipe

    return {
        "torch": torch.__version__,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "hpcpipe": hpcpipe.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "cpu_model": cpu_model(),
        "date": datetime.now(UTC).date().isoformat(),
    }


def emit(record: Mapping[str, object]) -> None:
    """The benchmark's last line: ``record`` and the run's context as one JSON object (a key of
    ``record`` wins over the context's, e.g. the device the workers saw); after a smoke run
    (``parse_with_smoke``), a line saying so first and ``"smoke": true`` in the object."""
    context = {k: v for k, v in run_context().items() if k not in record}
    if _this_run.smoke:
        print(SMOKE_NOTE)
        record = {**record, "smoke": True}
    print(json.dumps({**record, **context}), flush=True)


def report_pair(
    benchmark: str,
    runs: Mapping[str, Sequence[float]],
    unit: tuple[str, str],
    target: float,
    fields: Mapping[str, object],
    decimals: int = 1,
    notes: Sequence[str] = (),
) -> Comparison:
    """hpcpipe against its raw baseline: the table, the ratio line, ``notes``, and the JSON line.

    ``unit`` is the rate's unit as printed and its JSON key stem, e.g. ("tok/s", "tokens_per_s");
    ``fields`` follow the figures in the JSON line."""
    comparison = Comparison.of(runs, "hpcpipe", "raw")
    print_table("loop", unit[0], {name: runs[name] for name in ("hpcpipe", "raw")}, decimals)
    print(comparison.summary(target))
    for note in notes:
        print(note)
    emit({"benchmark": benchmark, **comparison.fields(unit[1]), "target": target, **fields})
    return comparison
