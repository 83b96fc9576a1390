"""What one step of ``hpcpipe run`` hands the next when each runs in its own pod (Kubeflow Pipelines).

- ``--record PATH``: after ``--only STEP``, the step's lineage record (status, input fingerprint,
  output hashes) and the run directory, as JSON: KFP keeps it as the step's output artifact.
- ``--upstream PATH``: an upstream step's record, as KFP hands it to this step. Before anything
  runs, its output hashes must equal the run directory's own record of that step: a step never
  builds on outputs other than those the pipeline recorded (another run directory, a step re-run
  behind the pipeline's back).
- ``--params PATH``: ``{"dotted.key": value}`` (Katib's best trial) applied as ``--set``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpcpipe.errors import UserError
from hpcpipe.observe.lineage import read_lineage


def write_record(run_dir: Path, step: str, path: Path) -> None:
    """The run directory's record of ``step``, as ``--record`` writes it."""
    record = read_lineage(run_dir).get("steps", {}).get(step)
    if record is None:
        raise UserError(f"--record: lineage.json in {run_dir} has no record of step {step}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"step": step, "run_dir": str(run_dir), **record}, indent=1) + "\n")
    except OSError as exc:
        raise UserError(f"--record {path}: cannot write it ({exc.strerror or exc})") from None


def check_upstream(run_dir: Path, paths: list[Path]) -> None:
    """UserError naming the record whose outputs the run directory does not hold."""
    if not paths:
        return
    steps = read_lineage(run_dir).get("steps", {})
    for path in paths:
        handed = _read_json(path, "--upstream")
        step = handed.get("step")
        if not isinstance(step, str) or "outputs" not in handed:
            raise UserError(f"--upstream {path}: not a step record (hpcpipe run --record writes them)")
        here = steps.get(step, {})
        if here.get("outputs") != handed["outputs"] or here.get("status") != handed.get("status"):
            raise UserError(
                f"--upstream {path}: the run directory {run_dir} does not hold the outputs the "
                f"pipeline's {step} step recorded (another run directory, or {step} ran again since)"
            )


def params_overrides(path: Path) -> list[str]:
    """``--params`` as ``--set KEY=VALUE`` overrides (an empty object: none)."""
    values = _read_json(path, "--params")
    return [
        f"{key}={json.dumps(value) if not isinstance(value, str) else value}" for key, value in values.items()
    ]


def _read_json(path: Path, option: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{option} {path}: unreadable ({exc})") from None
    if not isinstance(value, dict):
        raise UserError(f"{option} {path}: expected a JSON object")
    return value
