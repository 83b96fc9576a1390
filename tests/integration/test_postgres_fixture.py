"""The throwaway PostgreSQL server: password (scram) auth on loopback, an Optuna study through
SQLAlchemy + psycopg with the password only in PGPASSWORD, never in the URL or the server log, and
nothing left on disk after stop()."""

from __future__ import annotations

import pytest
from tests.integration.postgres_server import PostgresServer

psycopg = pytest.importorskip("psycopg")
optuna = pytest.importorskip("optuna")

pytestmark = [pytest.mark.integration]


@pytest.mark.timeout(120)
def test_optuna_study_on_the_server_then_nothing_left(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    pg = postgres_server
    assert pg.password not in pg.url and pg.password not in repr(pg)
    assert pg.env["PGPASSWORD"] == pg.password
    with psycopg.connect(
        host=pg.host, port=pg.port, user=pg.user, password=pg.password, dbname=pg.database, connect_timeout=10
    ) as conn:
        assert conn.execute("select current_database(), current_user").fetchone() == ("hpo", "hpcpipe")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(
            host=pg.host, port=pg.port, user=pg.user, password="wrong", dbname=pg.database, connect_timeout=10
        )

    monkeypatch.setenv("PGPASSWORD", pg.password)  # libpq reads it: the URL holds no password
    storage = optuna.storages.RDBStorage(f"postgresql+psycopg://{pg.user}@{pg.host}:{pg.port}/{pg.database}")
    try:
        study = optuna.create_study(study_name="fixture-check", storage=storage)
        study.optimize(lambda trial: trial.suggest_float("x", -1.0, 1.0) ** 2, n_trials=3)
        reloaded = optuna.load_study(study_name="fixture-check", storage=storage)
        assert [t.state for t in reloaded.trials] == [optuna.trial.TrialState.COMPLETE] * 3
    finally:
        storage.engine.dispose()
    assert pg.password not in pg.log.read_text()

    root, data = pg.root, pg.data_dir
    assert root is not None and (data / "PG_VERSION").is_file()
    pg.stop()  # idempotent: the fixture's teardown stops it again, harmlessly (one test per module)
    assert not data.exists() and not root.exists()
