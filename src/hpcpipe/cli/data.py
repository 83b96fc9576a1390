"""`hpcpipe data prepare|verify`: build, reuse and check token datasets. No torch on this path."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from hpcpipe.cli.common import ConfigArg, JsonOption, SetOption, console, load_job, write_json
from hpcpipe.data.shards import SPLITS, PreparedDataset, prepare_dataset, verify_dataset

app = typer.Typer(
    help="Prepare token datasets (corpus -> tokenizer -> shards + manifest) and verify them.",
    no_args_is_help=True,
)


@app.command("prepare")
def prepare(config: ConfigArg, sets: SetOption = None, json_out: JsonOption = None) -> None:
    """Tokenize the job's data sources into hash-named shards; reuse them when already prepared."""
    job = load_job(config, sets)
    quiet = json_out == "-"  # standard output carries the JSON alone
    started = time.perf_counter()
    dataset = prepare_dataset(job.data, progress=console.is_terminal and not quiet)
    seconds = time.perf_counter() - started
    result = _summary(dataset) | {"reused": dataset.reused, "seconds": round(seconds, 3)}
    if not quiet:
        verb = "reused" if dataset.reused else "prepared"
        console.print(f"{verb} [bold]{dataset.path}[/] in {seconds:.1f} s")
        console.print(_table(dataset))
    write_json(result, json_out)


@app.command("verify")
def verify(
    path: Annotated[Path, typer.Argument(help="A prepared dataset directory.", show_default=False)],
    json_out: JsonOption = None,
) -> None:
    """Check the tokenizer and every shard against the SHA-256 sums in manifest.json."""
    dataset = verify_dataset(path)  # DataError (exit 2) names the first bad file
    if json_out != "-":
        console.print(f"ok [bold]{dataset.path}[/] (manifest sha256 {dataset.manifest_sha256[:16]})")
    write_json(_summary(dataset) | {"ok": True}, json_out)


def _summary(dataset: PreparedDataset) -> dict[str, Any]:
    manifest = dataset.manifest
    return {
        "path": str(dataset.path),
        "fingerprint": dataset.fingerprint,
        "manifest_sha256": dataset.manifest_sha256,
        "dtype": manifest["dtype"],
        "tokenizer": {key: manifest["tokenizer"][key] for key in ("kind", "name", "vocab_size", "eos_id")},
        "splits": {
            split: {
                "documents": dataset.documents(split),
                "tokens": dataset.tokens(split),
                "shards": len(dataset.shards(split)),
            }
            for split in SPLITS
        },
    }


def _table(dataset: PreparedDataset) -> Table:
    tok = dataset.manifest["tokenizer"]
    title = f"tokenizer {tok['name']} (EOS {tok['eos_id']})"
    table = Table("split", "documents", "tokens", "shards", title=title)
    for split in SPLITS:
        table.add_row(
            split,
            f"{dataset.documents(split):,}",
            f"{dataset.tokens(split):,}",
            str(len(dataset.shards(split))),
        )
    return table
