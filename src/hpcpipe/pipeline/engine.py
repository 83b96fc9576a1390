"""The pipeline engine: run each step whose inputs changed, skip the rest, record everything.

A step declares the config keys it reads and the steps whose outputs it consumes. Its input
fingerprint is the SHA-256 of those keys' values, the upstream steps' recorded output hashes and
hpcpipe's version. On each ``hpcpipe run`` a step is skipped when its record in
``lineage.json["steps"]`` is complete, carries the same fingerprint, and its outputs on disk still
hash as recorded; otherwise it runs. So a second run skips everything, a changed key re-runs the
steps downstream of it, and a step that failed runs again while the ones before it are skipped
(training itself resumes from its newest checkpoint). The code's git SHA is recorded in the
lineage but is not an input: a new commit trains anew under a new ``run.name``. A step that
refuses its input (a ``UserError``) leaves its last record as it was.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hpcpipe
from hpcpipe.checkpoint.export_record import LOCK as EXPORT_LOCK
from hpcpipe.config import JobConfig
from hpcpipe.errors import UserError
from hpcpipe.observe.lineage import read_lineage, write_lineage
from hpcpipe.pipeline.tracing import PipelineTrace, root_span, step_span

DONE, FAILED, NOT_APPLICABLE = "done", "failed", "not-applicable"


class NotApplicable(Exception):
    """Raised by a step that has nothing to do for this job (say why)."""


@dataclass
class StepContext:
    job: JobConfig
    run_dir: Path
    max_restarts: int = 0
    say: Callable[[str], None] = print
    results: dict[str, Any] = field(default_factory=dict)  # what a step hands the CLI (summary)
    # Under torchrun/srun every rank runs `hpcpipe run`: all of them run these steps every time
    # (training resumes from its checkpoint, so a finished one returns at once), none skips them
    # on its own reading of lineage.json, and only rank 0 runs the rest and records.
    group_steps: tuple[str, ...] = ()
    is_main: bool = True
    # Where training runs: "local" workers, or "k8s" (the job `launch k8s` renders, with `api`;
    # each pod stages its own node's data, so the stage step has nothing to do here).
    on: str = "local"
    api: str = "trainjob"
    # OpenTelemetry spans of this run (pipeline/tracing.py): None when observe.otel is off.
    trace: PipelineTrace | None = None


@dataclass(frozen=True)
class Step:
    name: str
    reads: tuple[str, ...]  # dotted config keys (a section name covers the whole section)
    after: tuple[str, ...]  # upstream steps whose outputs are this step's inputs
    run: Callable[[StepContext], None]
    outputs: Callable[[StepContext], dict[str, str]]  # hashes of what it produced, from disk
    describe: str
    ignores: tuple[str, ...] = ()  # dotted keys inside ``reads`` that never change its outputs


@dataclass(frozen=True)
class Decision:
    step: str
    action: str  # "run" or "skip"
    reason: str
    fingerprint: str


def config_value(tree: dict[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def step_inputs(step: Step, config: dict[str, Any], records: dict[str, Any]) -> dict[str, Any]:
    config = copy.deepcopy(config)
    for key in step.ignores:  # a launcher's timeouts retrained the whole run
        section, _, name = key.rpartition(".")
        parent = config_value(config, section)
        if isinstance(parent, dict):
            parent.pop(name, None)
    return {
        "config": {key: config_value(config, key) for key in step.reads},
        "upstream": {name: (records.get(name) or {}).get("outputs") for name in step.after},
        "hpcpipe": hpcpipe.__version__,
    }


def fingerprint(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def decide(step: Step, ctx: StepContext, records: dict[str, Any], forced: bool) -> Decision:
    """Run or skip ``step``, and why (its outputs are hashed only when all else says skip)."""
    fp = fingerprint(step_inputs(step, ctx.job.to_dict(), records))
    record = records.get(step.name) or {}
    if forced:
        return Decision(step.name, "run", "asked for (--from/--only)", fp)
    if not record:
        return Decision(step.name, "run", "never ran", fp)
    if record.get("status") == FAILED:
        return Decision(step.name, "run", "failed last time: resuming", fp)
    if record.get("fingerprint") != fp:
        changed = _changed(record.get("inputs") or {}, step_inputs(step, ctx.job.to_dict(), records))
        return Decision(step.name, "run", f"inputs changed: {changed}", fp)
    if record.get("status") == DONE and step.outputs(ctx) != record.get("outputs"):
        return Decision(step.name, "run", "outputs changed or missing on disk", fp)
    return Decision(step.name, "skip", "unchanged", fp)


def _changed(old: dict[str, Any], new: dict[str, Any]) -> str:
    names = [f"config {k}" for k, v in new["config"].items() if (old.get("config") or {}).get(k) != v]
    names += [f"{k} outputs" for k, v in new["upstream"].items() if (old.get("upstream") or {}).get(k) != v]
    if old.get("hpcpipe") != new["hpcpipe"]:
        names.append("hpcpipe version")
    return ", ".join(names) or "recorded before"


def run_pipeline(
    steps: list[Step], ctx: StepContext, start: str | None = None, only: str | None = None
) -> list[Decision]:
    """Run the steps in order (from ``start``, or ``only`` one); returns what was decided."""
    names = [s.name for s in steps]
    if start is not None and only is not None:  # --from was ignored without a word
        raise UserError("--from and --only: give one (--from STEP runs it and every later step)")
    for flag, name in (("--from", start), ("--only", only)):
        if name is not None and name not in names:
            raise UserError(f"{flag} {name}: no such step (steps: {', '.join(names)})")
    first = names.index(start) if start else 0
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    decisions = []
    trace = ctx.trace if ctx.is_main else None  # one rank traces the pipeline
    with root_span(trace, names):
        for index, step in enumerate(steps):
            records = read_lineage(ctx.run_dir).get("steps") or {}
            if (only is not None and step.name != only) or not (ctx.is_main or step.name in ctx.group_steps):
                continue
            if only is not None:
                _require_upstream(step, records)
            asked = only is not None or (start is not None and index >= first)
            forced = asked or step.name in ctx.group_steps
            decision = decide(step, ctx, records, forced=forced)
            decisions.append(decision)
            with step_span(trace, step.name, decision.action, decision.reason) as outcome:
                if decision.action == "skip":
                    ctx.say(f"skip {step.name}: {decision.reason}")
                    continue
                ctx.say(f"run  {step.name}: {decision.reason}")
                inputs = step_inputs(step, ctx.job.to_dict(), records)
                outcome(_run_step(step, ctx, inputs, decision.fingerprint))
    return decisions


def _require_upstream(step: Step, records: dict[str, Any]) -> None:
    missing = [
        name for name in step.after if (records.get(name) or {}).get("status") not in (DONE, NOT_APPLICABLE)
    ]
    if missing:
        raise UserError(
            f"--only {step.name}: run {', '.join(missing)} first (no complete record in lineage.json)"
        )


def _run_step(step: Step, ctx: StepContext, inputs: dict[str, Any], fp: str) -> str:
    """Run ``step`` and record it (rank 0); its status (DONE or NOT_APPLICABLE; raises on failure)."""
    if not ctx.is_main:
        step.run(ctx)
        return DONE
    started = time.time()
    record: dict[str, Any] = {"inputs": inputs, "fingerprint": fp, "started": started}
    try:
        step.run(ctx)
    except NotApplicable as why:
        ctx.say(f"     {step.name}: nothing to do ({why})")
        _record(
            ctx.run_dir, step.name, record | {"status": NOT_APPLICABLE, "reason": str(why), "outputs": {}}
        )
        return NOT_APPLICABLE
    except UserError:  # bad input, said in one line by the CLI: the step's last record stays true
        raise
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
        _record(ctx.run_dir, step.name, record | {"status": FAILED, "error": error, "outputs": None})
        ctx.say(f"step {step.name} failed ({error[:200]}); `hpcpipe run` again resumes at {step.name}")
        raise
    outputs = step.outputs(ctx)
    done = {"status": DONE, "outputs": outputs, "seconds": round(time.time() - started, 3)}
    _record(ctx.run_dir, step.name, record | done)
    return DONE


def _record(run_dir: Path, name: str, record: dict[str, Any]) -> None:
    """Read-modify-write: the training workers write lineage.json between steps."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lineage = read_lineage(run_dir)
    lineage.setdefault("steps", {})[name] = record
    write_lineage(run_dir, lineage)


def file_sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_sha256(root: Path) -> str | None:
    """One hash over every file under ``root`` (relative path and content) but an export's lock
    file: a register creates it in an export written before locks were files, which changed
    nothing the export step made."""
    if not root.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != EXPORT_LOCK):
        digest.update(f"{path.relative_to(root)}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()
