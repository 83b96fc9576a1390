"""``summary.md``: what a run did and how it went, from its run directory alone."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from hpcpipe.config import validate_config
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout
from hpcpipe.observe.lineage_record import read_checked_lineage
from hpcpipe.observe.metrics import read_events, read_metrics
from hpcpipe.recipes.registry import recipe_class
from hpcpipe.yamlfile import read_yaml_file


def run_summary(run_dir: Path) -> dict[str, Any]:
    """Key figures of a run, read back from its files."""
    rows = read_metrics(run_dir)
    train = [r for r in rows if "loss" in r]
    val = [r for r in rows if "val_loss" in r]
    rate_key = next((k for r in train for k in r if k.endswith("_per_s")), None)
    layout = RunLayout(run_dir)
    config = read_yaml_file(layout.config, "run's config")
    lineage_path = layout.lineage
    lineage = read_checked_lineage(lineage_path) if lineage_path.is_file() else {}
    return {
        "steps": train[-1]["step"] if train else 0,
        "final_train_loss": train[-1]["loss"] if train else None,
        "val_loss_first": val[0]["val_loss"] if val else None,
        "val_loss_first_step": val[0]["step"] if val else None,
        "val_loss_last": val[-1]["val_loss"] if val else None,
        "val_loss_last_step": val[-1]["step"] if val else None,
        "val_acc_first": val[0].get("val_acc") if val else None,
        "val_acc_last": val[-1].get("val_acc") if val else None,
        "rate_key": rate_key,
        "median_rate": _median_rate(train, rate_key),
        "world_size": train[-1].get("world_size") if train else lineage.get("world_size"),
        "config": config,
        "lineage": lineage,
    }


def _median_rate(train: list[dict[str, Any]], rate_key: str | None) -> float | None:
    """The median rate; the first interval holds start-up (and compilation): left out when there
    are more. A row without a number there (a hand-edited or foreign row) is skipped."""
    rates = [r.get(rate_key) for r in train[1:] or train] if rate_key else []
    numbers = [x for x in rates if isinstance(x, int | float) and not isinstance(x, bool)]
    return statistics.median(numbers) if numbers else None


def _model_and_unit(config: dict[str, Any]) -> tuple[str, str]:
    """The recipe's words for the model and for one sample; the recipe's name alone when the run's
    config no longer validates here (its recipe's package is not installed)."""
    try:
        job = validate_config(config)
        recipe = recipe_class(job.run.recipe)
    except UserError:
        return str(config.get("run", {}).get("recipe")), "samples"
    return recipe.describe_model(job), recipe.sample_noun


# What the worker writes when the next start's group forms, before its group_start: the downtime
# since the crashed start's last event is not training.
NEXT_START = ("restart", "membership_change")


def training_wall_time(run_dir: Path) -> tuple[float, int] | None:
    """Seconds spent training over every start of the group (first, restarts, later ``hpcpipe
    run``s), and how many: each from its ``group_start`` (its workers' start when known) to its
    ``run_finished``, or to its last event when it ended otherwise. None without a start."""
    spans: list[tuple[float, float]] = []  # (began, its latest event)
    ended = True
    for event in read_events(run_dir):
        at = event.get("time")
        if not isinstance(at, int | float):
            continue
        if event.get("event") == "group_start":
            began = event.get("worker_start")
            spans.append((began if isinstance(began, int | float) and began <= at else at, at))
            ended = False
        elif event.get("event") in NEXT_START:  # a crashed start ended before the downtime
            ended = True
        elif spans and not ended:  # events after run_finished (an agent's) are not training
            spans[-1] = (spans[-1][0], at)
            ended = event.get("event") == "run_finished"
    return (sum(end - began for began, end in spans), len(spans)) if spans else None


def write_summary(run_dir: Path) -> Path:
    s = run_summary(run_dir)
    t, p = s["config"]["train"], s["config"]["parallel"]
    model, unit = _model_and_unit(s["config"])
    lines = [
        f"# Run `{run_dir.name}`",
        "",
        f"- model: {model}",
        f"- training: {s['steps']} steps, global batch {t['global_batch_size']} {unit}, "
        f"lr {t['lr']}, {t['precision']}",
        f"- parallel: {p['strategy']} on {s['world_size']} rank(s)",
    ]
    if s["val_loss_first"] is not None:
        lines.append(
            f"- validation loss: {s['val_loss_first']:.4f} at step {s['val_loss_first_step']} → "
            f"{s['val_loss_last']:.4f} at step {s['val_loss_last_step']}"
        )
    if s["val_acc_last"] is not None:
        lines.append(f"- validation accuracy (top-1): {s['val_acc_first']:.4f} → {s['val_acc_last']:.4f}")
    if s["final_train_loss"] is not None:
        lines.append(f"- final training loss: {s['final_train_loss']:.4f}")
    if s["median_rate"] is not None:
        unit = s["rate_key"].removesuffix("_per_s")
        lines.append(f"- throughput (median over logged intervals): {s['median_rate']:,.0f} {unit}/s")
    trained = training_wall_time(run_dir)
    if trained is not None:
        seconds, starts = trained
        over = f" over {starts} starts" if starts > 1 else ""
        lines.append(f"- training wall time: {seconds:.0f} s{over} (events.jsonl)")
    lineage = s["lineage"]
    if lineage:
        torch_version = (lineage.get("versions") or {}).get("torch")
        lines.append(f"- code: {lineage.get('git_sha')}, torch {torch_version}")
    lines += ["", f"![loss curve]({RunLayout.LOSS_CURVE})", ""]
    sample = RunLayout(run_dir).sample
    if sample.is_file():
        lines += ["## Sample", "", "```", sample.read_text().rstrip(), "```", ""]
    path = RunLayout(run_dir).summary
    path.write_text("\n".join(lines))
    return path
