"""hpcpipe hpo end to end: real trials (hpcpipe train subprocesses) against SQLite, Optuna's journal
file and a throwaway PostgreSQL; pruning in DDP trials; a SIGKILLed worker; best --export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import run_cli, tiny_job_sets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _sets(tmp: Path, *extra: str) -> list[str]:
    return tiny_job_sets(
        tmp,
        "study",
        "train.steps=20",
        "train.eval_every=5",
        "observe.log_every=5",
        "observe.progress=false",
        *extra,
    )


def _status(study_dir: Path, tmp: Path) -> dict[str, Any]:
    proc = run_cli("hpo", "status", str(study_dir), "--json", "-", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def _space(spec: str) -> list[str]:
    return ["--set", f"hpo.space={{train.lr: {spec}}}"]


def _four_trials_on_two_workers(
    tmp: Path, sets: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    space = _space("{type: float, low: 0.001, high: 0.01, log: true}")
    return run_cli(
        "hpo", "run", "tiny", *sets, *space, "--trials", "4", "--workers", "2", cwd=tmp, timeout=400, env=env
    )


def test_diverging_ddp_trials_are_pruned_on_both_ranks_and_the_best_retrains(tmp_path: Path) -> None:
    study_dir = tmp_path / "hpo-study"
    base = [*_sets(tmp_path), "--set", "hpo.pruner.n_startup_trials=1", "--set", "hpo.sampler.name=random"]
    # A sane learning rate first (it completes: the median to beat), then two that diverge.
    first = run_cli(
        "hpo",
        "run",
        "tiny",
        *base,
        *_space("{type: float, low: 0.003, high: 0.003}"),
        "--trials",
        "1",
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stdout + first.stderr
    bad = _space("{type: float, low: 30.0, high: 60.0}")
    second = run_cli(
        "hpo", "run", "tiny", *base, *bad, "--trials", "3", "--nproc", "2", cwd=tmp_path, timeout=400
    )
    assert second.returncode == 0, second.stdout + second.stderr
    trials = _status(study_dir, tmp_path)["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE", "PRUNED", "PRUNED"]
    assert trials[0]["last_step"] == 20
    for trial in trials[1:]:
        assert trial["last_step"] == 5  # stopped at the first evaluation, 15 steps early
        run_dir = Path(trial["run_dir"])
        log = (run_dir / "train.log").read_text()
        assert log.count("pruned at step 5") == 2, log  # both ranks received the decision
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        assert any(e["event"] == "pruned" and e["step"] == 5 for e in events)
        assert any(e["event"] == "checkpoint_committed" for e in events), events
    assert (study_dir / "plots" / "optimization_history.png").stat().st_size > 0
    assert (study_dir / "plots" / "intermediate_values.png").stat().st_size > 0

    best = tmp_path / "best.yaml"
    exported = run_cli(
        "hpo", "best", str(study_dir), "--export", str(best), "--set", "train.steps=6", cwd=tmp_path
    )
    assert exported.returncode == 0, exported.stderr
    assert "trial 0" in exported.stdout
    trained = run_cli("train", str(best), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    rows = [json.loads(line) for line in (tmp_path / "study-best" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 6


def test_two_workers_share_the_journal_file_store(tmp_path: Path) -> None:
    sets = [
        *_sets(tmp_path, "train.steps=10"),
        "--set",
        "hpo.pruner.name=none",
        "--set",
        f"hpo.storage=journal:{tmp_path}/study.log",
    ]
    proc = _four_trials_on_two_workers(tmp_path, sets)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = _status(tmp_path / "hpo-study", tmp_path)
    assert [t["number"] for t in result["trials"]] == [0, 1, 2, 3]
    assert result["counts"] == {"COMPLETE": 4} and result["storage"].startswith("journal:")
    assert len({t["run_dir"] for t in result["trials"]}) == 4
    assert len({t["params"]["train.lr"] for t in result["trials"]}) == 4  # workers sample apart
    assert "[w0] trial" in proc.stdout and "[w1] trial" in proc.stdout  # both workers ran trials


def test_a_sigkilled_worker_trial_is_failed_then_retried_from_its_checkpoint(tmp_path: Path) -> None:
    sets = _sets(tmp_path, "train.steps=300", "train.eval_every=150", "checkpoint.every_steps=20")
    # hpo.grace_s leaves the trial fault.preempt_grace_s + 10 s to checkpoint after a lapse.
    sets += ["--set", "hpo.heartbeat_s=1", "--set", "fault.preempt_grace_s=1", "--set", "hpo.grace_s=13"]
    sets += ["--set", "hpo.n_trials=1"]
    sets += _space("{type: float, low: 0.001, high: 0.01, log: true}")
    argv = [sys.executable, "-m", "hpcpipe", "hpo", "run", "tiny", *sets]
    worker = subprocess.Popen(
        argv, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    run_dir = tmp_path / "hpo-study" / "trials" / "trial-0000"
    deadline = time.monotonic() + 180
    while not _committed(run_dir) and time.monotonic() < deadline and worker.poll() is None:
        time.sleep(0.5)
    assert _committed(run_dir), "the trial never committed a checkpoint"
    os.killpg(worker.pid, signal.SIGKILL)  # the worker and its trial, as a lost node would
    worker.wait(timeout=30)
    # Failed by the sweep of `hpo status`: at once (its worker's pid is gone on this host), or
    # past hpo.grace_s where the pid cannot be told.
    deadline = time.monotonic() + 15
    while (trials := _status(tmp_path / "hpo-study", tmp_path)["trials"])[0]["state"] == "RUNNING":
        assert time.monotonic() < deadline, trials
        time.sleep(1)
    assert [(t["state"], t["retry_of"]) for t in trials] == [("FAIL", None), ("WAITING", 0)]
    assert "no heartbeat" in trials[0]["note"] or "its worker died" in trials[0]["note"]
    resumed = run_cli("hpo", "worker", str(tmp_path / "hpo-study"), cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    trials = _status(tmp_path / "hpo-study", tmp_path)["trials"]
    assert [t["state"] for t in trials] == ["FAIL", "COMPLETE"] and trials[1]["run_dir"] == str(run_dir)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "resumed" and e["step"] >= 20 for e in events), "the retry started over"


def _committed(run_dir: Path) -> bool:
    events = run_dir / "events.jsonl"
    return events.is_file() and '"checkpoint_committed"' in events.read_text()


def test_two_workers_share_a_postgresql_study_and_no_password_is_logged(
    tmp_path: Path, postgres_server: Any
) -> None:
    sets = [
        *_sets(tmp_path, "train.steps=10"),
        "--set",
        "hpo.pruner.name=none",
        "--set",
        f"hpo.storage={postgres_server.url}",
    ]
    env = {**os.environ, **postgres_server.env}
    proc = _four_trials_on_two_workers(tmp_path, sets, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = run_cli("hpo", "status", str(tmp_path / "hpo-study"), "--json", "-", cwd=tmp_path, env=env)
    result = json.loads(status.stdout)
    assert [t["number"] for t in result["trials"]] == [0, 1, 2, 3] and result["counts"] == {"COMPLETE": 4}
    assert len({t["run_dir"] for t in result["trials"]}) == 4
    assert len({t["params"]["train.lr"] for t in result["trials"]}) == 4  # workers sample apart
    assert "[w0] trial" in proc.stdout and "[w1] trial" in proc.stdout  # both workers ran trials
    password = postgres_server.password
    assert password not in proc.stdout + proc.stderr + status.stdout
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.suffix in {".yaml", ".json", ".jsonl", ".log", ".csv", ".md", ".txt"}:
            assert password not in path.read_text(errors="replace"), path
    # Without the password the same study is refused in one line naming the storage, not the password.
    no_pw = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    refused = run_cli("hpo", "status", str(tmp_path / "hpo-study"), cwd=tmp_path, env=no_pw)
    assert refused.returncode == 2 and "cannot open the study" in refused.stderr
    assert password not in refused.stderr and "Traceback" not in refused.stderr


def test_a_postgresql_store_limits_statements_and_keeps_pgoptions(
    postgres_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statement limit is set by a query after connecting, not by libpq's ``options``: that
    overrode PGOPTIONS (its search_path lost) and PgBouncer refuses it; a limit the session
    already has stands."""
    from sqlalchemy import text

    from hpcpipe.train.trial import open_storage

    for name, value in postgres_server.env.items():
        monkeypatch.setenv(name, value)

    def settings() -> tuple[str, str]:
        storage = open_storage(postgres_server.url)
        try:
            with storage.engine.connect() as conn:
                row = conn.execute(
                    text("SELECT current_setting('statement_timeout'), current_setting('search_path')")
                )
                return tuple(row.one())  # type: ignore[return-value]
        finally:
            storage.engine.dispose()

    monkeypatch.delenv("PGOPTIONS", raising=False)
    assert settings()[0] == "1min"
    monkeypatch.setenv("PGOPTIONS", "-c search_path=elsewhere,public")
    assert settings() == ("1min", "elsewhere,public")
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=5min")
    assert settings()[0] == "5min"
