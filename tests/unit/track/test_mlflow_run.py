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
from hpcpipe.track.mlflow_run import MlflowSink, metric_values
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


def test_rows_become_metric_values_and_configs_flat_params() -> None:
    values = metric_values({"step": 7, "loss": 2.5, "lr": 1e-3, "note": "x", "finite": True})
    assert [(k, v, s) for k, v, _, s in values] == [("loss", 2.5, 7), ("lr", 1e-3, 7)]
    assert flatten({"train": {"lr": 0.1, "betas": [0.9, 0.95]}, "lora": {}}) == {
        "train.lr": 0.1, "train.betas": [0.9, 0.95], "lora": {},
    }  # fmt: skip


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
