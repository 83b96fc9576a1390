"""The function-calling headline over several training seeds: AST accuracy per BFCL category and
overall for the base and for each seed's adapter, each with its Wilson 95% interval, the mean over
the seeds with its spread (lowest and highest seed), and the change from the base in points.

Every evaluation must have scored the same cases (the same ``--split``, categories and limit), as
``hpcpipe eval compare`` requires; the base should be decoded as the adapters were (``eval.json``
records ``constrained``; the table says when they differ). The report for the README:

    hpcpipe eval function-calling runs/fc-test-s0 --base --split test --heldout-limit 0 --constrain
    for s in 0 1 2; do hpcpipe eval function-calling runs/fc-test-s$s --split test --heldout-limit 0 \\
        --constrain && hpcpipe eval decline runs/fc-test-s$s; done
    python benchmarks/fc_seeds.py runs/fc-test-s0/eval-base-test-constrained \\
        runs/fc-test-s{0,1,2}/eval-test-constrained-declined

``--smoke`` runs the same table on two small evaluations it writes itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import emit
from hpcpipe.errors import UserError
from hpcpipe.evaluate.compare import read_eval
from hpcpipe.evaluate.function_calling import summarize


def seeds_table(base: dict[str, Any], afters: list[dict[str, Any]]) -> dict[str, Any]:
    """Per category (and "overall"): the base's and every seed's AST accuracy with its interval,
    the seeds' mean, lowest and highest, and the mean's change from the base in points."""
    ids = sorted(c["id"] for c in base["cases"])
    for after in afters:
        if sorted(c["id"] for c in after["cases"]) != ids:
            raise UserError(
                f"{after['path']}: not the cases of {base['path']} (run both with the same --split)"
            )
    summaries = [summarize(e["cases"]) for e in (base, *afters)]
    rows: dict[str, Any] = {}
    for name in [*summaries[0]["categories"], "overall"]:
        cells = [s["overall"] if name == "overall" else s["categories"][name] for s in summaries]
        seeds = [100 * c["ast_acc"] for c in cells[1:]]
        rows[name] = {
            "cases": cells[0]["cases"],
            "base": _cell(cells[0]),
            "seeds": [_cell(c) for c in cells[1:]],
            "mean": round(statistics.fmean(seeds), 1),
            "low": round(min(seeds), 1),
            "high": round(max(seeds), 1),
            "change_pts": round(statistics.fmean(seeds) - 100 * cells[0]["ast_acc"], 1),
        }
    decoding = sorted({bool((e.get("meta") or {}).get("constrained")) for e in (base, *afters)})
    splits = sorted({str((e.get("meta") or {}).get("split", "unrecorded")) for e in (base, *afters)})
    declines = [_decline(e) for e in afters]
    return {"rows": rows, "same_decoding": len(decoding) == 1, "splits": splits, "declines": declines}


def _decline(evaluation: dict[str, Any]) -> dict[str, Any] | None:
    """What `hpcpipe eval decline` did to one seed's evaluation (None when it was not declined): its
    threshold, how many near misses still called at it, and the calls it withdrew, with how many of
    them were on cases that wanted a call (each of those a pass lost or a failure kept)."""
    rule = (evaluation.get("meta") or {}).get("decline")
    if rule is None:
        return None
    withdrawn = [c for c in evaluation["cases"] if "declined_call" in c]
    return {
        "threshold": rule["threshold"],
        "near_misses_opening_a_call": f"{rule['calling']}/{rule['cases']}",
        "withdrawn": len(withdrawn),
        "withdrawn_wanted": sum(bool(c["expects_call"]) for c in withdrawn),
    }


def _cell(metrics: dict[str, Any]) -> dict[str, float]:
    low, high = metrics["ast_ci95"]
    return {"ast": round(100 * metrics["ast_acc"], 1), "low": round(100 * low), "high": round(100 * high)}


def print_table(table: dict[str, Any], seeds: int) -> None:
    head = ["category", "cases", "base", *[f"seed {i}" for i in range(seeds)], "mean (low-high)", "change"]
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join(["---"] * len(head)) + " |")
    for name, row in table["rows"].items():
        cells = [_shown(row["base"]), *[_shown(c) for c in row["seeds"]]]
        spread = f"{row['mean']:.1f} ({row['low']:.1f}-{row['high']:.1f})"
        print(
            f"| {name} | {row['cases']} | " + " | ".join(cells) + f" | {spread} | {row['change_pts']:+.1f} |"
        )
    if not table["same_decoding"]:
        print("decoding differs between the base and the adapters (--constrain on one side only)")
    print(f"split: {', '.join(table['splits'])}")
    for seed, rule in enumerate(table["declines"]):
        if rule is not None:
            opened = rule["near_misses_opening_a_call"]
            print(
                f"seed {seed}: decline threshold {rule['threshold']} ({opened} near misses opened a "
                f"call), withdrew {rule['withdrawn']} calls, {rule['withdrawn_wanted']} where one was wanted"
            )


def _shown(cell: dict[str, float]) -> str:
    return f"{cell['ast']:.1f} [{cell['low']:.0f}, {cell['high']:.0f}]"


def _smoke_evals(root: Path) -> list[Path]:
    """Two evaluations of the same four cases, as `hpcpipe eval function-calling` writes them."""
    paths = []
    for name, passing in (("base", {"simple_0"}), ("after", {"simple_0", "simple_1", "irrelevance_0"})):
        cases = [
            {
                "id": case_id,
                "category": case_id.rsplit("_", 1)[0],
                "expects_call": not case_id.startswith("irrelevance"),
                "parsed": True,
                "decision": case_id in passing,
                "name": True,
                "ast": case_id in passing,
                "exact": case_id in passing,
                "error": None if case_id in passing else "value_error",
                "reply": "",
                "p_call": 0.5,
                **({"declined_call": "[f()]"} if name == "after" and case_id == "irrelevance_0" else {}),
            }
            for case_id in ("simple_0", "simple_1", "irrelevance_0", "irrelevance_1")
        ]
        (root / name).mkdir()
        meta: dict[str, Any] = {"split": "dev", "constrained": True}
        if name == "after":
            meta["decline"] = {"threshold": -1.0, "calling": 3, "cases": 10}
        (root / name / "eval.json").write_text(json.dumps({"meta": meta, "cases": cases}))
        paths.append(root / name)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "base", nargs="?", type=Path, help="the base model's evaluation (eval.json or its folder)"
    )
    parser.add_argument("afters", nargs="*", type=Path, help="one evaluation per training seed")
    parser.add_argument("--smoke", action="store_true", help="the same table on two evaluations it writes")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        paths = _smoke_evals(Path(tmp)) if args.smoke else [args.base, *args.afters]
        if len(paths) < 2 or paths[0] is None:
            parser.error("give the base's evaluation and at least one adapter's")
        try:
            evals = [read_eval(p) for p in paths]
            table = seeds_table(evals[0], evals[1:])
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print_table(table, len(paths) - 1)
    emit(
        {
            "benchmark": "fc_seeds",
            **table,
            "evals": [str(p) for p in paths],
            "smoke": args.smoke,
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
