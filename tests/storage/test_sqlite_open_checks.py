"""SQLite open-time checks: a damaged, empty or foreign file is refused at open with the path and the fix,
never started as an empty store, and the page check at open stays bounded in time."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from harness_core.errors import StorageCorrupt
from harness_core.records import Conversation, Entry
from harness_core.storage import CommitBatch, SqliteStorage
from harness_core.storage import _sqlite as sqlite_module
from harness_core.storage._lock import OwnerLock


async def filled_store(path: Path, entries: int = 400) -> None:
    storage = await SqliteStorage.open(path)
    batch = CommitBatch(
        seq=1,
        next_id=entries + 10,
        conversations=[Conversation(id=1)],
        entries=[
            Entry(id=n, conversation_id=1, kind="t.note", data={"text": "x" * 200}) for n in range(2, entries)
        ],
    )
    await storage.commit([batch])
    await storage.close()


def damage_table(path: Path, table: str) -> None:
    """Overwrite the b-tree page header of `table`'s root page, as a bad disk block or a torn copy would."""
    conn = sqlite3.connect(path)
    (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    conn.close()
    with open(path, "r+b") as handle:
        handle.seek((root - 1) * page_size)
        handle.write(b"\xff" * 64)


async def test_a_damaged_page_is_found_at_open_with_the_path_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    await filled_store(path)
    damage_table(path, "entries")  # a table the open itself never reads
    with pytest.raises(StorageCorrupt, match=str(path)) as caught:
        await SqliteStorage.open(path)
    assert "corrupt" in str(caught.value) and "restore it from a backup" in str(caught.value)
    OwnerLock.acquire(tmp_path / "store.db.lock", str(path)).release()  # the failed open let go of the lock


async def test_a_damaged_page_past_the_budget_is_still_reported_when_read(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    await filled_store(path)
    damage_table(path, "entries")
    storage = await SqliteStorage.open(path, check_budget=0)  # no check at open: SQLite finds it on read
    try:
        with pytest.raises(StorageCorrupt, match=str(path)):
            await storage.scan_entries(1)
    finally:
        await storage.close()


async def test_the_check_at_open_stops_at_its_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "store.db"
    await filled_store(path, entries=3000)
    with caplog.at_level(logging.INFO, logger="harness_core.storage"):
        storage = await SqliteStorage.open(path, check_budget=1e-9)
    await storage.close()
    assert "quick_check stopped after its" in caplog.text


async def test_a_zero_length_file_is_refused_not_started_empty(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    path.touch()  # e.g. a copy that failed, or a truncation
    with pytest.raises(StorageCorrupt, match=rf"{path} is an empty \(zero-length\) file") as caught:
        await SqliteStorage.open(path)
    assert "restore it from a backup" in str(caught.value)
    assert path.stat().st_size == 0  # left as it was for the operator


async def test_a_file_that_is_not_sqlite_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    path.write_text("key = 1\n")
    with pytest.raises(StorageCorrupt, match=rf"{path} is not a SQLite database") as caught:
        await SqliteStorage.open(path)
    assert "restore it from a backup" in str(caught.value)


async def test_a_new_store_is_created_whole_and_private(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "store.db"
    storage = await SqliteStorage.open(path)
    await storage.close()
    assert path.read_bytes()[:16] == b"SQLite format 3\x00"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["store.db", "store.db.lock"]
    await (await SqliteStorage.open(path)).close()  # and it reopens


async def test_a_big_store_is_checked_in_the_background_and_damage_stops_every_later_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sqlite_module, "INLINE_CHECK_BYTES", 0)  # every store counts as big
    monkeypatch.setattr(sqlite_module, "BACKGROUND_CHECK_DELAY", 0.0)
    path = tmp_path / "store.db"
    await filled_store(path)
    damage_table(path, "entries")
    with caplog.at_level(logging.ERROR, logger="harness_core.storage"):
        storage = await SqliteStorage.open(path)  # returns before the check: a restart does not wait
        try:
            assert storage._verifying is not None
            await asyncio.wait_for(asyncio.shield(storage._verifying), 10)
            with pytest.raises(StorageCorrupt, match=str(path)) as caught:
                await storage.meta()  # even a call that reads nothing damaged
            assert "restore it from a backup" in str(caught.value)
        finally:
            await storage.close()
    assert any(str(path) in r.getMessage() and "corrupt" in r.getMessage() for r in caplog.records)


async def test_a_healthy_big_store_passes_the_background_check_and_close_stops_a_running_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "INLINE_CHECK_BYTES", 0)
    monkeypatch.setattr(sqlite_module, "BACKGROUND_CHECK_DELAY", 0.0)
    path = tmp_path / "store.db"
    await filled_store(path, entries=3000)
    storage = await SqliteStorage.open(path)
    assert storage._verifying is not None
    await asyncio.wait_for(asyncio.shield(storage._verifying), 10)
    assert len((await storage.scan_entries(1, limit=10)).items) == 10  # nothing found: it runs on
    await storage.close()
    started: list[threading.Event] = []
    began = threading.Event()
    blocking = sqlite_module._check_in_background

    def slow(path: str, budget: float, stop: threading.Event) -> Any:
        started.append(stop)
        began.set()
        stop.wait(30)  # a check that would run long; close() must stop it
        return blocking(path, budget, stop)

    monkeypatch.setattr(sqlite_module, "_check_in_background", slow)
    storage = await SqliteStorage.open(path)
    assert await asyncio.to_thread(began.wait, 10)
    await asyncio.wait_for(storage.close(), 10)
    assert started[0].is_set()
