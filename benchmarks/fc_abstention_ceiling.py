"""How far declining after the call is written could lift an adapter's BFCL AST: a ceiling.

Greedy decoding decides call or text at the reply's first token (``p_call`` in eval.json). A rule
that writes the call first and then declines when the model was unsure of it could use more: the
call's own log-probability, which should drop where the listed function does not fit and the
model has to make its arguments up. This script measures that before anyone builds it:

- every reply of an evaluation that makes a call is scored under the same model (one forward pass
  over prompt + reply, raw logits: what the model wanted, not what a grammar let through);
- scores: ``p_call`` (log), the call's mean token log-probability, and their sum with the mean
  weighted ``--weights``;
- for each score, the threshold that maximises overall AST when replies below it decline, chosen
  with BFCL's own answers (an oracle: no shipped setting has them), alone and with irrelevance and
  live_irrelevance both kept at ``--keep`` or more. A declined reply passes exactly where no call
  was wanted; every other case keeps its outcome.

So the figures are upper bounds for a rule calibrated on generated data. Prints a table and a
JSON line (with the torch version and core count).

  python benchmarks/fc_abstention_ceiling.py runs/p20 runs/p20/eval-constrained

``--smoke`` (no arguments) makes its own inputs at toy size first: a LoRA run of one step on the
random 2-layer Llama, and an evaluation of 2 cases of three BFCL categories (the repository's
sample files, ``tests/data/bfcl``) in which every reply is a call; then scores them.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import emit, parse_with_smoke

IRRELEVANCE = ("irrelevance", "live_irrelevance")
BFCL_SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "bfcl"


def load_run(run_dir: Path) -> tuple[Any, Any]:
    """(model with the run's adapter, its chat format)."""
    from hpcpipe.config import load_config
    from hpcpipe.layout import RunLayout
    from hpcpipe.models.lora_export import load_with_adapter
    from hpcpipe.recipes import build_recipe

    layout = RunLayout(run_dir)
    recipe: Any = build_recipe(load_config(layout.config))
    return load_with_adapter(recipe.source, layout.adapter).eval(), recipe.chat


Results = list[dict[str, Any]]  # eval.json's "cases"


def replay(results: Results, score: dict[str, float], threshold: float) -> tuple[int, dict[str, int]]:
    """Cases passed when every reply whose score is below ``threshold`` declines, and the passes
    per irrelevance category."""
    passed, kept = 0, dict.fromkeys(IRRELEVANCE, 0)
    for r in results:
        declines = r["id"] in score and score[r["id"]] < threshold
        ok = (not r["expects_call"]) if declines else bool(r["ast"])
        passed += ok
        if r["category"] in kept:
            kept[r["category"]] += ok
    return passed, kept


def ceiling(results: Results, score: dict[str, float], keep: float) -> dict[str, Any]:
    """The best threshold for overall AST ("all"), the best with both irrelevance categories at
    ``keep`` or more ("kept"), and the score's ROC AUC among replies that call."""
    sizes = {c: max(1, sum(r["category"] == c for r in results)) for c in IRRELEVANCE}
    best: dict[str, Any] = {}
    for t in [*sorted(set(score.values())), math.inf]:
        passed, kept = replay(results, score, t)
        row: dict[str, Any] = {"threshold": None if math.isinf(t) else t, "ast": passed / len(results)}
        row |= {c: kept[c] / sizes[c] for c in IRRELEVANCE}
        if row["ast"] > best.get("all", {}).get("ast", -1):
            best["all"] = row
        if all(row[c] >= keep for c in IRRELEVANCE) and row["ast"] > best.get("kept", {}).get("ast", -1):
            best["kept"] = row
    # Passing calls against calls where none was wanted: does the score rank them apart?
    outcome = {r["id"]: r for r in results}
    passing = [s for i, s in score.items() if outcome[i]["ast"]]
    wrong = [s for i, s in score.items() if not outcome[i]["expects_call"]]
    pairs = max(1, len(passing) * len(wrong))
    best["auc"] = sum((p > n) + 0.5 * (p == n) for p in passing for n in wrong) / pairs
    return best


def scores_of(
    run: Path, results: Results, bfcl_dir: Path, weights: list[float]
) -> dict[str, dict[str, float]]:
    """Every score above, by reply id, for the replies that call."""
    from hpcpipe.evaluate.bfcl import load_bfcl
    from hpcpipe.evaluate.decline import call_log_probs
    from hpcpipe.evaluate.fc_run import build_cases

    categories = sorted({r["category"] for r in results})
    limit = max(sum(r["category"] == c for r in results) for c in categories)
    # The evaluations it reads were taken in file order (the dev split's first cases).
    cases = {c.id: c for c in build_cases([], 0, load_bfcl(bfcl_dir, categories, limit, "dev"))}
    model, chat = load_run(run)
    calling = [r for r in results if r["reply"].lstrip().startswith("<tool_call>")]
    mean = {}
    for r in calling:
        conv = cases[r["id"]].conversation
        prompt = chat.prompt(conv, len(conv.messages))
        mean[r["id"]] = statistics.fmean(call_log_probs(model, chat.tokenizer, prompt, r["reply"]))
    log_p_call = {r["id"]: math.log(max(r["p_call"], 1e-9)) for r in calling}
    scores = {"p_call": log_p_call, "call mean log-prob": mean}
    for w in weights:
        scores[f"log p_call + {w:g} x mean"] = {i: log_p_call[i] + w * mean[i] for i in mean}
    return scores


def print_row(name: str, c: dict[str, Any]) -> None:
    cells = [f"{c['auc']:.3f}"]
    for side in ("all", "kept"):
        row = c.get(side)
        cells += (
            [f"{row['ast']:.1%}", f"{row['irrelevance']:.0%}", f"{row['live_irrelevance']:.0%}"]
            if row
            else ["-"] * 3
        )
    print(f"{name:<28}" + "".join(f"{x:>9}" for x in cells))


def smoke_inputs(work: Path) -> tuple[Path, Path]:
    """(run, evaluation) at toy size for ``--smoke``: a LoRA run of one step on the random tiny
    Llama, and an eval.json of 2 cases of three sample BFCL categories whose every reply calls
    the case's first function (so each is scored), passing or not in turn."""
    from hpcpipe.config import load_config
    from hpcpipe.data.function_calling.conversation import ToolCall
    from hpcpipe.data.function_calling.tokens import format_call
    from hpcpipe.evaluate.bfcl import load_bfcl
    from hpcpipe.launch.job import run_job

    sets = ["model.name_or_path=@tiny-llama-random", "model.seq_len=128", "data.synthetic_rows=40"]
    sets += [
        "train.steps=1",
        "train.micro_batch_size=2",
        "train.global_batch_size=2",
        "observe.progress=false",
    ]
    sets += [f"run.out_dir={work}", f"data.prepared_dir={work / 'prepared'}", "run.name=smoke"]
    run = run_job(load_config("lora-fc-tiny", sets))
    cases = []
    for i, case in enumerate(load_bfcl(BFCL_SAMPLES, ["simple", *IRRELEVANCE], 2, "dev")):
        wanted = case.ground_truth is not None
        reply = format_call(ToolCall(case.functions[0]["name"], {}))
        row = {"id": case.id, "category": case.category, "expects_call": wanted, "reply": reply}
        cases.append({**row, "ast": wanted and i % 2 == 0, "p_call": 0.3 + 0.1 * i})
    (run / "eval").mkdir()
    (run / "eval" / "eval.json").write_text(json.dumps({"meta": {"split": "dev"}, "cases": cases}))
    return run, run / "eval"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "run", type=Path, nargs="?", help="the lora-function-calling run whose adapter scores"
    )
    parser.add_argument(
        "eval_dir", type=Path, nargs="?", help="an evaluation of that adapter (its eval.json)"
    )
    parser.add_argument(
        "--bfcl-dir", type=Path, default=Path("data/external/bfcl"), help="BFCL's files (make fc-assets)"
    )
    parser.add_argument("--keep", type=float, default=0.9, help="irrelevance kept at least at this share")
    parser.add_argument("--weights", default="1,2,4,8", help="weights of the mean log-prob in the sum")
    args = parse_with_smoke(parser, {"bfcl_dir": BFCL_SAMPLES})
    with tempfile.TemporaryDirectory(prefix="fc-ceiling-") as tmp:
        if args.smoke and args.run is None:
            args.run, args.eval_dir = smoke_inputs(Path(tmp))
        ceiling_of(parser, args)


def ceiling_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Every score's ceiling for the run and evaluation that ``args`` name: the table, the JSON line."""
    if args.run is None or args.eval_dir is None:
        parser.error("RUN and EVAL_DIR are required (--smoke alone makes its own)")
    for path in (args.eval_dir / "eval.json", args.run / "config.yaml", args.bfcl_dir):
        if not path.exists():
            parser.error(f"{path}: not found")

    # BFCL's cases only: held-out conversations (heldout_*) have no BFCL file to rebuild them from
    try:
        cases = json.loads((args.eval_dir / "eval.json").read_text())["cases"]
    except (json.JSONDecodeError, KeyError, TypeError):
        parser.error(f"{args.eval_dir / 'eval.json'}: not an evaluation's eval.json (no 'cases')")
    results: Results = [r for r in cases if not r["category"].startswith("heldout_")]
    if not results:
        parser.error(f"{args.eval_dir / 'eval.json'}: no BFCL cases (evaluate with --categories)")
    try:
        weights = [float(w) for w in args.weights.split(",")]
    except ValueError:
        parser.error(f"--weights: {args.weights!r} is not comma-separated numbers (e.g. 1,2,4,8)")
    start = time.perf_counter()
    scores = scores_of(args.run, results, args.bfcl_dir, weights)
    scored_s = round(time.perf_counter() - start, 1)
    decoded = sum(bool(r["ast"]) for r in results) / len(results)
    print(f"{len(results)} cases, {len(scores['p_call'])} replies call; AST as decoded {decoded:.1%}")
    print(
        f"{'score':<28}{'AUC':>9}{'best AST':>9}{'irrel':>9}{'live':>9}{'kept AST':>9}{'irrel':>9}{'live':>9}"
    )
    rows = {name: ceiling(results, score, args.keep) for name, score in scores.items()}
    for name, row in rows.items():
        print_row(name, row)
    line = {"benchmark": "fc_abstention_ceiling", "eval": str(args.eval_dir), "cases": len(results)}
    line |= {"ast_as_decoded": decoded, "keep": args.keep, "scored_s": scored_s, "scores": rows}
    emit(line)


if __name__ == "__main__":
    main()
