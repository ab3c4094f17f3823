"""Every built-in backend passes the storage conformance suite (the file-backed ones also across reopen)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harness_core.storage import (
    JsonlStorage,
    MemoryStorage,
    PostgresStorage,
    PostgresStore,
    SqliteStorage,
    Storage,
)
from harness_core.testing import register_storage_conformance


async def open_memory(tmp_path: Path) -> Storage:
    return await MemoryStorage.open()


async def open_sqlite(tmp_path: Path) -> Storage:
    return await SqliteStorage.open(tmp_path / "store.db")


async def reopen_sqlite(storage: Storage, tmp_path: Path) -> Storage:
    await storage.close()
    return await SqliteStorage.open(tmp_path / "store.db")


async def open_jsonl(tmp_path: Path) -> Storage:
    return await JsonlStorage.open(tmp_path / "store")


async def reopen_jsonl(storage: Storage, tmp_path: Path) -> Storage:
    await storage.close()
    return await JsonlStorage.open(tmp_path / "store")


async def open_jsonl_fsync(tmp_path: Path) -> Storage:
    return await JsonlStorage.open(tmp_path / "store", fsync=True)


register_storage_conformance(globals(), "memory", open_memory)
register_storage_conformance(globals(), "sqlite", open_sqlite, reopen=reopen_sqlite)
register_storage_conformance(globals(), "jsonl", open_jsonl, reopen=reopen_jsonl)
register_storage_conformance(globals(), "jsonl-fsync", open_jsonl_fsync)


def test_the_suite_is_registered_under_predictable_names() -> None:
    names = {"TestMemoryStorageConformance", "TestSqliteStorageConformance", "TestJsonlStorageConformance"}
    assert names | {"TestJsonlFsyncStorageConformance"} <= set(globals())


# PostgreSQL: every test gets a database of its own on the session's throwaway cluster (tests/pg_cluster.py).
# The URL reaches the factory through a module global set by an autouse fixture, since the factory signature is
# the public one (tmp_path only).
_pg: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _postgres_database(request: pytest.FixtureRequest) -> None:
    if "Postgres" in request.node.nodeid:
        _pg["url"] = request.getfixturevalue("pg_url")


async def open_postgres(tmp_path: Path) -> Storage:
    return await PostgresStorage.open(_pg["url"])


async def reopen_postgres(storage: Storage, tmp_path: Path) -> Storage:
    await storage.close()
    return await PostgresStorage.open(_pg["url"])


register_storage_conformance(globals(), "postgres", open_postgres, reopen=reopen_postgres)


# One partition (5 of 8) of a store shared by many workers: the same contract, with ids and scans of its own.
# The handle leaves the store's connections open (other partitions use them); the fixture closes the stores.
_stores: list[PostgresStore] = []


@pytest.fixture(autouse=True)
async def _close_partitioned_stores() -> AsyncIterator[None]:
    yield
    while _stores:
        await _stores.pop().close()


async def open_postgres_partition(tmp_path: Path) -> Storage:
    store = await PostgresStore.open(_pg["url"], partitions=8)
    _stores.append(store)
    handle = await store.open_partition(5)
    assert isinstance(handle, PostgresStorage)
    return handle


async def reopen_postgres_partition(storage: Storage, tmp_path: Path) -> Storage:
    await storage.close()
    return await open_postgres_partition(tmp_path)


register_storage_conformance(
    globals(), "postgres-partition", open_postgres_partition, reopen=reopen_postgres_partition
)
