"""The trainer's side of a hyper-parameter trial: report each evaluation, stop when pruned.

An ``hpcpipe hpo`` worker starts every trial as an ordinary ``hpcpipe train`` and names the
trial in the environment (``HPCPIPE_HPO_*``); nothing here runs without them. Rank 0 alone talks
to the study: after each evaluation it reports ``hpo.metric`` at the training step and asks the
pruner; the answer reaches every rank through one all-reduce (MAX), so all ranks stop at the same
step. A pruned trial checkpoints and exits with ``PRUNED_EXIT_CODE``; the worker records it as
pruned. The storage is opened lazily (Optuna is an extra).

A report the study refuses because the trial already ended (the worker that ran it died, and the
trial was failed and retried elsewhere) stops the trial the same way: it must not go on training
for a trial that no longer counts.
"""

from __future__ import annotations

import math
import os
import re
import sys
import warnings
from typing import TYPE_CHECKING, Any

from hpcpipe.config.hpo import HpoConfig, PrunerConfig
from hpcpipe.train.oom import AllReduceMax, agree_any
from hpcpipe.train.preempt import Preempted

if TYPE_CHECKING:
    import optuna

ENV_STORAGE = "HPCPIPE_HPO_STORAGE"  # the storage URL (never with a password: PGPASSWORD carries it)
ENV_STUDY = "HPCPIPE_HPO_STUDY"
ENV_TRIAL = "HPCPIPE_HPO_TRIAL_ID"  # the storage's trial id (not the trial number)
# 76 (EX_PROTOCOL in sysexits.h; here "stopped on purpose by the study"): next to 75 (preempted,
# resubmit me), apart from 0 (a scheduler would call the trial finished), 1 (a crash) and 2 (bad
# input). The worker tells the study "pruned" on it.
PRUNED_EXIT_CODE = 76
PRUNED, ENDED = "pruned by the study's pruner", "the trial already ended in the study"
STOP_REASONS = ("", PRUNED, ENDED)


class Pruned(Preempted):
    """The study stopped this trial after its checkpoint; the worker exits ``PRUNED_EXIT_CODE``.

    A ``Preempted`` (a BaseException) so the paths that end an orderly stop handle it the same.
    """

    def __init__(self, step: int, why: str) -> None:
        super().__init__(step, PRUNED_EXIT_CODE)
        self.args = (f"pruned at step {step} ({why}); exit code {PRUNED_EXIT_CODE}",)


def build_pruner(cfg: PrunerConfig) -> optuna.pruners.BasePruner:
    """Optuna's pruner for ``hpo.pruner`` (the worker and every trial build the same one)."""
    import optuna

    if cfg.name == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=cfg.n_startup_trials, n_warmup_steps=cfg.n_warmup_steps
        )
    if cfg.name == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=cfg.min_resource, reduction_factor=cfg.reduction_factor
        )
    if cfg.name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=cfg.min_resource, reduction_factor=cfg.reduction_factor
        )
    return optuna.pruners.NopPruner()


class TrialLink:
    """Reports evaluations to the study and agrees on pruning; inactive outside a trial."""

    def __init__(self, hpo: HpoConfig, is_main: bool, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        self.metric = hpo.metric
        self.active = ENV_TRIAL in env
        self._trial: optuna.trial.Trial | None = None
        if self.active and is_main:
            self._trial = _open_trial(env[ENV_STORAGE], env[ENV_STUDY], int(env[ENV_TRIAL]), hpo.pruner)

    def should_stop(
        self, step: int, metrics: dict[str, float], all_reduce_max: AllReduceMax | None
    ) -> str | None:
        """After an evaluation (every rank calls it: a collective in a DDP trial): why to stop, or None."""
        if not self.active:
            return None
        why = self._ask(step, metrics) if self._trial is not None else None
        # Rank 0's answer as an index into STOP_REASONS; the other ranks contribute 0.
        agreed = agree_any(STOP_REASONS.index(why) if why else 0, all_reduce_max)
        return STOP_REASONS[agreed] or None

    def _ask(self, step: int, metrics: dict[str, float]) -> str | None:
        import optuna

        assert self._trial is not None
        value = metrics.get(self.metric)
        if value is None or not math.isfinite(value):
            # A diverged run reports +/-inf the pruner can rank; a missing metric is the worker's error.
            if value is None:
                return None
            value = math.inf if self._trial.study.direction.name == "MINIMIZE" else -math.inf
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a resumed trial reports a step again: Optuna warns
                self._trial.report(value, step)
            return PRUNED if self._trial.should_prune() else None
        except optuna.exceptions.UpdateFinishedTrialError:
            return ENDED
        except Exception as exc:  # the study is unreachable: training goes on, unpruned
            print(
                f"hpcpipe: trial report at step {step} failed ({type(exc).__name__}); continuing",
                file=sys.stderr,
            )
            return None


def _open_trial(url: str, study_name: str, trial_id: int, pruner: PrunerConfig) -> optuna.trial.Trial:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=open_storage(url), pruner=build_pruner(pruner))
    return optuna.trial.Trial(study, trial_id)


def open_storage(url: str, **engine: Any) -> optuna.storages.BaseStorage:
    """The storage a URL names: ``journal:PATH`` (Optuna's journal file), ``sqlite:///PATH``, or
    ``postgresql://USER@HOST:PORT/DB`` (through psycopg 3; libpq reads PGPASSWORD / ~/.pgpass)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    if url.startswith("journal:"):
        return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):  # wait for the lock instead of failing at once
        kwargs = {"connect_args": {"timeout": 60}}
    elif url.startswith("postgresql"):  # drop dead connections
        kwargs = {"pool_pre_ping": True, "connect_args": postgres_timeouts(url)}
    kwargs.update(engine)
    storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    if url.startswith("postgresql") and not statement_timeout_given(url):
        limit_statements(storage.engine)
    return storage


# libpq's defaults wait forever: a server cut off by the network (its packets dropped, not
# refused) hung the worker in a connect or a query, and its trial's heartbeat with it.
POSTGRES_TIMEOUTS = {
    "connect_timeout": 10,  # seconds
    "tcp_user_timeout": 30_000,  # ms: sent data unacknowledged this long ends the connection
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}
POSTGRES_ENV = {"connect_timeout": "PGCONNECT_TIMEOUT"}  # the others have no environment variable
LIBPQ_DRIVERS = ("postgresql+psycopg:", "postgresql+psycopg2:", "postgresql:")
STATEMENT_TIMEOUT = "60s"


def postgres_timeouts(url: str) -> dict[str, Any]:
    """libpq's time limits, each one unless the URL's query or its environment variable sets it
    (an explicit keyword overrides both), and none where a service file (``service=``,
    PGSERVICE) may set them, or the driver is not libpq's (pg8000 refuses them)."""
    from urllib.parse import parse_qs, urlsplit

    given = parse_qs(urlsplit(url).query)
    if not url.startswith(LIBPQ_DRIVERS) or "service" in given or os.environ.get("PGSERVICE"):
        return {}
    return {
        key: value
        for key, value in POSTGRES_TIMEOUTS.items()
        if key not in given and not os.environ.get(POSTGRES_ENV.get(key, ""))
    }


# A statement_timeout in libpq's ``options`` (``-c statement_timeout=0``, ``--statement-timeout=0``).
_STATEMENT_TIMEOUT_OPTION = re.compile(r"statement[_-]timeout\s*=", re.IGNORECASE)


def statement_timeout_given(url: str) -> bool:
    """PGOPTIONS or the URL's ``options`` set statement_timeout: that one stands, 0 (no limit, on
    purpose) included, which a session reports as no limit at all."""
    from urllib.parse import parse_qs, urlsplit

    options = [os.environ.get("PGOPTIONS", ""), *parse_qs(urlsplit(url).query).get("options", [])]
    return any(_STATEMENT_TIMEOUT_OPTION.search(option) for option in options)


def limit_statements(engine: Any) -> None:
    """Each new connection's statements end after STATEMENT_TIMEOUT, unless the session already has
    a limit (the role's or the database's; ``statement_timeout_given`` decides on PGOPTIONS and the
    URL before this is called). Set by a query, not libpq's ``options`` startup parameter: that
    overrode PGOPTIONS, and PgBouncer refuses it. A session setting: behind PgBouncer's transaction
    pooling it may not hold (set it on the role or the database there)."""
    from sqlalchemy import event

    def connected(dbapi_connection: Any, _record: Any) -> None:
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(
                "SELECT set_config('statement_timeout', %s, false)"
                " WHERE current_setting('statement_timeout') = '0'",
                (STATEMENT_TIMEOUT,),
            )
        finally:
            cursor.close()
            dbapi_connection.autocommit = autocommit

    event.listen(engine, "connect", connected)
    engine.dispose()  # the connections RDBStorage opened to set up, made before the listener
