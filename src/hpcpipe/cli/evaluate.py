"""`hpcpipe eval function-calling`: generate and score tool calls (held-out data and BFCL files);
`hpcpipe eval compare`: two such evaluations, before and after, with their intervals."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hpcpipe.cli import fc_target
from hpcpipe.cli.common import JsonOption, console, err_console, print_table, write_json
from hpcpipe.cli.evaluate_decline import decline
from hpcpipe.cli.fc_target import load_target
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout

app = typer.Typer(help="Evaluate trained models.", no_args_is_help=True)

BFCL_DEFAULT = Path("data/external/bfcl")
CATEGORIES_DEFAULT = (
    "simple,multiple,parallel,parallel_multiple,irrelevance,live_simple,live_multiple,live_irrelevance"
)


@app.command("function-calling")
def function_calling(
    target: Annotated[
        Path,
        typer.Argument(
            help="A lora-function-calling run directory (its base model + export/adapter), a "
            "transformers model directory, or a .gguf file.",
            show_default=False,
        ),
    ],
    base: Annotated[
        bool,
        typer.Option(
            "--base", help="Run directory: evaluate the base model without the adapter (the 'before')."
        ),
    ] = False,
    bfcl_dir: Annotated[
        Path,
        typer.Option(
            help="BFCL test files (BFCL_v4_*.json + possible_answer/); `make fc-assets` puts them here."
        ),
    ] = BFCL_DEFAULT,
    categories: Annotated[
        str, typer.Option(help="Comma-separated BFCL categories ('' for none).")
    ] = CATEGORIES_DEFAULT,
    split: Annotated[
        str,
        typer.Option(
            help="Which BFCL cases: 'dev' (the first 30 single-turn cases of each category: "
            "choose settings, thresholds and rules here), 'test' (30 further cases per category "
            "drawn once by a fixed hash of their ids, disjoint from dev: report here, once, "
            "never tune on it; live_parallel and live_parallel_multiple are too small to have "
            "one) or 'all' (every case, in file order).",
        ),
    ] = "dev",
    limit: Annotated[
        int | None,
        typer.Option(
            min=1, help="BFCL cases per category: the first N of the split (default: the whole split)."
        ),
    ] = None,
    heldout_limit: Annotated[
        int, typer.Option(min=0, help="Held-out conversations of the run's data to score.")
    ] = 100,
    max_new_tokens: Annotated[
        int, typer.Option(min=1, help="Longest reply generated (4 calls took 160-199 of SmolLM2's tokens).")
    ] = 256,
    batch_size: Annotated[int, typer.Option(min=1, help="Prompts generated together.")] = 8,
    call_threshold: Annotated[
        str,
        typer.Option(
            help="How a reply decides between a call and text, at its first token: 'auto' (the "
            "threshold the run's training calibrated, call_threshold.json beside the adapter, "
            "else greedy), 'greedy' (the likeliest token decides), or a number P: open with a "
            "call when P(call) >= P (a reply that opens with text may still call after it). "
            "eval.json records each case's P(call) either way.",
        ),
    ] = "auto",
    constrain: Annotated[
        bool,
        typer.Option(
            "--constrain/--free",
            help="--constrain: once a reply opens a <tool_call>, it can only call an offered "
            "function with arguments that follow its JSON schema (required keys, types, enums; "
            "XGrammar, as vLLM and SGLang serve tool calls). Whether to call, which function, how "
            "many calls and the values stay the model's. --free: plain greedy decoding.",
        ),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Output directory (default: RUN/eval or RUN/eval-base; ./eval otherwise; "
            "with --split test or all, the split after it: eval-test, eval-base-all; with "
            "--constrain, the name + '-constrained')."
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace the default output's eval.json even when it was written with other "
            "--split, --categories, --limit, --heldout-limit, --call-threshold or --constrain "
            "(without it, that is refused: pass --out).",
        ),
    ] = False,
    json_out: JsonOption = None,
) -> None:
    """Generate the assistant turn for held-out conversations and for BFCL's own test files,
    then score the calls with hpcpipe's AST checker (BFCL's rules): parse rate, call/no-call
    accuracy, function-name accuracy, AST accuracy per category and strict exact match, with
    error types counted. Writes eval.json and eval.md.

    Each AST accuracy comes with its Wilson 95% interval (ast_ci95); `hpcpipe eval compare`
    reads two evaluations, before and after.

    Examples:

      hpcpipe eval function-calling runs/lora-fc-smollm2 --base     # before fine-tuning
      hpcpipe eval function-calling runs/lora-fc-smollm2            # after
      hpcpipe eval function-calling runs/lora-fc-smollm2 --constrain  # writes RUN/eval-constrained
      hpcpipe eval function-calling runs/lora-fc-smollm2 --split test  # writes RUN/eval-test
      hpcpipe eval function-calling data/external/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --limit 5
    """
    from hpcpipe.evaluate.bfcl import SPLITS, load_bfcl
    from hpcpipe.evaluate.fc_run import build_cases, evaluate_cases

    if split not in SPLITS:
        raise UserError(f"--split: unknown split {split!r} (known: {', '.join(SPLITS)})")
    if not target.exists():
        raise UserError(f"{target}: no such run directory, model directory or .gguf file")
    chosen = [c.strip() for c in categories.split(",") if c.strip()]
    if twice := list(dict.fromkeys(c for c in chosen if chosen.count(c) > 1)):
        # Each would be read and scored again: its cases counted twice, its interval too narrow.
        raise UserError(f"--categories: {', '.join(twice)} given more than once (name each category once)")
    if chosen and not bfcl_dir.is_dir():
        raise UserError(
            f"--bfcl-dir: {bfcl_dir} does not exist (run `make fc-assets`, or pass --categories '')"
        )
    bfcl_cases = load_bfcl(bfcl_dir, chosen, limit, split) if chosen else []  # before the model loads
    run = RunLayout(target)
    adapter = run.adapter if run.config.is_file() and not base else None  # load_run's adapter
    if adapter is not None:  # before its call_threshold.json is judged against its weights
        fc_target.require_adapter(adapter)
    threshold = _call_threshold(call_threshold, adapter)  # before the model loads too
    # As given, not as resolved: auto after training again (a new calibration) is the same option.
    given = call_threshold if call_threshold in ("auto", "greedy") else threshold
    wanted: dict[str, Any] = {"--split": split, "--categories/--limit": [c.id for c in bfcl_cases]}
    if run.config.is_file():  # a model directory or .gguf file has no held-out conversations
        wanted["--heldout-limit"] = heldout_limit
    wanted |= {"--call-threshold": given, "--constrain": constrain}
    if out is None and not overwrite:
        where = fc_target.default_out(target, base, constrain, split)
        _refuse_replacing(where / RunLayout.FC_EVAL_JSON, wanted)
    model, chat, heldout, meta, default_out = load_target(target, base, constrain, split)
    meta["split"] = split
    meta["heldout_limit"] = heldout_limit
    meta["call_threshold_option"] = given
    meta["call_decision"] = (
        "greedy" if threshold is None else ("calibrated" if call_threshold == "auto" else "given")
    )
    cases = build_cases(heldout, heldout_limit, bfcl_cases)
    if not cases:
        raise UserError("nothing to evaluate: no held-out conversations and no BFCL categories")
    result = evaluate_cases(
        model,
        chat,
        cases,
        out or default_out,
        meta,
        max_new_tokens,
        batch_size,
        progress=json_out != "-",
        call_threshold=threshold,
        constrain=constrain,
    )
    if json_out != "-":
        written = out or default_out
        typer.echo((written / RunLayout.FC_EVAL_MARKDOWN).read_text())  # plain: rich would wrap the table
        console.print(f"wrote {written / RunLayout.FC_EVAL_JSON}")
    write_json(
        {"meta": result["meta"], "overall": result["overall"], "categories": result["categories"]}, json_out
    )


@app.command("compare")
def compare(
    base: Annotated[
        Path,
        typer.Argument(
            metavar="BASE",
            help="The 'before': an eval.json of `hpcpipe eval function-calling`, or its directory "
            "(RUN/eval-base).",
            show_default=False,
        ),
    ],
    after: Annotated[
        Path,
        typer.Argument(
            metavar="AFTER", help="The 'after', scored on the same cases (RUN/eval).", show_default=False
        ),
    ],
    max_cases: Annotated[
        int, typer.Option(min=0, help="Case ids listed per direction of change (--json lists all).")
    ] = 20,
    json_out: JsonOption = None,
) -> None:
    """Compare two function-calling evaluations of the same cases: what changed, beyond noise.

    Per category and overall: the cases, the AST accuracy before and after with its Wilson 95%
    interval, the change in points and a verdict: "real" when the two intervals do not overlap,
    "within noise" when they do (a conservative test: at 20 cases a category's interval is up to
    40 points wide). Then the cases whose AST check flipped, passed -> failed and failed ->
    passed, by id.

    Both evaluations must cover the same categories and cases: run them with the same
    --split, --categories, --limit and --heldout-limit.

    Examples:

      hpcpipe eval function-calling runs/lora-fc-smollm2 --base    # writes RUN/eval-base
      hpcpipe eval function-calling runs/lora-fc-smollm2           # writes RUN/eval
      hpcpipe eval compare runs/lora-fc-smollm2/eval-base runs/lora-fc-smollm2/eval
      hpcpipe eval compare before/eval.json after/eval.json --max-cases 0 --json compare.json
    """
    from rich.markup import escape

    from hpcpipe.evaluate.compare import compare_evals, read_eval

    result = compare_evals(read_eval(base), read_eval(after))
    if json_out != "-":
        console.print(f"before: {escape(result['base'])}\nafter:  {escape(result['after'])}", highlight=False)
        modes = result["decoding"]
        if modes["base"] != modes["after"]:
            console.print(
                f"[yellow]decoding differs: before {modes['base']}, after {modes['after']} "
                "(the change measures both the model and --constrain)[/]"
            )
        rows = [[name, *_compare_cells(row)] for name, row in result["categories"].items()]
        rows.append(["overall", *_compare_cells(result["overall"])])
        headers = ["category", "cases", "before", "after", "change (pts)", "verdict"]
        print_table(headers, rows, typed=("category",), title="AST accuracy [Wilson 95% interval]")
        changed = result["changed"]
        total = sum(len(ids) for ids in changed.values())
        console.print(f"AST check changed in {total} of {result['overall']['cases']} cases", highlight=False)
        for key, label in (
            ("passed_to_failed", "passed -> failed"),
            ("failed_to_passed", "failed -> passed"),
        ):
            ids = changed[key]
            shown = ", ".join(ids[:max_cases])
            more = f"{', ' if shown else ''}and {len(ids) - max_cases} more" if len(ids) > max_cases else ""
            console.print(f"  {label} ({len(ids)}): {escape(shown + more) or '-'}", highlight=False)
    write_json(result, json_out)


app.command("decline")(decline)


def _call_threshold(option: str, adapter: Path | None) -> float | None:
    """``--call-threshold`` as a threshold (None: greedy); ``auto`` reads the adapter's calibration."""
    from hpcpipe.evaluate.calibrate import read_calibration, set_on_this_adapter, unhashed_note

    if option == "greedy":
        return None
    if option == "auto":
        calibration = read_calibration(adapter) if adapter else None
        if adapter is None or calibration is None:
            return None
        saved = adapter / RunLayout.CALL_THRESHOLD
        if not set_on_this_adapter(calibration.adapter_sha256, adapter):
            # Training again re-exports the adapter beside the old file (without calibrating
            # unless lora.calibration_cases): a threshold set on other weights decides nothing.
            raise UserError(
                f"{saved}: set on an earlier adapter, not the one there now; delete it, train "
                "with lora.calibration_cases, or pass --call-threshold greedy or a number"
            )
        if calibration.adapter_sha256 is None:
            err_console.print(unhashed_note(saved), highlight=False)
        return calibration.threshold
    try:
        value = float(option)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise UserError(f"--call-threshold: {option!r} is not auto, greedy or a number from 0 to 1")
    return value


def _refuse_replacing(path: Path, wanted: dict[str, Any]) -> None:
    """UserError when the evaluation at ``path`` (the default output) was written with settings
    other than ``wanted``: a quick --limit run silently replaced a full one, which eval decline
    and compare then read. Settings it does not record (written before they were) pass."""
    import json

    try:
        found = json.loads(path.read_text())
        had = _recorded_settings(found.get("meta") or {}, found["cases"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return  # none there, or not one worth keeping (unreadable)
    differ = [key for key, value in wanted.items() if key in had and value not in had[key]]
    if differ:
        raise UserError(
            f"{path}: an evaluation written with other {', '.join(differ)} is there; pass --out to "
            "write this one elsewhere, or --overwrite to replace it"
        )


def _recorded_settings(meta: dict[str, Any], cases: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """For each setting an eval.json records, the values it may have been written with; settings
    it does not record are left out."""
    had: dict[str, list[Any]] = {
        "--categories/--limit": [[c["id"] for c in cases if not str(c["id"]).startswith("heldout_")]]
    }
    for key, name in (("--split", "split"), ("--heldout-limit", "heldout_limit")):
        if name in meta:
            had[key] = [meta[name]]
    if "constrained" in meta:
        had["--constrain"] = [bool(meta["constrained"])]
    if "call_threshold_option" in meta:
        had["--call-threshold"] = [meta["call_threshold_option"]]
    elif "call_decision" in meta:  # before the option was recorded: what its decision allows
        decision = meta["call_decision"]
        given = [meta.get("call_threshold")] if decision == "given" else []
        had["--call-threshold"] = {"calibrated": ["auto"], "greedy": ["auto", "greedy"]}.get(decision, given)
    return had


def _compare_cells(row: dict[str, Any]) -> list[str]:
    """cases, before, after, change, verdict of one compare row (rich markup on the verdict)."""

    def rate(side: dict[str, Any]) -> str:
        low, high = side["ci95"]
        return f"{100 * side['acc']:.1f}% [{100 * low:.0f}, {100 * high:.0f}]"

    diff = 100 * row["diff"]
    colour = "dim" if row["verdict"] != "real" else ("green" if diff > 0 else "red")
    return [
        str(row["cases"]),
        rate(row["before"]),
        rate(row["after"]),
        f"{diff:+.1f}",
        f"[{colour}]{row['verdict']}[/]",
    ]
