"""Every built-in backend passes the storage conformance suite (the file-backed ones also across reopen)."""

from __future__ import annotations

from pathlib import Path

from harness_core.storage import JsonlStorage, MemoryStorage, SqliteStorage, Storage
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
