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


def make_client(uri: str) -> Any:
    """An ``MlflowClient`` for ``uri`` (tracking and registry); a URI MLflow has no store for (a
    scheme it does not know, a file store it refuses) is a UserError naming it. Request limits are
    set around the calls (``request_limits``), not here: the client outlives its caller's needs."""
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    try:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException
    except ImportError:
        raise UserError("MLflow is not installed: pip install 'hpcpipe[mlflow]'") from None
    caught: tuple[type[BaseException], ...] = (
        MlflowException,
        OSError,
        *_database_errors(),
    )  # a database store connects here
    try:
        return MlflowClient(tracking_uri=uri, registry_uri=uri)
    except caught as exc:
        first = (scrub(str(exc)).strip().splitlines() or [type(exc).__name__])[0][:400]
        raise UserError(
            f"MLflow tracking URI {redact(uri)} (observe.mlflow.tracking_uri, --tracking-uri or "
            f"$MLFLOW_TRACKING_URI): {first}"
        ) from None


TIMEOUT_VAR, RETRIES_VAR = "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
# The values hpcpipe has in os.environ now; any other value there is the user's, and kept.
_written: dict[str, str] = {}


@contextlib.contextmanager
def _environment(values: dict[str, str | None]) -> Iterator[None]:
    """``values`` in os.environ for the block (None: unset), each unless the user set it; then
    what was there before. MLflow reads these variables at every request, so a block is a scope:
    set for a whole process, the sink's 5 s and no retries were still there for the register step
    that ran in the same process after training."""
    saved = {key: (os.environ.get(key), _written.get(key)) for key in values}
    try:
        for key, value in values.items():
            current = os.environ.get(key)
            if current is not None and _written.get(key) != current:
                continue  # the user's
            _put(key, value, value)
        yield
    finally:
        for key, (env_value, written) in saved.items():
            _put(key, env_value, written)


def _put(key: str, value: str | None, written: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
    if written is None:
        _written.pop(key, None)
    else:
        _written[key] = written


def request_limits(timeout_s: int, retries: int) -> contextlib.AbstractContextManager[None]:
    """MLflow's requests in the block wait at most ``timeout_s`` and retry ``retries`` times,
    unless the user's environment says otherwise."""
    return _environment({TIMEOUT_VAR: str(timeout_s), RETRIES_VAR: str(retries)})


def artifact_uploads() -> contextlib.AbstractContextManager[None]:
    """MLflow's own timeout (or the user's) for the block: a server whose artifact store is remote
    answers an upload once it has passed it on, and a multi-GB export takes longer than a
    metadata call's few seconds (it failed after every retry)."""
    return _environment({TIMEOUT_VAR: None})


# What one request may take in an interactive command (the register step, track sync, models):
# MLflow's default, 120 s per attempt, left a hung server silent for minutes.
INTERACTIVE_TIMEOUT_S = 15


@contextlib.contextmanager
def server_errors(what: str) -> Iterator[None]:
    """MLflow's errors (an unreachable or hung server, a refused request, a database store that
    cannot be reached) as one line, exit 2, for the CLI. Interactive commands retry twice (MLflow's
    default, 7 with doubling backoff, takes minutes) and wait ``INTERACTIVE_TIMEOUT_S`` per
    metadata request, unless the environment says otherwise: a dead server is named within about a
    minute."""
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    try:
        from mlflow.exceptions import MlflowException
    except ImportError:
        raise UserError("MLflow is not installed: pip install 'hpcpipe[mlflow]'") from None
    caught: tuple[type[BaseException], ...] = (MlflowException, OSError, *_database_errors())
    try:
        with request_limits(INTERACTIVE_TIMEOUT_S, retries=2):
            yield
    except caught as exc:
        lines = scrub(str(exc)).strip().splitlines() or [type(exc).__name__]
        raise UserError(f"{what}: MLflow said: {lines[0][:300]}") from None


def _database_errors() -> tuple[type[Exception], ...]:
    """SQLAlchemy's errors (a database store down: a 229-line traceback), when it is installed."""
    try:
        from sqlalchemy.exc import SQLAlchemyError
    except ImportError:
        return ()
    return (SQLAlchemyError,)


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
