"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pg_cluster import Cluster, drop_database, fresh_database, start_cluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """One PostgreSQL server for the session (a throwaway cluster, or DURABLE_BOTS_TEST_DATABASE_URL's)."""
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(pg_cluster: Cluster) -> Iterator[str]:
    """The URL of an empty database of this test's own, dropped afterwards."""
    url, name = fresh_database(pg_cluster)
    try:
        yield url
    finally:
        drop_database(pg_cluster, name)


@pytest.fixture
def pg_empty_url(pg_cluster: Cluster) -> Iterator[str]:
    """The URL of an empty database (no harness schema yet), dropped afterwards."""
    url, name = fresh_database(pg_cluster, migrated=False)
    try:
        yield url
    finally:
        drop_database(pg_cluster, name)


CRASH_STORAGE_ENV = "DURABLE_BOTS_CRASH_STORAGE_URL"


@pytest.fixture(params=["sqlite", "postgres"])
def crash_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a crash test on SQLite and on PostgreSQL: the bot processes it starts read
    DURABLE_BOTS_CRASH_STORAGE_URL (a database of this test's own) and use SQLite when it is unset."""
    if request.param == "postgres":
        monkeypatch.setenv(CRASH_STORAGE_ENV, request.getfixturevalue("pg_url"))
    else:
        monkeypatch.delenv(CRASH_STORAGE_ENV, raising=False)
    return str(request.param)
