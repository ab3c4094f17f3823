"""SQLite specifics: pragmas, file modes, migrations, errors, atomic rollback, reopen, query plans."""

from __future__ import annotations

import asyncio
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest

from harness_core.errors import StorageCorrupt, StorageError
from harness_core.records import (
    Conversation,
    DocumentContent,
    DocumentRecord,
    Entry,
    Submission,
    Task,
    TaskState,
)
from harness_core.storage import CommitBatch, DocChange, DocCreate, SqliteStorage
from harness_core.storage._lock import OwnerLock
from harness_core.storage._sqlite_schema import MIGRATIONS, SCHEMA_VERSION, migrate


async def pragma(storage: SqliteStorage, name: str) -> Any:
    rows = await storage._db.execute_fetchall(f"PRAGMA {name}")
    return rows[0][0]


def sample_batches() -> list[CommitBatch]:
    record = DocumentRecord(
        id=5, kind="t.doc", scope="conversation", scope_id=1, history="rewindable", created_seq=1
    )
    state = TaskState(status="running", checkpoint={"phase": "go"})
    return [
        CommitBatch(
            seq=1,
            next_id=10,
            conversations=[Conversation(id=1)],
            entries=[
                Entry(id=2, conversation_id=1, kind="t.a", head=2),
                Entry(id=3, conversation_id=1, kind="t.b"),
            ],
            tasks=[Task(id=4, conversation_id=1, kind="t.work", state=state)],
            submissions=[Submission(id=6, conversation_id=1, request_id="r", type="input", status="queued")],
            doc_creates=[DocCreate(record=record, version=1, value={"n": 0})],
        ),
        CommitBatch(
            seq=2,
            next_id=12,
            entries=[Entry(id=11, conversation_id=1, kind="t.c")],
            doc_changes=[
                DocChange(
                    id=5,
                    content=DocumentContent(
                        seq=2, version=1, delta=[{"op": "replace", "path": "/n", "value": 1}]
                    ),
                )
            ],
        ),
    ]


async def snapshot(storage: SqliteStorage) -> dict[str, Any]:
    return {
        "meta": await storage.meta(),
        "conversations": (await storage.scan_conversations()).items,
        "entries": (await storage.scan_entries(1)).items,
        "head": await storage.latest_head(1),
        "tasks": (await storage.scan_tasks()).items,
        "submissions": (await storage.scan_submissions()).items,
        "docs": await storage.scan_documents(scope="conversation", scope_id=1, alive_only=False),
        "doc": await storage.document(5),
        "doc_at_1": await storage.document(5, at_seq=1),
        "contents": await storage.document_contents(5),
    }


@pytest.mark.parametrize(("durability", "synchronous"), [("normal", 1), ("full", 2)])
async def test_wal_and_synchronous(tmp_path: Path, durability: Any, synchronous: int) -> None:
    storage = await SqliteStorage.open(tmp_path / "s.db", durability=durability)
    try:
        assert await pragma(storage, "journal_mode") == "wal"
        assert await pragma(storage, "synchronous") == synchronous
        assert await pragma(storage, "foreign_keys") == 1
        assert await pragma(storage, "busy_timeout") > 0
    finally:
        await storage.close()


async def test_unknown_durability_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        await SqliteStorage.open(tmp_path / "s.db", durability="sometimes")  # type: ignore[arg-type]


async def test_files_are_private(tmp_path: Path) -> None:
    storage = await SqliteStorage.open(tmp_path / "nested" / "s.db")
    try:
        await storage.commit(sample_batches())
        for name in ("s.db", "s.db.lock", "s.db-wal", "s.db-shm"):
            assert stat.S_IMODE((tmp_path / "nested" / name).stat().st_mode) == 0o600, name
    finally:
        await storage.close()


async def test_reopen_after_close_gives_identical_state(tmp_path: Path) -> None:
    storage = await SqliteStorage.open(tmp_path / "s.db")
    await storage.commit(sample_batches())
    before = await snapshot(storage)
    await storage.close()
    wal = tmp_path / "s.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0  # checkpointed into the database on close
    reopened = await SqliteStorage.open(tmp_path / "s.db")
    try:
        assert await snapshot(reopened) == before
        assert before["doc"].value == {"n": 1}
    finally:
        await reopened.close()


async def test_a_failing_batch_rolls_back_the_whole_group(tmp_path: Path) -> None:
    storage = await SqliteStorage.open(tmp_path / "s.db")
    try:
        await storage.commit(sample_batches()[:1])
        good = CommitBatch(seq=2, next_id=50, entries=[Entry(id=20, conversation_id=1, kind="t.x")])
        clash = CommitBatch(seq=3, next_id=60, entries=[Entry(id=2, conversation_id=1, kind="t.rewrite")])
        with pytest.raises(StorageError, match="commit failed"):
            await storage.commit([good, clash])  # entries are never rewritten
        assert await storage.entry(20) is None
        original = await storage.entry(2)
        assert original is not None
        assert original.kind == "t.a"
        assert (await storage.meta()).last_seq == 1
        unknown_doc = DocChange(id=99, content=DocumentContent(seq=2, version=1, base={}))
        with pytest.raises(StorageError):
            await storage.commit([CommitBatch(seq=2, next_id=50, doc_changes=[unknown_doc])])
        with pytest.raises(StorageError, match="unknown document"):
            await storage.commit([CommitBatch(seq=2, next_id=50, doc_retires=[99])])
        await storage.commit([good])  # still usable: every failure rolled back
        assert await storage.entry(20) is not None
    finally:
        await storage.close()


async def test_migrates_a_store_from_an_older_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    entry = Entry(id=2, conversation_id=1, kind="t.a", head=2)
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, str(path), upto=1) == 0  # a store written by the first schema version
    conn.execute(
        "INSERT INTO conversations (id, owner_task_id, record) VALUES (1, NULL, ?)",
        (Conversation(id=1).model_dump_json(),),
    )
    conn.execute(
        "INSERT INTO entries (id, conversation_id, head, record) VALUES (2, 1, 2, ?)",
        (entry.model_dump_json(),),
    )
    conn.execute("UPDATE meta SET next_id = 3, last_seq = 1")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()

    storage = await SqliteStorage.open(path)
    try:
        assert await pragma(storage, "user_version") == SCHEMA_VERSION == MIGRATIONS[-1][0]
        indexes = {
            row[0]
            for row in await storage._db.execute_fetchall(
                "SELECT name FROM sqlite_master WHERE type = 'index'"
            )
        }
        assert {"entries_heads", "tasks_by_live", "doc_records_by_address"} <= indexes
        assert (await storage.meta()).next_id == 3
        assert await storage.latest_head(1) == entry  # this read needs the index version 2 added
        await storage.commit(
            [CommitBatch(seq=2, next_id=4, entries=[Entry(id=3, conversation_id=1, kind="t.b")])]
        )
    finally:
        await storage.close()


async def test_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    await (await SqliteStorage.open(path)).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StorageError, match="newer than this build"):
        await SqliteStorage.open(path)


async def test_a_file_that_is_not_a_database_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 200)
    with pytest.raises(StorageCorrupt, match=str(path)):
        await SqliteStorage.open(path)
    OwnerLock.acquire(tmp_path / "notes.db.lock", str(path)).release()  # the failed open let go of the lock


async def test_a_foreign_writer_holding_the_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    storage = await SqliteStorage.open(path, busy_timeout=0.05)
    foreign = sqlite3.connect(path, isolation_level=None)
    try:
        foreign.execute("BEGIN IMMEDIATE")  # e.g. an sqlite3 shell left in a write transaction
        with pytest.raises(StorageError, match="locked by another SQLite connection") as caught:
            await storage.commit(sample_batches()[:1])
        assert not isinstance(caught.value, StorageCorrupt)
        foreign.execute("ROLLBACK")
        await storage.commit(sample_batches()[:1])
        assert await storage.entry(2) is not None
    finally:
        foreign.close()
        await storage.close()


async def test_hot_reads_use_indexes(tmp_path: Path) -> None:
    storage = await SqliteStorage.open(tmp_path / "s.db")
    try:
        await storage.commit(sample_batches())
        statements: list[str] = []
        await storage._db.set_trace_callback(statements.append)
        await storage._reader.set_trace_callback(statements.append)  # scans run on the reader connection
        page = await storage.scan_entries(1, limit=1)
        await storage.scan_entries(1, limit=1, cursor=page.cursor, min_id=1, max_id=50)
        await storage.latest_head(1, at_or_before=11)
        await storage.scan_tasks(live=True, order="desc")
        await storage.scan_tasks(conversation_id=1, kind="t.work")
        await storage.submission_by_request(1, "r")
        await storage.scan_submissions(status="queued")
        await storage.scan_conversations(owner_task_id=4)
        await storage.find_document("t.doc", "conversation", 1)
        await storage.find_document("t.doc", "conversation", 1, at_seq=1)
        await storage.scan_documents(scope="conversation", scope_id=1)
        await storage.document(5)
        await storage.document(5, at_seq=1)
        await storage.task(4)
        await storage._db.set_trace_callback(None)
        await storage._reader.set_trace_callback(None)
        selects = [sql for sql in statements if sql.startswith("SELECT")]
        assert len(selects) >= 14
        for sql in selects:
            plan = await storage._db.execute_fetchall(f"EXPLAIN QUERY PLAN {sql}")
            details = [row[3] for row in plan]
            # Every table access is an index search: no full scans, no sorting in a temporary b-tree.
            assert not [d for d in details if d.startswith("SCAN") or "TEMP B-TREE" in d], (sql, details)
    finally:
        await storage.close()


def entry_batches(count: int, start_seq: int = 1) -> list[CommitBatch]:
    """One conversation, then `count` commits of one small entry each (a few pages of WAL per commit)."""
    batches = [CommitBatch(seq=start_seq, next_id=2, conversations=[Conversation(id=1)])]
    for n in range(count):
        entry = Entry(id=2 + n, conversation_id=1, kind="t.note", data={"text": "x" * 300})
        batches.append(CommitBatch(seq=start_seq + 1 + n, next_id=3 + n, entries=[entry]))
    return batches


async def test_the_wal_is_checkpointed_in_the_background_not_inside_a_commit(tmp_path: Path) -> None:
    storage = await SqliteStorage.open(tmp_path / "s.db")
    database = tmp_path / "s.db"
    try:
        # SQLite's own checkpoint sits far above what these commits write, so it cannot be what copies them
        assert await pragma(storage, "wal_autocheckpoint") >= 10_000
        empty = database.stat().st_size
        for batch in entry_batches(400):  # one at a time, as the commit line does
            await storage.commit([batch])
        for _ in range(250):  # the checkpoint runs beside the writer; wait for it to land
            if database.stat().st_size > empty:
                break
            await asyncio.sleep(0.02)
        assert database.stat().st_size > empty  # the entries reached the database file, not just the WAL
        page = await storage.scan_entries(1, limit=1000)
        assert sorted(e.id for e in page.items) == list(range(2, 402))
    finally:
        await storage.close()


async def test_close_waits_for_a_checkpoint_in_flight(tmp_path: Path) -> None:
    storage = await SqliteStorage.open(tmp_path / "s.db")
    for batch in entry_batches(200):
        await storage.commit([batch])  # the 200th commit starts a checkpoint; close follows at once
    await storage.close()
    reopened = await SqliteStorage.open(tmp_path / "s.db")
    try:
        assert len((await reopened.scan_entries(1, limit=1000)).items) == 200
    finally:
        await reopened.close()
