"""`hpcpipe track sync`, `hpcpipe register`, `hpcpipe models list|show` and `hpcpipe lineage`:
what stays after a run, in MLflow and in the run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hpcpipe.cli.common import JsonOption, console, print_table, write_json
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout

app = typer.Typer(help="Replay run directories into MLflow.", no_args_is_help=True)
models_app = typer.Typer(help="Read the MLflow model registry.", no_args_is_help=True)

RunDirArg = Annotated[Path, typer.Argument(help="A run directory (runs/<name>).", show_default=False)]
UriOption = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri",
        help="MLflow tracking URI (default: the run's observe.mlflow.tracking_uri, then "
        "$MLFLOW_TRACKING_URI). Credentials: MLFLOW_TRACKING_USERNAME/PASSWORD.",
        show_default=False,
    ),
]


def _run_dir(path: Path) -> Path:
    if not RunLayout(path).config.is_file():
        raise UserError(f"{path}: not a run directory (no {RunLayout.CONFIG})")
    return path


def _client(run_dir: Path | None, uri: str | None) -> Any:
    from hpcpipe.track.mlflow_client import make_client

    return make_client(_server(run_dir, uri))


def _server(run_dir: Path | None, uri: str | None) -> str:
    """The tracking URI: ``--tracking-uri``, else the run's configured one, else MLflow's default."""
    from hpcpipe.track.mlflow_client import resolve_uri

    configured = None
    if uri is None and run_dir is not None:
        from hpcpipe.config import load_config

        mlflow_cfg = load_config(RunLayout(run_dir).config).observe.mlflow
        configured = mlflow_cfg.tracking_uri if mlflow_cfg else None
    return resolve_uri(uri or configured)


@app.command("sync")
def sync(run_dir: RunDirArg, tracking_uri: UriOption = None, json_out: JsonOption = None) -> None:
    """Replay a run directory into MLflow: whatever the server lacks (parameters, tags, metric
    values by key and step, artifacts) and the status its events end with (FINISHED, KILLED
    when preempted, FAILED after a hang). Safe to repeat: a second sync sends no metric again.

    Examples:

      hpcpipe track sync runs/quickstart

      MLFLOW_TRACKING_URI=http://mlflow.internal:5000 hpcpipe track sync runs/quickstart
    """
    from hpcpipe.track.mlflow_client import server_errors
    from hpcpipe.track.sync import sync_run

    with server_errors(f"track sync {run_dir}"):
        result = sync_run(_run_dir(run_dir), tracking_uri)
    if json_out != "-":
        refused = ", ".join(result.refused)
        console.print(
            f"synced {run_dir} -> MLflow run {result.run_id}: {result.params} params, "
            f"{result.metrics} metric values, {result.artifacts} artifacts"
            + (" (finished)" if result.finished else f" (marked {result.status})" if result.status else "")
            + (f"; not sent (MLflow refuses these metric names): {refused}" if refused else "")
        )
    write_json(result.__dict__, json_out)


def register(
    run_dir: RunDirArg,
    name: Annotated[str, typer.Option("--name", help="Registered model name.", show_default=False)],
    alias: Annotated[
        list[str] | None,
        typer.Option("--alias", help="Alias for the new version (repeatable).", show_default=False),
    ] = None,
    export: Annotated[
        Path | None,
        typer.Option(help="Export directory (default: the newest checkpoint's under RUN_DIR/export)."),
    ] = None,
    tracking_uri: UriOption = None,
    json_out: JsonOption = None,
) -> None:
    """Register a run's export (Hugging Face directory or LoRA adapter) as a new version of
    NAME in the MLflow model registry, with its lineage as tags (run, git SHA, config hash,
    dataset manifest hash, evaluation metrics), and point aliases at it. The run is synced first.

    Examples:

      hpcpipe register runs/quickstart --name tiny-gpt --alias candidate

      hpcpipe models show tiny-gpt
    """
    from hpcpipe.track.mlflow_client import make_client, server_errors
    from hpcpipe.track.registry import register_run
    from hpcpipe.track.sync import sync_run

    run_dir = _run_dir(run_dir)
    with server_errors(f"register {run_dir}"):
        sync_run(run_dir, tracking_uri)
        server = _server(run_dir, tracking_uri)
        made = register_run(make_client(server), run_dir, name, list(alias or []), export, server)
    if json_out != "-":
        aliases = f" ({', '.join(made.aliases)})" if made.aliases else ""
        console.print(f"registered {made.name} version {made.version}{aliases} from {made.source}")
    write_json(made.__dict__, json_out)


@models_app.command("list")
def list_(tracking_uri: UriOption = None, json_out: JsonOption = None) -> None:
    """Registered models: name, latest version, aliases."""

    from hpcpipe.track.mlflow_client import server_errors
    from hpcpipe.track.registry import list_models

    with server_errors("models list"):
        rows = list_models(_client(None, tracking_uri))
    if json_out != "-":
        cells = [
            [
                row["name"],
                str(row["latest_version"]),
                ", ".join(f"{a}→v{v}" for a, v in sorted(row["aliases"].items())),
            ]
            for row in rows
        ]
        print_table(("model", "latest version", "aliases"), cells, typed={"model"})
    write_json(rows, json_out)


@models_app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="Registered model name.", show_default=False)],
    tracking_uri: UriOption = None,
    json_out: JsonOption = None,
) -> None:
    """Every version of NAME: aliases, source run, and the lineage tags it was registered with."""

    from hpcpipe.track.mlflow_client import server_errors
    from hpcpipe.track.registry import show_model

    with server_errors(f"models show {name}"):
        model = show_model(_client(None, tracking_uri), name)
    if json_out != "-":
        cells = []
        for v in model["versions"]:
            tags = v["tags"]
            evals = ", ".join(
                f"{k.removeprefix('eval.')} {_number(x)}" for k, x in tags.items() if k.startswith("eval.")
            )
            short = {
                k: str(tags.get(f"hpcpipe.{k}", ""))[:12]
                for k in ("git_sha", "config_hash", "dataset_manifest_sha256")
            }
            run = tags.get("hpcpipe.run", "")
            cells.append([str(v["version"]), ", ".join(v["aliases"]), run, *short.values(), evals])
        headers = ("version", "aliases", "run", "git sha", "config", "dataset", "eval")
        print_table(headers, cells, typed={"version", "run"})
    write_json(model, json_out)


def _number(text: str) -> str:
    """An eval tag's value, shortened when it is a number (a tag is any text)."""
    try:
        return f"{float(text):.4g}"
    except ValueError:
        return text
