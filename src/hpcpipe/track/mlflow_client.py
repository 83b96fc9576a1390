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

# The run directory's MLflow run on each server it reached (``recorded_run``), relative to it
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


# Schemes whose netloc is a host's name (a database's with its driver: postgresql+psycopg2),
# which DNS reads in any case. Another's is a name of its own: databricks://Prod and
# databricks://prod are two profiles of the Databricks CLI, two servers perhaps.
_HOSTNAME_SCHEMES = frozenset({"http", "https", "postgresql", "mysql", "mssql"})


def server_key(uri: str) -> str:
    """How the run's record names a server: its URI without credentials (the file is uploaded),
    without a trailing slash, and a host's name in lower case (the same server however typed)."""
    text = scrub(redact(uri))
    parts = urlsplit(text)
    if not parts.netloc:  # a path (sqlite:////abs.db): unsplit, it would lose a slash
        return text
    netloc = parts.netloc
    if parts.scheme.split("+", 1)[0] in _HOSTNAME_SCHEMES:
        user, at, host = netloc.rpartition("@")
        netloc = user + at + host.lower()
    return urlunsplit(parts._replace(netloc=netloc, path=parts.path.rstrip("/")))


def recorded_run(run_dir: Path, uri: str | None = None) -> dict[str, Any]:
    """The MLflow run (``run_id``, ``experiment_id``) a run directory logs to on the server at
    ``uri`` (empty when it never reached it); without ``uri``, on the first server it reached.

    ``tracking/mlflow.json`` holds the first server's run at its top level, with that server's
    ``tracking_uri``, and any other server's (``track sync --tracking-uri``) under ``others``: one
    run id for all, rewritten by each sync, split the run on every server. A record written
    before it named its server is the first server's candidate until a server finds its run id
    (``open_run`` then records that server). A damaged record is an error naming it: read as
    "none", the run would be split into a new MLflow run."""
    record = _read_record(run_dir)
    first: dict[str, Any] = {k: record[k] for k in ("run_id", "experiment_id") if k in record}
    owner = record.get("tracking_uri")
    if uri is None or (owner is not None and server_key(owner) == server_key(uri)):
        return first
    others = {server_key(key): dict(entry) for key, entry in record["others"].items()}
    return others.get(server_key(uri), first if owner is None else {})


def _read_record(run_dir: Path) -> dict[str, Any]:
    """The record, ``others`` always a dict (empty when absent)."""
    path = run_dir / RUN_FILE
    if not path.is_file():
        return {"others": {}}
    try:
        record = read_json_strict(path)
    except ValueError as exc:
        raise UserError(f"{exc}; delete it to start a new MLflow run for {run_dir}") from None
    others = record.setdefault("others", {})
    if not isinstance(others, dict) or not all(isinstance(v, dict) for v in others.values()):
        raise UserError(f"{path}: 'others' is not a map of tracking URIs to runs; delete it to start over")
    return record


def record_run(run_dir: Path, uri: str, run_id: str, experiment: str) -> None:
    """``run_id`` is the run directory's MLflow run on the server at ``uri``: the first server's
    (no run recorded yet, that server's, or a record that named no server and holds this id),
    else one of the others."""
    record = _read_record(run_dir)
    entry = {"run_id": run_id, "experiment_id": experiment}
    key, owner = server_key(uri), record.get("tracking_uri")
    owned = owner is not None and server_key(owner) == key
    if not record.get("run_id") or owned or (owner is None and record["run_id"] == run_id):
        record.update(entry, tracking_uri=key)
    else:  # one entry per server, whichever way an earlier record spelled it
        record["others"] = {k: v for k, v in record["others"].items() if server_key(k) != key}
        record["others"][key] = entry
    if not record["others"]:
        del record["others"]
    path = run_dir / RUN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(path)


def open_run(
    client: Any,
    uri: str,
    run_dir: Path,
    experiment: str,
    run_name: str,
    tags: dict[str, str],
    resume: bool = True,
) -> str:
    """The run directory's MLflow run on the server at ``uri`` if the server has it, else a new
    one (recorded); its id. ``tags`` are set either way: a resumed run's lineage (config hash,
    world size, hosts) is the one in force now. ``resume`` (training goes on in it) marks it
    RUNNING; a replay (``track sync``) leaves its status."""
    known = server_run(client, run_dir, uri)
    if known.get("run_id") and _on_server(client, run_dir, str(known["run_id"])):
        run_id = str(known["run_id"])
        if _read_record(run_dir).get("tracking_uri") is None:  # a record that named no server: this one's
            record_run(run_dir, uri, run_id, str(known.get("experiment_id", "")))
        if resume:
            client.update_run(run_id, status="RUNNING")
        if tags:
            from mlflow.entities import RunTag

            client.log_batch(run_id, tags=[RunTag(key, value) for key, value in tags.items()])
        return run_id
    exp = experiment_id(client, experiment)
    run_id = str(client.create_run(exp, run_name=run_name, tags=tags).info.run_id)
    record_run(run_dir, uri, run_id, exp)
    return run_id


def server_run(client: Any, run_dir: Path, uri: str) -> dict[str, Any]:
    """``recorded_run`` on the server at ``uri``; when the record has no entry for it, the recorded
    run (any server's) that this server has, recorded for it now. A server has more than one URI
    (a pod's service name, a laptop's port-forward to localhost): each got a new MLflow run."""
    known = recorded_run(run_dir, uri)
    if known.get("run_id"):
        return known
    record = _read_record(run_dir)
    for entry in (record, *record["others"].values()):
        run_id = str(entry.get("run_id") or "")
        if run_id and _on_server(client, run_dir, run_id):
            record_run(run_dir, uri, run_id, str(entry.get("experiment_id", "")))
            return {"run_id": run_id, "experiment_id": str(entry.get("experiment_id", ""))}
    return {}


def _on_server(client: Any, run_dir: Path, run_id: str) -> bool:
    """The server has the run (False: it never had it); deleted there, an error saying what to do."""
    try:
        found = client.get_run(run_id)
    except Exception as exc:
        if "RESOURCE_DOES_NOT_EXIST" not in str(exc) and "not found" not in str(exc).lower():
            raise
        return False
    if found.info.lifecycle_stage == "deleted":
        raise UserError(
            f"{run_dir}: its MLflow run {run_id} was deleted; restore it (`mlflow runs restore "
            f"--run-id {run_id}`) or delete {run_dir / RUN_FILE} to log to a new run"
        )
    return True
