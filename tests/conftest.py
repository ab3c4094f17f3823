"""Shared fixtures."""

from __future__ import annotations

import fcntl
from collections.abc import Generator, Iterator
from typing import Any

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


def _utf8_safe(value: Any) -> Any:
    """`value` with every string made encodable: a lone surrogate becomes its backslash escape."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_utf8_safe(k): _utf8_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_utf8_safe(v) for v in value)
    return value


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config: pytest.Config, report: Any) -> Generator[None, Any, Any]:
    # The poison-input tests log lone surrogates on purpose; a report carrying one cannot cross to the
    # pytest-xdist controller (UTF-8 only), which would end the whole run instead of this test.
    serialized = yield
    return _utf8_safe(serialized)


# Tests that run several bot processes under load (workers, their intake processes, the benchmarks' loads).
# `make test` runs the suite in two pytest processes; these take a lock shared by both, so two of them never
# compete for this machine's two cores while their leases and timeouts run. (pytest-xdist's own grouping,
# `--dist loadgroup`, does nothing under pytest 9.2: it renames a node attribute that pytest no longer reads.)
MANY_PROCESSES = {
    "tests/bots/test_bots_workers.py",
    "tests/bots/test_bots_workers_discord.py",
    "tests/bots/test_bots_intake_process.py",
    "tests/benchmarks/test_benchmarks_run.py",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.relative_to(config.rootpath).as_posix() in MANY_PROCESSES:
            item.add_marker(pytest.mark.many_processes)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    # Around the whole protocol and outside pytest-timeout's timer (tryfirst: the outermost wrapper), so the
    # wait for the other pytest process's test never counts against this test's own timeout.
    if not hasattr(item.config, "workerinput") or item.get_closest_marker("many_processes") is None:
        return (yield)
    # Each pytest-xdist worker's base temp dir is one directory of this run's (pytest-N/popen-gw0): the lock
    # sits in that run's directory, shared by the workers and cleaned up with it.
    base = item.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    with (base.parent / "many-processes.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        return (yield)
