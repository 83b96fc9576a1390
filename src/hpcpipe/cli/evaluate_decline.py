"""`hpcpipe eval decline`: withdraw the calls of an evaluation that the adapter was unsure of, by a
threshold calibrated on generated near misses (hpcpipe.evaluate.decline)."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from hpcpipe.cli.common import JsonOption, console, err_console, write_json
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout

BFCL_DEFAULT = Path("data/external/bfcl")


def decline(
    run: Annotated[
        Path, typer.Argument(help="A lora-function-calling run directory (its adapter).", show_default=False)
    ],
    eval_dir: Annotated[
        Path | None,
        typer.Option(
            help="The evaluation of RUN whose replies are judged (default: the first of "
            "RUN/eval-constrained, RUN/eval, then the test split's RUN/eval-test-constrained, "
            "RUN/eval-test, then the same of --split all)."
        ),
    ] = None,
    cases: Annotated[int, typer.Option(min=10, help="Generated near misses the threshold is set on.")] = 100,
    target: Annotated[
        float, typer.Option(min=0.5, max=1.0, help="The share of near misses that must decline.")
    ] = 0.95,
    weight: Annotated[
        float, typer.Option(min=0.0, help="Weight of the call's mean token log-prob in the score.")
    ] = 4.0,
    recalibrate: Annotated[
        bool, typer.Option("--recalibrate", help="Set the threshold again even when decline.json exists.")
    ] = False,
    bfcl_dir: Annotated[Path, typer.Option(help="The BFCL files the evaluation read.")] = BFCL_DEFAULT,
    out: Annotated[Path | None, typer.Option(help="Output directory (default: EVAL_DIR-declined).")] = None,
    json_out: JsonOption = None,
) -> None:
    """Decline the calls an adapter was unsure of, after they are written, and score again.

    Every reply of the evaluation that opens with a call (one written after some text is left
    as it is) is scored in one forward pass: log P(call) at its first token + WEIGHT x the mean
    log-probability of its tokens. A call scoring below the
    threshold becomes a decline. The threshold is set on generated near misses (a request beside
    a listed function of its field that cannot serve it; data.synthetic_mix.near_misses, a seed
    no training row was drawn from), decoded as the evaluation was (--constrain or not, its call
    threshold or greedy): the one at which TARGET of them decline. It is saved beside the adapter
    (decline.json) and reused; nothing of a benchmark sets it. Writes eval.json and eval.md;
    `hpcpipe eval compare` reads them.

    Examples:

      hpcpipe eval function-calling runs/lora-fc-smollm2 --constrain   # RUN/eval-constrained
      hpcpipe eval decline runs/lora-fc-smollm2                         # RUN/eval-constrained-declined
      hpcpipe eval compare runs/base/eval-constrained runs/lora-fc-smollm2/eval-constrained-declined
    """
    from hpcpipe.cli.fc_target import load_run
    from hpcpipe.evaluate.compare import read_eval
    from hpcpipe.evaluate.decline import apply_decline, read_decline
    from hpcpipe.evaluate.function_calling import summarize, write_report

    layout = RunLayout(run)
    if not layout.config.is_file():
        raise UserError(f"{run}: not a run directory (no config.yaml)")
    source = eval_dir or _default_eval(layout)
    source = source.parent if source.is_file() else source
    evaluation = read_eval(source)
    unscored = next(
        (r["id"] for r in evaluation["cases"] if not isinstance(r.get("p_call"), float | int)), None
    )
    if unscored is not None:
        raise UserError(f"{source}: case {unscored} has no p_call (evaluate again with this hpcpipe)")
    _check_judged(evaluation.get("meta") or {}, layout, source, "" if eval_dir else " (pass --eval-dir)")
    constrained = bool((evaluation.get("meta") or {}).get("constrained"))
    call_threshold = _call_threshold(evaluation.get("meta") or {}, source)
    adapter = layout.adapter
    rule = None if recalibrate else read_decline(adapter)  # a damaged decline.json: before the model loads
    model, chat, heldout, meta, _ = load_run(run, False, constrained)
    start = time.perf_counter()
    settings = (cases, target, weight, constrained, call_threshold)
    rule = _rule(rule, settings, layout, model, chat)
    calibrate_s = round(time.perf_counter() - start, 1)
    results = evaluation["cases"]
    split = str((evaluation.get("meta") or {}).get("split", "all"))  # before --split: file order
    judged = apply_decline(model, chat, _cases_of(results, heldout, bfcl_dir, split), results, rule)
    declined = [r for r in judged if "declined_call" in r]
    meta = {
        **(evaluation.get("meta") or {}),
        "decline": {**asdict(rule), "declined": len(declined), "calibrate_s": calibrate_s},
        "decline_s": round(time.perf_counter() - start, 1),
    }
    summary = summarize(judged)
    written = out or source.with_name(source.name + "-declined")
    write_report(summary, judged, meta, written)
    if json_out != "-":
        typer.echo((written / RunLayout.FC_EVAL_MARKDOWN).read_text())
        wanted = sum(r["expects_call"] for r in declined)
        console.print(
            f"threshold {_shown(rule.threshold)} ({rule.calling} of {rule.cases} near misses called); "
            f"declined {len(declined)} calls, {wanted} of them where a call was wanted",
            highlight=False,
        )
        console.print(f"wrote {written / RunLayout.FC_EVAL_JSON}", highlight=False)
    write_json({"meta": meta, "overall": summary["overall"], "categories": summary["categories"]}, json_out)


def _rule(rule: Any, settings: tuple[Any, ...], layout: RunLayout, model: Any, chat: Any) -> Any:
    """The saved ``rule`` (a DeclineRule or None) when it was set with these ``settings`` on the
    adapter there now, else one set again and saved: the near misses are decoded as the
    evaluation was, and training again re-exports the adapter beside the old decline.json."""
    from dataclasses import replace

    from hpcpipe.config import load_config
    from hpcpipe.evaluate.calibrate import adapter_sha256, set_on_this_adapter, unhashed_note
    from hpcpipe.evaluate.decline import calibrate_decline

    adapter = layout.adapter
    if rule is not None:
        same = (rule.cases, rule.target, rule.weight, rule.constrained, rule.call_threshold) == settings
        if same and set_on_this_adapter(rule.adapter_sha256, adapter):
            if rule.adapter_sha256 is None:
                err_console.print(unhashed_note(adapter / RunLayout.DECLINE), highlight=False)
            return rule
        if same:  # with other settings asked for, setting it again is no surprise
            err_console.print(
                f"{adapter / RunLayout.DECLINE}: set on an earlier adapter, not the one there now; "
                "calibrating again",
                highlight=False,
            )
    cases, target, weight, constrained, call_threshold = settings
    job = load_config(layout.config)
    found = calibrate_decline(
        model, chat, job.data.synthetic_mix, job.run.seed, cases, target, weight, constrained,
        call_threshold=call_threshold,
    )  # fmt: skip
    found = replace(found, adapter_sha256=adapter_sha256(adapter))
    found.save(adapter)
    return found


def _shown(threshold: float | None) -> str:
    return "none (the first token declined enough)" if threshold is None else f"{threshold:.6f}"


def _check_judged(meta: dict[str, Any], layout: RunLayout, source: Path, hint: str) -> None:
    """UserError unless ``meta`` (eval.json's) is an evaluation of this run with its adapter: the
    adapter judges the replies, so another model's replies would be scored by the wrong one. An
    evaluation folder inside the run that names a run of the same name is the run's, wherever the
    run was when it was written (one copied from the cluster recorded the cluster's paths)."""
    adapter, run = meta.get("adapter"), meta.get("run")
    # Moved or copied with its folders: an evaluation folder of the run, naming a run of its name.
    inside = (
        source.resolve().parent == layout.root.resolve() and Path(str(run)).name == layout.root.resolve().name
    )
    if run is None or not (inside or _same_path(str(run), layout.root)):
        what = f"run {run}" if run else f"model {meta.get('model')}"
        raise UserError(f"{source}: an evaluation of {what}, not of {layout.root}{hint}")
    in_run = inside and _within(str(adapter), str(run)) == layout.adapter.relative_to(layout.root)
    if adapter is None or not (in_run or _same_path(str(adapter), layout.adapter)):
        what = "the base model (--base)" if adapter is None else f"the adapter {adapter}"
        raise UserError(f"{source}: an evaluation of {what}, not of {layout.adapter}{hint}")


def _within(path: str, root: str) -> Path | None:
    """``path`` relative to ``root`` as recorded, or None when it is not under it."""
    try:
        return Path(path).relative_to(root)
    except ValueError:
        return None


def _call_threshold(meta: dict[str, Any], source: Path) -> float | None:
    """The first-token threshold the evaluation decided by (None: greedy decoding)."""
    from hpcpipe.evaluate.calibrate import is_number

    value = meta.get("call_threshold")
    if value is not None and not is_number(value):
        raise UserError(f"{source}: meta.call_threshold {value!r} is not a number (evaluate again)")
    return None if value is None else float(value)


def _same_path(recorded: str, here: Path) -> bool:
    """Whether the path eval.json recorded names ``here``: a relative one was relative to where
    the evaluation ran, so it matches the end of ``here``'s full path."""
    path, full = Path(recorded), here.resolve()
    if path.resolve() == full:
        return True
    parts = tuple(p for p in path.parts if p != ".")
    return not path.is_absolute() and ".." not in parts and full.parts[-len(parts) :] == parts


def _default_eval(layout: RunLayout) -> Path:
    """The adapter's evaluation, in a fixed order (each split writes its own folder): dev, where
    rules are chosen, then test, then all; constrained before free."""
    for split in RunLayout.FC_EVAL_SPLITS:
        for constrained in (True, False):
            path = layout.fc_eval_dir(False, constrained, split)
            if (path / RunLayout.FC_EVAL_JSON).is_file():
                return path
    raise UserError(f"{layout.root}: no evaluation to judge (run `hpcpipe eval function-calling` first)")


def _cases_of(results: list[dict[str, Any]], heldout: list[Any], bfcl_dir: Path, split: str) -> list[Any]:
    """The evaluation's cases rebuilt, in its order (held-out conversations and BFCL files)."""
    from hpcpipe.evaluate.bfcl import load_bfcl
    from hpcpipe.evaluate.fc_run import build_cases

    categories = sorted({r["category"] for r in results if not r["id"].startswith("heldout_")})
    limit = max((sum(r["category"] == c for r in results) for c in categories), default=None)
    held = [int(r["id"].removeprefix("heldout_")) for r in results if r["id"].startswith("heldout_")]
    if categories and not bfcl_dir.is_dir():
        raise UserError(f"--bfcl-dir: {bfcl_dir} does not exist (the evaluation read BFCL's files)")
    bfcl = load_bfcl(bfcl_dir, categories, limit, split) if categories else []
    built = {c.id: c for c in build_cases(heldout, max(held, default=-1) + 1, bfcl)}
    missing = [r["id"] for r in results if r["id"] not in built]
    if missing:
        raise UserError(f"{missing[0]}: not a case of this run and {bfcl_dir} (evaluated elsewhere?)")
    return [built[r["id"]] for r in results]
