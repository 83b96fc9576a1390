"""docs/reference/events.md: every kind of line in a run's events.jsonl and its fields, from
hpcpipe.observe.event_kinds (which the suite checks every written line against)."""

from __future__ import annotations

from reference_markdown import page, table

from hpcpipe.observe.event_kinds import COMMON_FIELDS, EVENT_KINDS


def build() -> str:
    body = [
        "## On every line",
        "",
        *table(("Field", "Meaning"), [(f"`{k}`", v) for k, v in COMMON_FIELDS.items()]),
        "",
    ]
    for kind, spec in sorted(EVENT_KINDS.items()):
        rows: list[tuple[object, ...]] = [(f"`{k}`", v) for k, v in spec.fields.items()]
        if spec.named_at_run_time:
            rows.append(("(named at run time)", spec.named_at_run_time))
        body += [f"## `{kind}`", "", f"{spec.meaning} Written by `{spec.writer}`.", ""]
        body += [*table(("Field", "Meaning"), rows), ""]
    intro = (
        "A run's `events.jsonl` (one JSON object per line, in the [run directory](run-directory.md)) "
        "records what happened besides the metrics: restarts, membership changes, checkpoints, "
        "recoveries, stalls, the finish. `hpcpipe launch finished`, reports, chaos checks and "
        "`hpcpipe plan goodput` read it."
    )
    return page("events.jsonl reference", intro, body)
