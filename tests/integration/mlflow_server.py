"""A throwaway MLflow tracking server for tests: SQLite backend and artifact store in a temporary
directory, bound to 127.0.0.1 on a free port, stopped (its whole process group) even on failure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from hpcpipe.netutil import free_port

START_TIMEOUT_S = 180
# No job executor: it runs MLflow's GenAI jobs (online scoring, trace archival), nothing tracking or
# the registry uses, in consumer processes that import MLflow once more (CPU beside the tests) and
# held the stop to its 15 s SIGKILL fallback.
NO_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


class MlflowServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MlflowServer:
        """Start (or start again on the same store and port) and wait until /health answers."""
        mlflow = Path(sys.executable).with_name("mlflow")
        log = (self.root / "server.log").open("ab")
        self.proc = subprocess.Popen(
            [
                str(mlflow), "server",
                "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
                "--artifacts-destination", str(self.root / "artifacts"),
                "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **NO_JOBS},
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server not healthy after {START_TIMEOUT_S} s")

    def stop(self) -> None:
        """SIGKILL, the whole group: a throwaway server has nothing to flush (SQLite commits each
        request), and the `mlflow server` wrapper took 5-15 s to exit after a SIGTERM."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(15)

    def client(self) -> Any:
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.url, registry_uri=self.url)
