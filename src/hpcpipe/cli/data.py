"""`hpcpipe data prepare|verify|stage`: build, reuse, check and stage datasets.

Every job's data are prepared by its recipe (``Recipe.prepare``, which reports a ``DataSummary``)
and staged by it (``Recipe.stage_source``); this module only prints. No torch on the token and
image paths: the recipes' modules import it inside the methods that need it."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from hpcpipe.cli.common import (
    ConfigArg,
    JsonOption,
    SetOption,
    console,
    err_console,
    load_job,
    print_whole,
    write_json,
)
from hpcpipe.data.tokens.shards import MANIFEST_FILE, verify_dataset
from hpcpipe.data.tokens.summary import dataset_details
from hpcpipe.errors import DataError, UserError
from hpcpipe.recipes.base import DataSummary

app = typer.Typer(
    help="Prepare token datasets (corpus -> tokenizer -> shards + manifest) and function-calling "
    "conversations (rendered, masked, packed), or check image datasets against their hash manifest; "
    "verify them; generate small image datasets in every format.",
    no_args_is_help=True,
)


@app.command("prepare")
def prepare(config: ConfigArg, sets: SetOption = None, json_out: JsonOption = None) -> None:
    """Token jobs: tokenize the data sources into hash-named shards (reused when already prepared).
    Image jobs: read the dataset, record its file hashes on first read, verify them afterwards.
    Function-calling jobs: check the model source and LoRA target modules, then render, mask and
    pack the conversations into data.prepared_dir/fc-<hash>/ (reused when already prepared): the
    same preparation as `hpcpipe run JOB --only prepare`.

    Example: hpcpipe data prepare lora-fc-tiny --json prepared.json
    """
    from hpcpipe.recipes import build_recipe

    job = load_job(config, sets)
    quiet = json_out == "-"  # standard output carries the JSON alone
    started = time.perf_counter()
    # Libraries that print on import (DeepSpeed, imported by transformers) write to stderr:
    # standard output carries the summary, or the JSON alone.
    with contextlib.redirect_stdout(sys.stderr):
        summary = build_recipe(job).prepare(progress=console.is_terminal and not quiet)
    seconds = time.perf_counter() - started
    if summary is None:
        summary = DataSummary(headline=f"run.recipe {job.run.recipe}: no data to prepare")
    if not quiet:
        console.print(f"{summary.headline} in {seconds:.1f} s", soft_wrap=True)
        if summary.columns:
            table = Table(*summary.columns, title=summary.title or None)
            for row in summary.rows:
                table.add_row(*row)
            print_whole(table)
    write_json({**summary.details, "seconds": round(seconds, 3)}, json_out)


@app.command("verify")
def verify(
    path: Annotated[
        Path,
        typer.Argument(
            help="A prepared dataset directory: tokens (manifest.json) or conversations (fc-<hash>).",
            show_default=False,
        ),
    ],
    json_out: JsonOption = None,
) -> None:
    """Check the tokenizer and every shard against the SHA-256 sums in manifest.json, or a
    function-calling directory's train.npz, eval.npz and heldout.jsonl against data_report.json."""
    from hpcpipe.data.function_calling.prepare import REPORT_FILE, verify_prepared

    if (path / REPORT_FILE).is_file():
        report = verify_prepared(path)  # DataError (exit 2) names the first bad file
        if json_out != "-":
            console.print(f"ok [bold]{path}[/] ({len(report['files'])} files, sha256 in {REPORT_FILE})")
        write_json({"path": str(path), "files": report["files"], "ok": True}, json_out)
        return
    if not (path / MANIFEST_FILE).is_file():
        raise DataError(f"{path}: not a prepared dataset (no {MANIFEST_FILE} or {REPORT_FILE})")
    dataset = verify_dataset(path)  # DataError (exit 2) names the first bad file
    if json_out != "-":
        console.print(f"ok [bold]{dataset.path}[/] (manifest sha256 {dataset.manifest_sha256[:16]})")
    write_json(dataset_details(dataset) | {"ok": True}, json_out)


@app.command("stage")
def stage(
    source: Annotated[
        Path | None,
        typer.Argument(help="A prepared token dataset directory (with manifest.json).", show_default=False),
    ] = None,
    cache_root: Annotated[
        Path | None,
        typer.Argument(
            help="Node-local cache root (default with --job: data.cache_dir).", show_default=False
        ),
    ] = None,
    job_config: Annotated[
        str | None,
        typer.Option(
            "--job",
            help="Stage the dataset this job reads (prepared or verified first) instead of SOURCE; "
            "give CACHE_ROOT as the only argument or set data.cache_dir.",
            show_default=False,
        ),
    ] = None,
    sets: SetOption = None,
    gc_days: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="Then remove cache entries unused for this many days (never one in use).",
            show_default=False,
        ),
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="Files copied and hashed in parallel.")] = 4,
    if_configured: Annotated[
        bool,
        typer.Option(
            "--if-configured",
            help="With --job: do nothing when data.cache_dir is unset (a shared init step).",
        ),
    ] = False,
    json_out: JsonOption = None,
) -> None:
    """Copy a dataset to node-local disk as CACHE_ROOT/<manifest sha256>/, verifying every file.

    A verified copy already there is reused; a damaged one is staged again; a source that does not
    match its manifest is refused. All ranks of a node may run this at once: one copies, the
    others wait. Examples:

      hpcpipe data stage data/prepared/3f2a... /mnt/nvme/hpcpipe-cache

      hpcpipe data stage --job job.yaml --set data.cache_dir=/mnt/nvme/hpcpipe-cache

    SIGTERM or SIGUSR1 (a pod's eviction) ends it with fault.preempt_exit_code (75), the copy in
    progress removed: the hpcpipe-torch runtime restarts a job on that code.
    """
    from hpcpipe.config.fault import FaultConfig

    # Until the job is loaded, the default code: a signal during the config's loading counts too.
    with _preemption_exits(FaultConfig().preempt_exit_code):
        _stage(source, cache_root, job_config, sets, gc_days, workers, if_configured, json_out)


@contextlib.contextmanager
def _preemption_exits(code: int) -> Iterator[None]:
    """SIGTERM/SIGUSR1 end the command with ``code`` in one line, as ``launch agent`` does before
    its workers start: dying of the signal (143) read as a crash, and a runtime that restarts a job
    after a preemption (hpcpipe-torch) does so on fault.preempt_exit_code only. The exception
    unwinds the copy, whose temporary directory is removed on the way out (a stager killed outright
    leaves it to the next one, which removes it under the entry's lock); a finished entry is
    only ever renamed into place whole. Ctrl-C stays an interrupt (exit 130)."""
    from hpcpipe.launch.agent import AgentPreempted, stop_early_on_preemption

    previous = stop_early_on_preemption(code)
    try:
        yield
    except AgentPreempted as exc:
        err_console.print(f"data stage: preempted, nothing staged in part; exit {exc.exit_code}")
        raise typer.Exit(exc.exit_code) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stage(
    source: Path | None,
    cache_root: Path | None,
    job_config: str | None,
    sets: list[str] | None,
    gc_days: float | None,
    workers: int,
    if_configured: bool,
    json_out: str | None,
) -> None:
    from hpcpipe.data.stage import collect_garbage, stage, token_dataset_source
    from hpcpipe.launch.agent import stop_early_on_preemption
    from hpcpipe.launch.job import stage_source

    if job_config is not None:
        job = load_job(job_config, sets)
        stop_early_on_preemption(job.fault.preempt_exit_code)  # the job's own code from here on
        cache_root = cache_root or source  # with --job the one argument is the cache root
        if if_configured and cache_root is None and job.data.cache_dir is None:
            console.print("data.cache_dir is not set: nothing to stage")
            return
        if cache_root is None and job.data.cache_dir is None:
            raise UserError("data stage --job: give CACHE_ROOT or set data.cache_dir")
        root = Path(cache_root or str(job.data.cache_dir))
        with contextlib.redirect_stdout(sys.stderr):  # libraries that print on import: stderr
            found = stage_source(job, progress=console.is_terminal and json_out != "-")
        if found is None and if_configured:
            console.print(f"run.recipe {job.run.recipe}: its data have no file manifest: nothing to stage")
            return
        if found is None:
            raise DataError(f"run.recipe {job.run.recipe}: its data have no file manifest to stage by")
        src = found
    elif source is None or cache_root is None:
        raise UserError("data stage: give SOURCE and CACHE_ROOT, or --job CONFIG [CACHE_ROOT]")
    else:
        root, src = cache_root, token_dataset_source(source)
    # Before the copy: the space it frees may be what the copy needs (the too-small-cache error
    # names this option as the remedy).
    removed = collect_garbage(root, gc_days, keep=frozenset({src.key})) if gc_days is not None else []
    staged = stage(src, root, workers=workers)
    staged.release()
    rate = staged.size_bytes / max(staged.seconds, 1e-9) / 1e6
    if json_out != "-":
        verb = "staged" if staged.copied else "verified (already staged)"
        console.print(
            f"{verb} [bold]{staged.path}[/]: {staged.size_bytes / 1e6:.1f} MB in {staged.seconds:.2f} s "
            f"({rate:.0f} MB/s)",
            soft_wrap=True,  # one line per node in a job log, however long the path
        )
        for key in removed:
            console.print(f"removed unused cache entry {key[:16]}")
    result = {
        "path": str(staged.path),
        "key": src.key,
        "copied": staged.copied,
        "bytes": staged.size_bytes,
        "seconds": round(staged.seconds, 4),
        "removed": removed,
    }
    write_json(result, json_out)


@app.command("make-images")
def make_images(
    fmt: Annotated[
        str,
        typer.Argument(
            metavar="FORMAT", help="cifar10, cifar100, cifar10-binary, cifar100-binary, idx or imagefolder."
        ),
    ],
    out: Annotated[Path, typer.Argument(help="Directory to write (use it as data.root).")],
    train: Annotated[int, typer.Option(min=1, help="Training images.")] = 512,
    test: Annotated[int, typer.Option(min=1, help="Test images.")] = 128,
    seed: Annotated[int, typer.Option(help="Seed of the generated images.")] = 0,
) -> None:
    """Write a small, valid, learnable image dataset in an on-disk format (tests, offline demos).

    Example: hpcpipe data make-images cifar10 data/generated/cifar10 && hpcpipe train resnet-tiny
    """
    from hpcpipe.data.images.generator import (
        CLASSES_FROM_FILES,
        GENERATED_FORMATS,
        GENERATED_MARKER,
        write_dataset,
    )
    from hpcpipe.errors import UserError

    if fmt not in GENERATED_FORMATS:
        raise UserError(f"FORMAT: unknown format {fmt!r} (known: {', '.join(GENERATED_FORMATS)})")
    classes = CLASSES_FROM_FILES.get(fmt, 0)
    for option, count in (("--train", train), ("--test", test)):
        if count < classes:
            raise UserError(f"{option}: {count} images cannot hold one of each of {fmt}'s {classes} classes")
    asked = {"format": fmt, "train": train, "test": test, "seed": seed}
    marker = out / GENERATED_MARKER
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        same = _generated_with(marker) == asked or (not marker.exists() and _holds_exactly(out, asked))
        if same:  # the same files again: re-running the docs' command is fine
            marker.write_text(json.dumps(asked) + "\n")
            console.print(f"{out} already holds this dataset; use --set data.root={out}")
            return
        # Writing into old files would mix two datasets under one name (the same file names, other images).
        raise UserError(f"{out}: exists and holds other files (choose a new directory, or delete it)")
    write_dataset(fmt, out, train, test, seed)
    marker.write_text(json.dumps(asked) + "\n")
    console.print(
        f"wrote {fmt} ({train} train, {test} test images) to [bold]{out}[/]; use --set data.root={out}"
    )


def _generated_with(marker: Path) -> object:
    """The options ``make-images`` wrote a directory with (None when it did not, or cannot say)."""
    try:
        return json.loads(marker.read_text())
    except (OSError, ValueError):
        return None


def _holds_exactly(out: Path, asked: dict[str, object]) -> bool:
    """``out`` holds just what these options generate (a directory made before the marker was)."""
    import filecmp
    import shutil
    import tempfile

    from hpcpipe.data.images.generator import write_dataset

    if not out.is_dir():
        return False
    fresh = Path(tempfile.mkdtemp(prefix=".make-images-", dir=out.resolve().parent))  # beside it, not in it
    try:
        write_dataset(
            str(asked["format"]),
            fresh,
            int(str(asked["train"])),
            int(str(asked["test"])),
            int(str(asked["seed"])),
        )
        names = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
        if names != sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()):
            return False
        return all(filecmp.cmp(fresh / name, out / name, shallow=False) for name in names)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
