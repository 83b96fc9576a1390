"""``lineage.json`` read back by the tools that show it (``hpcpipe lineage``, reports): the record,
with the shape hpcpipe writes, or one line naming the file and the first field that differs.

Apart from ``observe/lineage.py`` (which writes it and imports torch for the versions) so that
reading a run costs no torch import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcpipe.errors import UserError
from hpcpipe.fsutil import read_json_strict

FOREIGN = "not a lineage record hpcpipe wrote"


def read_checked_lineage(path: Path) -> dict[str, Any]:
    """The record at ``path`` (a damaged or foreign file: UserError naming it and the field)."""
    try:
        record = read_json_strict(path)
    except ValueError as exc:
        raise UserError(f"{exc} ({FOREIGN})") from None
    problem = shape_problem(record)
    if problem:
        raise UserError(f"{path}: {problem} ({FOREIGN})")
    return record


def shape_problem(record: dict[str, Any]) -> str | None:
    """The first field whose type differs from what hpcpipe writes (a damaged or foreign file)."""
    fields: list[tuple[str, Any, type]] = [
        ("versions", record.get("versions"), dict),
        ("hosts", record.get("hosts"), list),
        ("steps", record.get("steps"), dict),
    ]
    steps = record.get("steps")
    for name, rec in (steps if isinstance(steps, dict) else {}).items():
        fields.append((f"steps.{name}", rec, dict))
        inputs = rec.get("inputs") if isinstance(rec, dict) else None
        if isinstance(rec, dict):
            fields += [
                (f"steps.{name}.inputs", inputs, dict),
                (f"steps.{name}.outputs", rec.get("outputs"), dict),
            ]
        if isinstance(inputs, dict):
            upstream = inputs.get("upstream")
            fields += [(f"steps.{name}.inputs.config", inputs.get("config"), dict)]
            fields += [(f"steps.{name}.inputs.upstream", upstream, dict)]
            for key, value in (upstream if isinstance(upstream, dict) else {}).items():
                fields.append((f"steps.{name}.inputs.upstream.{key}", value, dict))
    for key, value, kind in fields:
        if value is not None and not isinstance(value, kind):
            return f"{key} is a {type(value).__name__}, expected a {kind.__name__}"
    return None
