"""`SqliteStorage.open_read_only` and `Harness.open(read_only=True)`: operators read beside the owner."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from harness_core import Harness, InvalidOperation
from harness_core.errors import StorageError, StorageRequestError
from harness_core.records import Conversation, Task, TaskState
from harness_core.storage import CommitBatch, SqliteStorage

ROOT = Path(__file__).resolve().parents[2]


def batch(seq: int, conversation: int) -> CommitBatch:
    state = TaskState(status="running")
    return CommitBatch(
        seq=seq,
        next_id=conversation + 2,
        conversations=[Conversation(id=conversation)],
        tasks=[Task(id=conversation + 1, conversation_id=conversation, kind="t.work", state=state)],
    )


async def test_a_read_only_handle_beside_the_owner_sees_one_snapshot_and_writes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.sqlite"
    owner = await SqliteStorage.open(path)
    try:
        await owner.commit([batch(1, 10)])
        reader = await SqliteStorage.open_read_only(path)  # no StorageLocked: it takes no lock
        try:
            await owner.commit([batch(2, 20)])  # after the reader's snapshot
            assert [c.id for c in (await reader.scan_conversations()).items] == [10]
            assert await reader.conversation(20) is None
            with pytest.raises(StorageRequestError, match="read-only"):
                await reader.commit([batch(3, 30)])
        finally:
            await reader.close()
        later = await SqliteStorage.open_read_only(path)
        try:
            assert [c.id for c in (await later.scan_conversations()).items] == [10, 20]
        finally:
            await later.close()
        await owner.commit([batch(3, 30)])  # the owner never noticed
    finally:
        await owner.close()


async def test_read_only_open_after_a_crash_reads_the_wal_and_refuses_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    script = (
        "import asyncio, os, sys\n"
        "sys.path.insert(0, os.getcwd())\n"
        "from harness_core.storage import SqliteStorage\n"
        "from tests.storage.test_sqlite_read_only import batch\n"
        "async def main():\n"
        f"    s = await SqliteStorage.open({str(path)!r})\n"
        "    await s.commit([batch(1, 10)])\n"
        "    os._exit(9)\n"
        "asyncio.run(main())\n"
    )
    done = await asyncio.create_subprocess_exec(sys.executable, "-c", script, cwd=ROOT)
    assert await done.wait() == 9
    assert (tmp_path / "s.sqlite-wal").stat().st_size > 0  # the commit lives only in the WAL
    before = path.stat().st_size, os.stat(path).st_mtime_ns
    reader = await SqliteStorage.open_read_only(path)
    try:
        assert [c.id for c in (await reader.scan_conversations()).items] == [10]
    finally:
        await reader.close()
    assert (path.stat().st_size, os.stat(path).st_mtime_ns) == before  # the database file is untouched
    with pytest.raises(StorageError, match="there is no storage"):
        await SqliteStorage.open_read_only(tmp_path / "missing.sqlite")


async def test_a_read_only_harness_shows_tasks_as_stored_and_refuses_to_commit(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    owner = await SqliteStorage.open(path)
    try:
        await owner.commit([batch(1, 10)])
        harness = await Harness.open(await SqliteStorage.open_read_only(path), read_only=True)
        try:
            inspection = await harness.inspect()
            # A reconciling open would have counted a crash restart and set it back to pending.
            assert [(t.record.id, t.state, t.record.restarts) for t in inspection.tasks] == [
                (11, "running", 0)
            ]
            with pytest.raises(InvalidOperation):
                await harness.commit(lambda tx: None)
            with pytest.raises(InvalidOperation):
                harness.resume()
        finally:
            await harness.close()
        stored = await owner.task(11)
        assert stored is not None and stored.state.status == "running" and stored.restarts == 0
    finally:
        await owner.close()
