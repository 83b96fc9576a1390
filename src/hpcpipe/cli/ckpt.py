"""`hpcpipe ckpt list|verify|export`: inspect, check and convert checkpoints. Thin: the work is in
``hpcpipe.checkpoint``; torch is imported by ``export`` only."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from hpcpipe.cli.common import JsonOption, console, err_console, print_table, write_json
from hpcpipe.errors import UserError, one_line
from hpcpipe.layout import RunLayout

app = typer.Typer(
    help="List, verify (SHA-256 or BLAKE3 hashes against the manifest) and export "
    "(safetensors, Hugging Face) checkpoints.",
    no_args_is_help=True,
)

PathArg = Annotated[
    Path,
    typer.Argument(
        show_default=False,
        help="A run directory, its checkpoints directory, or one checkpoint (step-NNNNNNNN).",
    ),
]


@app.command("list")
def list_checkpoints(
    run_dir: PathArg,
    json_out: JsonOption = None,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Hash every file.")] = True,
) -> None:
    """List committed checkpoints of both tiers: step, size, files, verified, tier."""
    rows = [_describe(tier, path, verify) for tier, path in _checkpoints(run_dir)]
    if json_out != "-":
        cells = []
        for row in rows:
            ok = {True: "[green]yes[/]", False: f"[red]no[/]: {row['problem']}", None: "-"}[row["verified"]]
            cells.append(
                [str(row["step"]), row["tier"], _size(row["bytes"]), str(row["files"]), ok, row["path"]]
            )
        headers = ("step", "tier", "size", "files", "verified", "path")
        print_table(headers, cells, typed={"step", "path"})
    write_json(rows, json_out)


@app.command("verify")
def verify_checkpoints(path: PathArg, json_out: JsonOption = None) -> None:
    """Check every file against manifest.json; exit 1 naming each mismatch, 0 when all verify."""
    from hpcpipe.checkpoint.manifest import verify_dir

    results = []
    for tier, ckpt in _checkpoints(path):
        _, problems = verify_dir(ckpt)
        results.append(
            {"path": str(ckpt), "tier": tier, "ok": not problems, "problems": [p.to_dict() for p in problems]}
        )
        if json_out != "-":
            for problem in problems:
                err_console.print(
                    f"FAIL {ckpt / problem.file}: {problem.reason}"
                    + (f" (expected {problem.expected}, found {problem.actual})" if problem.expected else ""),
                    markup=False,
                    highlight=False,
                )
            if not problems:
                console.print(f"ok {ckpt}", markup=False, highlight=False)
    write_json(results, json_out)
    if not all(r["ok"] for r in results):
        raise typer.Exit(1)


@app.command("newest")
def newest_step(run_dir: PathArg) -> None:
    """Print the newest committed checkpoint's step, 0 when there is none (for scripts: the
    Slurm script compares it before and after a run to decide whether a requeue makes sense)."""
    from hpcpipe.checkpoint.manifest import MANIFEST_NAME, parse_step

    if not run_dir.is_dir():  # a typo must not read as "no progress" to the requeue decision
        raise UserError(f"{run_dir}: not a run directory")
    step = parse_step(run_dir.resolve().name)  # `.` inside a checkpoint: its own name
    if (run_dir / MANIFEST_NAME).is_file() or step is not None:  # one checkpoint: its own step
        if step is None:
            raise UserError(f"{run_dir}: a checkpoint, but not named step-NNNNNNNN")
        if not (run_dir / MANIFEST_NAME).is_file():
            raise UserError(f"{run_dir}: not a committed checkpoint ({MANIFEST_NAME} is not a file)")
        print(step)
        return
    steps = [0, *(step for tier in _tiers(run_dir) for step, _ in tier.committed())]
    print(max(steps))


@app.command("export")
def export(
    path: Annotated[Path, typer.Argument(show_default=False, help="One checkpoint (step-NNNNNNNN).")],
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            "-f",
            help="One of the run's recipe's export formats (`hpcpipe recipes show NAME`); default: "
            "its first. gpt: hf (a Hugging Face model directory) or safetensors (hpcpipe's state "
            "dict); lora-function-calling: adapter (peft) or merged (adapter folded into the base).",
            show_default=False,
        ),
    ] = None,
    dtype: Annotated[
        Literal["fp32", "bf16"],
        typer.Option(
            "--dtype",
            help="dtype of the written weights: the fp32 master weights, rounded once (a LoRA merge "
            "itself runs in fp32).",
        ),
    ] = "fp32",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Output directory (default: <run_dir>/export/<step>-<format>): new, empty, or "
            "holding an earlier export only, whose files are replaced.",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="The run's config.yaml (default: <run_dir>/config.yaml).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Export a checkpoint (verified first) for inference or sharing.

    Examples:

      hpcpipe ckpt export runs/quickstart/checkpoints/step-00000100 --format hf

      hpcpipe ckpt export runs/lora-fc-smollm2/checkpoints/step-00000150 --format merged --dtype bf16

      python -c "from transformers import AutoModelForCausalLM as M; M.from_pretrained('DIR')"
    """
    from hpcpipe.checkpoint.export import find_job_config
    from hpcpipe.checkpoint.manifest import MANIFEST_NAME
    from hpcpipe.config import load_config
    from hpcpipe.recipes.export import default_export, export_checkpoint

    if not (path / MANIFEST_NAME).is_file():
        raise UserError(f"{path}: not a committed checkpoint (no {MANIFEST_NAME})")
    job_config = config or find_job_config(path)
    fmt = fmt or default_export(load_config(job_config))
    # The run's own export/: the directory of the run's config.yaml, wherever the checkpoint
    # lies (a durable tier, a checkpoint.dir of its own), else the checkpoint's run directory.
    layout = RunLayout(job_config.resolve().parent)  # a run's config.yaml: beside what a run leaves
    ran_there = layout.lineage.is_file() or layout.metrics.is_file() or layout.checkpoints.is_dir()
    is_a_run = layout.config == job_config.resolve() and ran_there  # not any file named config.yaml
    run = job_config.resolve().parent if is_a_run else path.resolve().parent.parent
    target = out or RunLayout(run).export_dir(path.resolve().name, fmt)
    written = export_checkpoint(path, fmt, target, config, dtype)
    console.print(f"[green]exported[/] {path} -> {written} ({fmt})")


def _checkpoints(path: Path) -> list[tuple[str, Path]]:
    """(tier, directory) of the committed checkpoints PATH names; UserError (exit 2) if none."""
    from hpcpipe.checkpoint.manifest import MANIFEST_NAME, parse_step

    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    if (path / MANIFEST_NAME).is_file() or parse_step(path.resolve().name) is not None:
        return [("-", path)]
    found = [(tier.name, ckpt) for tier in _tiers(path) for _, ckpt in tier.committed()]
    if not found:
        raise UserError(f"{path}: no committed checkpoints (step-NNNNNNNN directories)")
    return found


def _tiers(path: Path) -> list[Any]:
    """A run directory's tiers (from its config.yaml when there is one), or PATH as one tier."""
    from hpcpipe.checkpoint.tiers import Tier, fast_root
    from hpcpipe.fsutil import read_json_object

    layout = RunLayout(path)
    if not layout.config.is_file():
        return [Tier("fast", layout.checkpoints if layout.checkpoints.is_dir() else path)]
    cfg = _checkpoint_section(layout.config)
    # Relative directories are relative to where the run started (lineage), not to here: from
    # elsewhere, `newest` printed 0 and `list` found nothing.
    started_in = Path(str(read_json_object(layout.lineage).get("working_dir") or "."))
    tiers = [Tier("fast", started_in / fast_root(cfg.dir, path) if cfg.dir else fast_root(None, path))]
    if cfg.durable_dir:
        tiers.append(Tier("durable", started_in / cfg.durable_dir))
    return tiers


def _checkpoint_section(config: Path) -> Any:
    """The run's ``checkpoint:`` section alone: loading the whole config imports the recipe's
    module (from another directory, or without its package, `ckpt list` failed on it)."""
    from pydantic import ValidationError

    from hpcpipe.config.checkpoint import CheckpointConfig
    from hpcpipe.yamlfile import read_yaml_file

    raw = read_yaml_file(config, "run's config")
    section = raw.get("checkpoint") if isinstance(raw, dict) else None
    try:
        return CheckpointConfig.model_validate(section or {})
    except ValidationError as exc:
        raise UserError(f"{config}: checkpoint: {one_line(str(exc.errors()[0]['msg']))}") from None


def _describe(tier: str, path: Path, verify: bool) -> dict[str, Any]:
    from hpcpipe.checkpoint.manifest import CheckpointError, parse_step, read_manifest, verify_dir

    row: dict[str, Any] = {
        "path": str(path),
        "tier": tier,
        "step": parse_step(path.resolve().name),
        "bytes": None,
        "files": None,
        "verified": None,
        "problem": None,
    }
    try:
        manifest = read_manifest(path)
        row.update(step=manifest.step, bytes=manifest.total_bytes, files=len(manifest.files))
    except CheckpointError as exc:
        row.update(verified=False, problem=str(exc))
        return row
    if verify:
        _, problems = verify_dir(path)
        row.update(verified=not problems, problem=str(problems[0]) if problems else None)
    return row


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KB", "MB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"
