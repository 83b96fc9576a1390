"""What `--constrain` adds to a function-calling evaluation before it decodes: XGrammar compiling
each case's call grammar, against generating the same cases' replies under those grammars.

`hpcpipe eval function-calling --constrain` compiles one grammar per case (its offered functions'
schemas, ``hpcpipe.evaluate.constrain.CallGrammars``) and then generates in batches of
``--batch-size`` prompts of similar length (``generate_replies``). This script forms the same
batches from the BFCL cases of ``--split`` (the first ``--limit`` of each default category) and
times, per batch:

- "compile": compiling the batch's grammars with the evaluation's compiler (every batch; wall and
  CPU seconds);
- "generate": greedy decoding of the batch under them, as the evaluation decodes (``--generate``
  batches, spread evenly from the shortest prompts to the longest: it takes minutes per batch).

The compiler's own setup (the tokenizer's vocabulary read once) is printed beside. The figure is
the ratio of medians: compile / generate per batch (small is cheap). Prints a table and a JSON
line (with the torch version and core count).

    .venv/bin/python benchmarks/fc_grammar_compile.py [--target data/external/smollm2/...gguf]

``--smoke`` takes the random 2-layer Llama and 2 cases of each category from the repository's
sample files (``tests/data/bfcl``), and decodes 4 tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import emit, parse_with_smoke, print_table
from hpcpipe.errors import UserError

REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = REPO / "data" / "external" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
BFCL = REPO / "data" / "external" / "bfcl"  # `make fc-assets`
BFCL_SAMPLES = REPO / "tests" / "data" / "bfcl"
SAMPLE_CATEGORIES = ("simple", "multiple", "irrelevance", "live_simple")


def batches_by_length(prompts: Sequence[str], size: int) -> list[list[int]]:
    """Prompt indices in the batches ``generate_replies`` forms: sorted by length, ``size`` each."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    return [order[start : start + size] for start in range(0, len(order), size)]


def spread(count: int, among: int) -> list[int]:
    """``count`` positions spread evenly over ``range(among)``, both ends included."""
    if count >= among:
        return list(range(among))
    if count == 1:
        return [among // 2]
    return sorted({round(k * (among - 1) / (count - 1)) for k in range(count)})


Seconds = list[float]


def time_compile(
    compiler: Any, cases: Sequence[Any], batches: Sequence[Sequence[int]]
) -> tuple[list[Any], Seconds, Seconds]:
    """(grammars by case, wall seconds per batch, CPU seconds per batch)."""
    grammars: list[Any] = [None] * len(cases)
    wall: Seconds = []
    cpu: Seconds = []
    for batch in batches:
        w, c = time.perf_counter(), time.process_time()
        for i in batch:
            grammars[i] = compiler.compile(cases[i].conversation.tools)
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return grammars, wall, cpu


def time_generate(
    model: Any,
    chat: Any,
    prompts: Sequence[str],
    grammars: Sequence[Any],
    compiler: Any,
    batches: Sequence[Sequence[int]],
    max_new_tokens: int,
) -> list[float]:
    """Wall seconds of each batch's constrained greedy decoding, as the evaluation runs it."""
    from hpcpipe.evaluate.generate import generate_replies

    seconds = []
    for batch in batches:
        chunk = [prompts[i] for i in batch]
        rows = list(batch)
        start = time.perf_counter()
        generate_replies(
            model,
            chat.tokenizer,
            chunk,
            max_new_tokens,
            len(chunk),
            constraint=lambda index, rows=rows: compiler.processor([grammars[rows[i]] for i in index]),
        )
        seconds.append(time.perf_counter() - start)
    return seconds


def load(target: Path | None, work: Path) -> tuple[Any, Any]:
    """(model, chat format): ``target`` (a GGUF file or model directory), or the random tiny Llama."""
    from hpcpipe.cli.fc_target import load_target

    if target is None:
        from hpcpipe.data.function_calling.conversation import ToolCall
        from hpcpipe.data.function_calling.tokens import format_call
        from hpcpipe.models.tiny_lm import tiny_llama_dir

        texts = [format_call(ToolCall("get_weather", {"city": "Oslo"})), "It is sunny."] * 20
        target = tiny_llama_dir(work, texts, seed=0)
    model, chat, *_ = load_target(target, base=True, constrain=True)
    return model, chat


def main() -> None:
    from hpcpipe.cli.evaluate import CATEGORIES_DEFAULT

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=SMOLLM2, help="a GGUF file or model directory")
    parser.add_argument("--bfcl-dir", type=Path, default=BFCL)
    parser.add_argument("--categories", default=CATEGORIES_DEFAULT)
    parser.add_argument("--split", default="dev")
    parser.add_argument("--limit", type=positive, default=30, help="cases per category")
    parser.add_argument("--batch-size", type=positive, default=8, help="as the evaluation's default")
    parser.add_argument("--generate", type=positive, default=3, help="batches decoded (minutes each)")
    parser.add_argument("--max-new-tokens", type=positive, default=256, help="as the evaluation's default")
    toy = {
        "target": None,
        "bfcl_dir": BFCL_SAMPLES,
        "categories": ",".join(SAMPLE_CATEGORIES),
        "limit": 2,
        "batch_size": 4,
        "generate": 1,
        "max_new_tokens": 4,
    }
    args = parse_with_smoke(parser, toy)
    try:
        measure(args)
    except UserError as exc:  # a missing file, an unknown split or category, a model that is not one
        parser.error(str(exc))


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def measure(args: argparse.Namespace) -> None:
    import torch

    from hpcpipe.evaluate.bfcl import load_bfcl
    from hpcpipe.evaluate.constrain import CallGrammars, check_template
    from hpcpipe.evaluate.fc_run import logits_width
    from hpcpipe.evaluate.function_calling import bfcl_case

    if args.target is not None and not args.target.exists():
        raise UserError(f"--target: {args.target} does not exist (run `make fc-assets`)")
    if not args.bfcl_dir.is_dir():
        raise UserError(f"--bfcl-dir: {args.bfcl_dir} does not exist (run `make fc-assets`)")
    cases = [
        bfcl_case(c) for c in load_bfcl(args.bfcl_dir, args.categories.split(","), args.limit, args.split)
    ]
    with tempfile.TemporaryDirectory() as work, torch.inference_mode():
        model, chat = load(args.target, Path(work))
        check_template(chat)
        prompts = [chat.prompt(case.conversation, len(case.conversation.messages)) for case in cases]
        batches = batches_by_length(prompts, args.batch_size)
        start = time.perf_counter()
        compiler = CallGrammars(chat.tokenizer, logits_width(model, chat.tokenizer))
        setup_s = time.perf_counter() - start
        grammars, compile_s, compile_cpu_s = time_compile(compiler, cases, batches)
        decoded = [batches[i] for i in spread(args.generate, len(batches))]
        generate_s = time_generate(model, chat, prompts, grammars, compiler, decoded, args.max_new_tokens)

    print(
        f"{len(cases)} cases ({args.split}), {len(batches)} batches of {args.batch_size}; "
        f"compiler setup {setup_s:.2f} s, {compiler.unconstrained} case(s) left free"
    )
    print_table("per batch", "s", {"compile": compile_s, "cpu": compile_cpu_s, "generate": generate_s}, 3)
    ratio = statistics.median(compile_s) / statistics.median(generate_s)
    print(f"compile / generate, medians per batch: {ratio:.4f}")
    emit(
        {
            "benchmark": "fc_grammar_compile",
            "target": str(args.target) if args.target else "tiny-llama-random",
            "cases": len(cases),
            "batch_size": args.batch_size,
            "setup_s": round(setup_s, 3),
            "compile_s_median": round(statistics.median(compile_s), 4),
            "compile_s_max": round(max(compile_s), 4),
            "compile_cpu_s_median": round(statistics.median(compile_cpu_s), 4),
            "generate_s": [round(s, 2) for s in generate_s],
            "generate_batches": len(generate_s),
            "unconstrained_cases": compiler.unconstrained,
            "ratio": round(ratio, 5),
        }
    )


if __name__ == "__main__":
    main()
