"""Fixtures for the integration tests: services that several modules start on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.integration.postgres_server import PostgresServer, missing_capability


@pytest.fixture(scope="module")
def postgres_server() -> Iterator[PostgresServer]:
    """A started throwaway PostgreSQL (database `hpo`, user `hpcpipe`), stopped and deleted after the
    module; skipped with one line where PostgreSQL is not installed."""
    reason = missing_capability()
    if reason:
        pytest.skip(reason)
    with PostgresServer() as server:
        yield server
