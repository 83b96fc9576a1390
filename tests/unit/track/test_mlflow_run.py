"""Tracking pieces without a server: credentials never shown, config rules, the MLflow sink's
bounded queue and bounded close against an address where nothing listens, a failing sink."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from hpcpipe.config import load_config
from hpcpipe.config.observe import MlflowConfig
from hpcpipe.errors import ConfigError
from hpcpipe.netutil import free_port
from hpcpipe.track.mlflow_client import redact, scrub
from hpcpipe.track.mlflow_run import MlflowSink, metric_values, refused_names
from hpcpipe.track.params import flatten
from hpcpipe.track.sinks import Trackers


def test_credentials_are_taken_out_of_uris_and_error_text() -> None:
    assert redact("http://alice:s3cret@mlflow:5000/x") == "http://mlflow:5000/x"
    assert redact("sqlite:///tmp/m.db") == "sqlite:///tmp/m.db"
    text = "API request to http://alice:s3cret@127.0.0.1:5000/api/2.0/mlflow/runs/log-batch failed"
    assert "s3cret" not in scrub(text) and "alice" not in scrub(text)
    assert "http://127.0.0.1:5000/api" in scrub(text)


def test_a_password_in_the_config_is_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"observe\.mlflow\.tracking_uri.*MLFLOW_TRACKING_PASSWORD"):
        load_config("tiny", ["observe.mlflow.tracking_uri=http://alice:s3cret@host:5000"])
    job = load_config("tiny", ["observe.mlflow.experiment=exp"])  # a key turns the section on
    assert job.observe.mlflow is not None and job.observe.mlflow.tracking_uri is None


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("https://dapi0123secrettoken@mlflow.example.com", "holds a user part"),  # a token as the user
        ("https://mlflow.example.com/?token=dapi0123secrettoken", "holds a secret (token=)"),
        ("http://h:5000?api_key=k3y", "holds a secret (api_key=)"),
        ("http:///x", "no host"),
        ("http://h:99999", "bad port"),
    ],
)
def test_a_tracking_uri_mlflow_cannot_use_or_that_holds_a_secret_is_refused(uri: str, says: str) -> None:
    """A token in the user part or the query was saved in config.yaml and logged as a param; an
    unknown scheme failed the train step with MLflow's 90-line traceback."""
    with pytest.raises(ConfigError, match=r"observe\.mlflow\.tracking_uri") as refused:
        load_config("tiny", [f"observe.mlflow.tracking_uri={uri}"])
    assert says in str(refused.value) and "dapi0123" not in str(refused.value)
    assert "k3y" not in str(refused.value)
    for fine in (
        "sqlite:///tmp/m.db",
        "https://h:5000/p?x=1",
        "databricks",
        "postgresql+psycopg2://h/db",
        "./mlruns",
    ):
        assert load_config("tiny", [f"observe.mlflow.tracking_uri={fine}"]).observe.mlflow is not None


@pytest.mark.parametrize(
    "uri",
    [
        "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/x",  # MLflow plugins' stores
        "azureml://eastus.api.azureml.ms/mlflow/v1.0/subscriptions/s/resourceGroups/g",
        "foo://bar",  # one MLflow has no store for: named in one line by make_client, at use
        "postgresql://mlflow@db.internal/mlflow",  # a database user, no password
        "mysql+pymysql://mlflow@db/mlflow",
    ],
)
def test_a_tracking_uri_mlflow_may_take_loads(uri: str) -> None:
    """Every scheme outside a fixed list was refused, plugin stores MLflow takes included; a
    database user name was refused with advice (MLFLOW_TRACKING_USERNAME) SQLAlchemy ignores."""
    assert load_config("tiny", [f"observe.mlflow.tracking_uri={uri}"]).observe.mlflow is not None


def test_a_database_password_is_refused_with_advice_that_applies() -> None:
    with pytest.raises(
        ConfigError, match=r"holds a password \(user:password@\).*\$MLFLOW_TRACKING_URI"
    ) as no:
        load_config("tiny", ["observe.mlflow.tracking_uri=postgresql://mlflow:s3cret@db/mlflow"])
    assert "s3cret" not in str(no.value) and "MLFLOW_TRACKING_USERNAME" not in str(no.value)


def test_a_uri_mlflow_has_no_store_for_is_one_line_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """From $MLFLOW_TRACKING_URI or --tracking-uri (the config checks its own): MlflowClient()
    raised UnsupportedModelRegistryStoreURIException through the CLI."""
    from hpcpipe.errors import UserError
    from hpcpipe.track.mlflow_client import make_client

    with pytest.raises(
        UserError, match=r"MLflow tracking URI foo://h \(observe\.mlflow\.tracking_uri.*unsupported"
    ):
        make_client("foo://al:pw@h")


def test_rows_become_metric_values_and_configs_flat_params() -> None:
    values = metric_values({"step": 7, "loss": 2.5, "lr": 1e-3, "note": "x", "finite": True})
    assert [(k, v, s) for k, v, _, s in values] == [("loss", 2.5, 7), ("lr", 1e-3, 7)]
    assert flatten({"train": {"lr": 0.1, "betas": [0.9, 0.95]}, "lora": {}}) == {
        "train.lr": 0.1, "train.betas": [0.9, 0.95], "lora": {},
    }  # fmt: skip


def test_names_mlflow_refuses_are_kept_out_of_every_batch() -> None:
    """One refused name failed the whole batch: no value of any metric reached MLflow, ever."""
    row = {"step": 3, "loss": 1.0, "acc@1": 0.5, "top/5": 0.7, "../x": 1.0, "a b-c.d": 2.0, "val:acc": 0.1}
    row["x" * 251] = 1.0  # too long for MLflow
    assert [k for k, *_ in metric_values(row)] == ["loss", "top/5", "a b-c.d", "val:acc"]
    assert refused_names(row) == ["acc@1", "../x", "x" * 251]
    assert metric_values({"loss": 1.0}) == [] and metric_values({"step": "3", "loss": 1.0}) == []


def test_registry_input_is_checked_before_anything_is_created(tmp_path: Path) -> None:
    """A refused alias left a new version behind on every retry; a missing export registered an
    empty model with exit 0."""
    from hpcpipe.errors import UserError
    from hpcpipe.track.registry import register_run

    with pytest.raises(ConfigError, match="alias 'latest' is reserved"):
        load_config("tiny", ["pipeline.aliases=[candidate, latest]"])
    with pytest.raises(ConfigError, match="alias 'a b': only letters"):
        load_config("tiny", ["pipeline.aliases=[a b]"])
    export = tmp_path / "export" / "10-hf"
    with pytest.raises(UserError, match="10-hf: not an export directory"):
        register_run(None, tmp_path, "m", [], export)
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    with pytest.raises(UserError, match="alias 'V2' is reserved"):
        register_run(None, tmp_path, "m", ["V2"], export)  # the client is never reached


def test_a_damaged_run_record_is_named_not_replaced(tmp_path: Path) -> None:
    """Read as 'no record', a damaged tracking/mlflow.json split the run into a new MLflow run."""
    from hpcpipe.errors import UserError
    from hpcpipe.track.mlflow_client import record_run, recorded_run

    assert recorded_run(tmp_path) == {}
    record_run(tmp_path, "sqlite:///m.db", "abc", "1")
    assert recorded_run(tmp_path) == {"run_id": "abc", "experiment_id": "1"}
    record = tmp_path / "tracking" / "mlflow.json"
    record.write_text('{"run_id": "ab')
    with pytest.raises(UserError, match=r"mlflow\.json: not valid JSON.*delete it"):
        recorded_run(tmp_path)


def test_an_unreachable_server_never_blocks_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    # Credentials may come with the environment's URI (never the config's): never shown.
    dead = free_port()  # closed again: nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://bob:pw@127.0.0.1:{dead}")
    cfg = MlflowConfig(queue_size=100, close_timeout_s=1)
    config: dict[str, Any] = load_config("tiny").to_dict()
    with caplog.at_level(logging.WARNING, logger="hpcpipe.track"):
        sink = MlflowSink(cfg, tmp_path, "r", config)
        started = time.perf_counter()
        for step in range(1, 51):
            sink.on_row({"step": step, "loss": 1.0, "lr": 0.1, "grad_norm": 0.5})  # 150 values > 100
        rows_s = time.perf_counter() - started
        started = time.perf_counter()
        sink.close(finished=True)
        close_s = time.perf_counter() - started
    assert rows_s < 0.5 and close_s < 3
    assert sink.dropped >= 50
    text = caplog.text
    assert "queue full" in text and "hpcpipe track sync" in text
    assert "pw@" not in text and "bob" not in text


class _Broken:
    def on_row(self, row: dict[str, Any]) -> None:
        raise OSError("disk full")

    def on_event(self, kind: str, fields: dict[str, Any]) -> None: ...
    def close(self, finished: bool) -> None: ...


class _Counting(_Broken):
    def __init__(self) -> None:
        self.rows = 0

    def on_row(self, row: dict[str, Any]) -> None:
        self.rows += 1


def test_a_failing_sink_is_dropped_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    good = _Counting()
    trackers = Trackers([_Broken(), good])
    with caplog.at_level(logging.WARNING, logger="hpcpipe.track"):
        trackers.on_row({"step": 1})
        trackers.on_row({"step": 2})
    assert good.rows == 2 and caplog.text.count("_Broken stopped: disk full") == 1


def test_a_replay_leaves_the_runs_status_and_a_deleted_run_is_named(tmp_path: Path) -> None:
    """`track sync` marked a FAILED run RUNNING for good; a deleted one failed every sync with
    MLflow's 'must be in the active state'."""
    from types import SimpleNamespace

    from hpcpipe.errors import UserError
    from hpcpipe.track.mlflow_client import open_run, record_run

    class Client:
        def __init__(self, stage: str) -> None:
            self.stage, self.updates = stage, list[str]()

        def get_run(self, run_id: str) -> Any:
            return SimpleNamespace(info=SimpleNamespace(lifecycle_stage=self.stage))

        def update_run(self, run_id: str, status: str) -> None:
            self.updates.append(status)

    record_run(tmp_path, "u", "r1", "0")
    client = Client("active")
    assert open_run(client, "u", tmp_path, "e", "n", {}, resume=False) == "r1" and client.updates == []
    assert open_run(client, "u", tmp_path, "e", "n", {}) == "r1" and client.updates == ["RUNNING"]
    with pytest.raises(UserError, match="r1 was deleted; restore it"):
        open_run(Client("deleted"), "u", tmp_path, "e", "n", {})


class _Server:
    """One MLflow server's runs, as the tracking code calls them (run ids start with its name)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tags: dict[str, dict[str, str]] = {}  # run id -> its tags
        self.statuses: dict[str, str] = {}

    def get_run(self, run_id: str) -> Any:
        from types import SimpleNamespace

        if run_id not in self.tags:
            raise RuntimeError(f"RESOURCE_DOES_NOT_EXIST: Run '{run_id}' not found")
        data = SimpleNamespace(params={}, tags=dict(self.tags[run_id]))
        return SimpleNamespace(info=SimpleNamespace(lifecycle_stage="active", run_id=run_id), data=data)

    def get_experiment_by_name(self, name: str) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(experiment_id="1")

    def create_run(self, experiment_id: str, run_name: str, tags: dict[str, str]) -> Any:
        from types import SimpleNamespace

        run_id = f"{self.name}{len(self.tags)}"
        self.tags[run_id] = dict(tags)
        return SimpleNamespace(info=SimpleNamespace(run_id=run_id))

    def update_run(self, run_id: str, status: str) -> None:
        self.statuses[run_id] = status

    def log_batch(self, run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> None:
        self.tags[run_id].update({t.key: t.value for t in tags})

    def set_terminated(self, run_id: str, status: str) -> None:
        self.statuses[run_id] = status


def test_each_tracking_server_keeps_its_own_run(tmp_path: Path) -> None:
    """`track sync --tracking-uri OTHER` rewrote tracking/mlflow.json with the other server's run:
    the next sync or resume on the first server started yet another MLflow run there."""
    import json

    from hpcpipe.track.mlflow_client import open_run, recorded_run

    first, other = _Server("a"), _Server("b")
    a_uri, b_uri = "http://al:s3cret@a:5000", "sqlite:////tmp/other.db"
    for _ in range(2):
        assert open_run(first, a_uri, tmp_path, "e", "n", {}, resume=False) == "a0"
        assert open_run(other, b_uri, tmp_path, "e", "n", {}, resume=False) == "b0"
    assert list(first.tags) == ["a0"] and list(other.tags) == ["b0"]
    assert recorded_run(tmp_path, b_uri) == {"run_id": "b0", "experiment_id": "1"}
    assert recorded_run(tmp_path) == {"run_id": "a0", "experiment_id": "1"}  # the first server's
    record = json.loads((tmp_path / "tracking" / "mlflow.json").read_text())
    assert record["tracking_uri"] == "http://a:5000" and list(record["others"]) == [b_uri]


def test_a_record_that_names_no_server_belongs_to_the_first_that_finds_its_run(tmp_path: Path) -> None:
    """tracking/mlflow.json written before records named their server stays readable."""
    import json

    from hpcpipe.track.mlflow_client import open_run

    record = tmp_path / "tracking" / "mlflow.json"
    record.parent.mkdir()
    record.write_text('{"run_id": "a0", "experiment_id": "1"}')
    first, other = _Server("a"), _Server("b")
    first.tags["a0"] = {}
    assert open_run(other, "sqlite:///b.db", tmp_path, "e", "n", {}) == "b0"  # not its run: a new one
    assert json.loads(record.read_text())["run_id"] == "a0"  # the record still waits for its server
    assert open_run(first, "sqlite:///a.db", tmp_path, "e", "n", {}) == "a0"
    assert open_run(other, "sqlite:///b.db", tmp_path, "e", "n", {}) == "b0"
    assert json.loads(record.read_text()) == {
        "run_id": "a0", "experiment_id": "1", "tracking_uri": "sqlite:///a.db",
        "others": {"sqlite:///b.db": {"run_id": "b0", "experiment_id": "1"}},
    }  # fmt: skip


def test_a_server_reached_by_another_uri_goes_on_in_its_run(tmp_path: Path) -> None:
    """The record is keyed by URI text: the pod's service name, then a laptop's port-forward (or
    a trailing slash) to the same server got a second MLflow run there."""
    import json

    from hpcpipe.track.mlflow_client import open_run, recorded_run

    server, other = _Server("a"), _Server("b")
    assert open_run(server, "http://mlflow.mlflow.svc:5000", tmp_path, "e", "n", {}) == "a0"
    assert open_run(other, "sqlite:////tmp/b.db", tmp_path, "e", "n", {}) == "b0"  # not on b: its own
    assert open_run(server, "http://MLflow.mlflow.svc:5000/", tmp_path, "e", "n", {}) == "a0"
    assert open_run(server, "http://localhost:5000", tmp_path, "e", "n", {}) == "a0"
    assert open_run(other, "sqlite:////tmp/x/../b.db", tmp_path, "e", "n", {}) == "b0"
    assert list(server.tags) == ["a0"] and list(other.tags) == ["b0"]
    assert recorded_run(tmp_path, "http://localhost:5000/") == {"run_id": "a0", "experiment_id": "1"}
    record = json.loads((tmp_path / "tracking" / "mlflow.json").read_text())
    assert record["tracking_uri"] == "http://mlflow.mlflow.svc:5000"
    assert list(record["others"]) == [
        "sqlite:////tmp/b.db",
        "http://localhost:5000",
        "sqlite:////tmp/x/../b.db",
    ]


def test_only_a_hosts_name_is_read_in_any_case(tmp_path: Path) -> None:
    """Every URI's netloc was lower-cased: databricks://Prod and databricks://prod, two profiles
    (perhaps two workspaces), were one server, and the second went on in the first's run."""
    from hpcpipe.track.mlflow_client import open_run, server_key

    prod, staging = _Server("a"), _Server("b")
    assert open_run(prod, "databricks://Prod", tmp_path, "e", "n", {}) == "a0"
    assert open_run(staging, "databricks://prod", tmp_path, "e", "n", {}) == "b0"
    assert server_key("databricks://Prod/") == "databricks://Prod"
    assert (
        server_key("postgresql+psycopg2://DB.Example:5432/mlflow")
        == "postgresql+psycopg2://db.example:5432/mlflow"
    )
    assert server_key("HTTPS://MLflow.svc/") == "https://mlflow.svc"


def test_a_resumed_run_gets_the_lineage_tags_in_force_now(tmp_path: Path) -> None:
    """Tags went only to create_run: a run resumed on 4 ranks with another config kept
    hpcpipe.world_size 1 and the first config_hash in MLflow."""
    pytest.importorskip("mlflow")
    from hpcpipe.track.mlflow_client import open_run

    server = _Server("a")
    started = {"hpcpipe.config_hash": "c1", "hpcpipe.world_size": "1", "hpcpipe.recipe": "gpt"}
    assert open_run(server, "u", tmp_path, "e", "n", started) == "a0"
    resumed = {"hpcpipe.config_hash": "c2", "hpcpipe.world_size": "4", "hpcpipe.recipe": "gpt"}
    assert open_run(server, "u", tmp_path, "e", "n", resumed) == "a0"
    assert server.tags["a0"] == resumed and server.statuses == {"a0": "RUNNING"}


@pytest.mark.parametrize(
    ("event", "status"), [("preempted", "KILLED"), ("pruned", "KILLED"), (None, "FAILED")]
)
def test_a_preempted_run_ends_killed_and_a_crashed_one_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, event: str | None, status: str
) -> None:
    """close(finished=False) marked a preemption FAILED, as a crash."""
    pytest.importorskip("mlflow")
    from hpcpipe.track import mlflow_run

    monkeypatch.setattr(mlflow_run, "BATCH_WINDOW_S", 0.01)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///unused.db")
    monkeypatch.setattr(mlflow_run, "make_client", lambda uri: _Server("a"))
    sink = MlflowSink(MlflowConfig(close_timeout_s=5), tmp_path, "r", {"run": {"recipe": "gpt"}})
    sink.on_row({"step": 1, "loss": 1.0})
    if event is not None:
        sink.on_event(event, {"step": 1})
    sink.close(finished=False)
    assert sink.client.statuses == {"a0": status}


def test_interactive_commands_wait_a_short_time_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's default, 120 s per attempt, left the register step and `track sync` silent for
    minutes on a hung server; a timeout the user set is kept."""
    import os

    from hpcpipe.track.mlflow_client import INTERACTIVE_TIMEOUT_S, server_errors

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    with server_errors("probe"):
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == str(INTERACTIVE_TIMEOUT_S) == "15"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "300")
    with server_errors("probe"):
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "300"


def test_the_sinks_short_limits_do_not_outlive_its_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nproc 1 the register step runs in the training process: the sink's 5 s and no retries
    stayed in os.environ, and server_errors kept them as if the user had set them."""
    import os

    from hpcpipe.track.mlflow_client import RETRIES_VAR, TIMEOUT_VAR, request_limits, server_errors

    for var in (TIMEOUT_VAR, RETRIES_VAR):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    sink = MlflowSink(MlflowConfig(close_timeout_s=0.5), tmp_path, "r", load_config("tiny").to_dict())
    sink.on_row({"step": 1, "loss": 1.0})
    sink.close(finished=True)
    with request_limits(5, retries=0):  # what the sink sets around each request
        with server_errors("register step"):
            assert (os.environ[TIMEOUT_VAR], os.environ[RETRIES_VAR]) == ("15", "2")
        assert os.environ[TIMEOUT_VAR] == "5"
    assert TIMEOUT_VAR not in os.environ and RETRIES_VAR not in os.environ
    monkeypatch.setenv(RETRIES_VAR, "4")  # the user's: kept inside, and after
    with request_limits(5, retries=0):
        assert (os.environ[TIMEOUT_VAR], os.environ[RETRIES_VAR]) == ("5", "4")
    assert os.environ[RETRIES_VAR] == "4"


def test_artifact_uploads_wait_mlflows_time_not_a_metadata_calls(tmp_path: Path) -> None:
    """A multi-GB export through a server with a remote artifact store answers after the upload:
    the 15 s per request of the register step failed it after every retry."""
    import os
    from types import SimpleNamespace

    from hpcpipe.track.artifacts import log_run_artifacts
    from hpcpipe.track.mlflow_client import TIMEOUT_VAR, server_errors
    from hpcpipe.track.registry import register_run

    class Client:
        def __init__(self) -> None:
            self.seen: list[tuple[str, str | None]] = []

        def __getattr__(self, name: str) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                self.seen.append((name, os.environ.get(TIMEOUT_VAR)))
                return SimpleNamespace(version=1)

            return call

    (tmp_path / "config.yaml").write_text("run: {}\n")
    export = tmp_path / "export" / "10-hf"
    export.mkdir(parents=True)
    (export / "model.safetensors").write_text("x")
    (export / ".hpcpipe-export").write_text('{"checkpoint": "step-10", "files": ["model.safetensors"]}')
    (tmp_path / "tracking").mkdir()
    (tmp_path / "tracking" / "mlflow.json").write_text('{"run_id": "r1", "experiment_id": "0"}')
    client = Client()
    with server_errors("register step"):
        log_run_artifacts(client, "r1", tmp_path)
        register_run(client, tmp_path, "m", [], export)
        assert os.environ[TIMEOUT_VAR] == "15"
    uploads = [timeout for name, timeout in client.seen if name.startswith("log_artifact")]
    others = {timeout for name, timeout in client.seen if not name.startswith("log_artifact")}
    assert len(uploads) == 2 and set(uploads) == {os.environ.get(TIMEOUT_VAR)} and others == {"15"}


def test_a_database_store_that_cannot_be_reached_is_one_line(tmp_path: Path) -> None:
    """`track sync RUN --tracking-uri postgresql://127.0.0.1:1/x` printed sqlalchemy's 229-line
    OperationalError traceback."""
    pytest.importorskip("sqlalchemy")
    from sqlalchemy.exc import OperationalError

    from hpcpipe.errors import UserError
    from hpcpipe.track.mlflow_client import server_errors

    said = r"^track sync r: MLflow said: \(builtins\.Exception\) could not connect$"
    with pytest.raises(UserError, match=said), server_errors("track sync r"):
        raise OperationalError("SELECT 1", {}, Exception("could not connect\nat line 2"))
    said = r"^models list: MLflow said: \[Errno 111\] refused"
    with pytest.raises(UserError, match=said), server_errors("models list"):
        raise ConnectionRefusedError(111, "refused")


def test_a_param_changed_on_resume_is_recorded_as_a_tag_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """MLflow never overwrites a param: a run resumed with another train.lr kept the first value
    in MLflow without a word."""
    from types import SimpleNamespace

    from hpcpipe.track.mlflow_run import log_params

    class Client:
        def __init__(self) -> None:
            self.params: dict[str, str] = {}
            self.tags: dict[str, str] = {}

        def get_run(self, run_id: str) -> Any:
            return SimpleNamespace(data=SimpleNamespace(params=dict(self.params), tags=dict(self.tags)))

        def log_batch(self, run_id: str, params: list[Any], tags: list[Any]) -> None:
            assert not {p.key for p in params} & self.params.keys()  # MLflow refuses a second value
            self.params |= {p.key: p.value for p in params}
            self.tags |= {t.key: t.value for t in tags}

    client = Client()
    assert log_params(client, "r", {"train": {"lr": 0.003, "steps": 20}}, 0) == (2, [])
    with caplog.at_level(logging.WARNING, logger="hpcpipe.track"):
        assert log_params(client, "r", {"train": {"lr": 0.01, "steps": 20}}, 20) == (0, ["train.lr"])
        assert log_params(client, "r", {"train": {"lr": 0.01, "steps": 20}}, 40) == (0, [])  # said already
    assert client.params == {"train.lr": "0.003", "train.steps": "20"}
    assert client.tags == {"hpcpipe.changed.train.lr": "0.01 (from step 20)"}
    assert caplog.text.count("hpcpipe.changed.") == 1 and "train.lr" in caplog.text
    log_params(client, "r", {"train": {"lr": 0.003, "steps": 20}}, 60)  # back to the first value
    assert client.tags == {"hpcpipe.changed.train.lr": "0.003 (from step 60)"}
