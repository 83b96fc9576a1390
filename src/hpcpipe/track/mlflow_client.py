"""An MLflow client for hpcpipe: the tracking URI resolved, credentials kept out of every log.

MLflow is an extra (``pip install 'hpcpipe[mlflow]'``), imported here lazily. The URI comes from
``observe.mlflow.tracking_uri`` (never with a password: the config refuses one) or from
``$MLFLOW_TRACKING_URI``, which may carry ``user:password@``; messages show ``redact(uri)`` only.
MLflow prints a "View run ... at <host>" line on run end, host credentials included: suppressed.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from hpcpipe.errors import UserError, hide_credentials
from hpcpipe.fsutil import read_json_strict
from hpcpipe.layout import RunLayout

# {"run_id", "experiment_id"} of the run directory, relative to it
RUN_FILE = Path(RunLayout.TRACKING, RunLayout.MLFLOW_RUN)


def scrub(text: str) -> str:
    """Error text without ``user:password@`` (MLflow puts the full request URL in its errors)."""
    return hide_credentials(text)


def redact(uri: str) -> str:
    """``uri`` without user information: http://u:p@host:5000/x -> http://host:5000/x."""
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def resolve_uri(configured: str | None) -> str:
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise UserError(
            "no MLflow tracking URI: set observe.mlflow.tracking_uri, --tracking-uri or MLFLOW_TRACKING_URI"
        )
    return uri


def make_client(uri: str, request_timeout_s: int | None = None) -> Any:
    """An ``MlflowClient`` for ``uri`` (tracking and registry); a URI MLflow has no store for (a
    scheme it does not know, a file store it refuses) is a UserError naming it."""
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    if request_timeout_s is not None:
        # Sinks: fail fast and retry on their own schedule; MLflow's default retries take minutes.
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(request_timeout_s)
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    try:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException
    except ImportError:
        raise UserError("MLflow is not installed: pip install 'hpcpipe[mlflow]'") from None
    try:
        return MlflowClient(tracking_uri=uri, registry_uri=uri)
    except MlflowException as exc:
        first = scrub(str(exc)).strip().splitlines()[0][:400]
        raise UserError(
            f"MLflow tracking URI {redact(uri)} (observe.mlflow.tracking_uri, --tracking-uri or "
            f"$MLFLOW_TRACKING_URI): {first}"
        ) from None


# What one request may take in an interactive command (the register step, track sync, models):
# MLflow's default, 120 s per attempt, left a hung server silent for minutes.
INTERACTIVE_TIMEOUT_S = 15


@contextlib.contextmanager
def server_errors(what: str) -> Iterator[None]:
    """MLflow's errors (an unreachable or hung server, a refused request) as one line, exit 2, for
    the CLI. Interactive commands retry twice (MLflow's default, 7 with doubling backoff, takes
    minutes) and wait ``INTERACTIVE_TIMEOUT_S`` per request, unless the environment says otherwise:
    a dead server is named within about a minute."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(INTERACTIVE_TIMEOUT_S))
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    try:
        from mlflow.exceptions import MlflowException
    except ImportError:
        raise UserError("MLflow is not installed: pip install 'hpcpipe[mlflow]'") from None
    try:
        yield
    except MlflowException as exc:
        first = scrub(str(exc)).strip().splitlines()[0][:300]
        raise UserError(f"{what}: MLflow said: {first}") from None


def experiment_id(client: Any, name: str) -> str:
    found = client.get_experiment_by_name(name)
    return str(found.experiment_id) if found is not None else str(client.create_experiment(name))


def recorded_run(run_dir: Path) -> dict[str, Any]:
    """The MLflow run a run directory logs to (empty when it never reached MLflow). A damaged
    record is an error naming it: read as "none", the run would be split into a new MLflow run."""
    path = run_dir / RUN_FILE
    if not path.is_file():
        return {}
    try:
        return read_json_strict(path)
    except ValueError as exc:
        raise UserError(f"{exc}; delete it to start a new MLflow run for {run_dir}") from None


def record_run(run_dir: Path, run_id: str, experiment: str) -> None:
    path = run_dir / RUN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"run_id": run_id, "experiment_id": experiment}) + "\n")
    tmp.replace(path)


def open_run(
    client: Any, run_dir: Path, experiment: str, run_name: str, tags: dict[str, str], resume: bool = True
) -> str:
    """The recorded MLflow run if the server has it, else a new one (recorded); its id. ``resume``
    (training goes on in it) marks it RUNNING; a replay (``track sync``) leaves its status."""
    known = recorded_run(run_dir).get("run_id")
    if known:
        try:
            found = client.get_run(known)
        except Exception as exc:
            if "RESOURCE_DOES_NOT_EXIST" not in str(exc) and "not found" not in str(exc).lower():
                raise
        else:
            if found.info.lifecycle_stage == "deleted":
                raise UserError(
                    f"{run_dir}: its MLflow run {known} was deleted; restore it (`mlflow runs restore "
                    f"--run-id {known}`) or delete {run_dir / RUN_FILE} to log to a new run"
                )
            if resume:
                client.update_run(known, status="RUNNING")
            return str(known)
    exp = experiment_id(client, experiment)
    run_id = str(client.create_run(exp, run_name=run_name, tags=tags).info.run_id)
    record_run(run_dir, run_id, exp)
    return run_id
