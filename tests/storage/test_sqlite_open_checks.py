"""SQLite open-time checks: a damaged, empty or foreign file is refused at open with the path and the fix,
never started as an empty store, and the page check at open stays bounded in time."""

from __future__ import annotations

import logging
import sqlite3
import stat
from pathlib import Path

import pytest

from harness_core.errors import StorageCorrupt
from harness_core.records import Conversation, Entry
from harness_core.storage import CommitBatch, SqliteStorage
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
