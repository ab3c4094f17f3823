"""A writer killed with SIGKILL mid-stream of commits: every acknowledged commit survives, none is partial."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from harness_core.storage import JsonlStorage, PostgresStorage, SqliteStorage, Storage

# The writer: each commit appends 3 entries, replaces a task and adds one delta to a rewindable document, then
# prints its seq (the acknowledgement). It resumes from the stored seq, so it can be killed and restarted.
WRITER = """
import asyncio, sys
from harness_core.records import Conversation, DocumentContent, DocumentRecord, Entry, Task, TaskState
from harness_core.storage import CommitBatch, DocChange, DocCreate, JsonlStorage, PostgresStorage, SqliteStorage

async def main(kind, path):
    if kind == "postgres":  # path is the database URL; a killed writer's lease is waited out
        storage = await PostgresStorage.open(path, lease_ttl=1.0, on_standby=lambda holder: None)
    else:
        storage = await (SqliteStorage.open(path) if kind == "sqlite" else JsonlStorage.open(path, fsync=False))
    seq = (await storage.meta()).last_seq
    if seq == 0:
        record = DocumentRecord(id=2, kind="t.log", scope="conversation", scope_id=1, history="rewindable",
                                created_seq=1)
        await storage.commit([CommitBatch(seq=1, next_id=10, conversations=[Conversation(id=1)],
                                          doc_creates=[DocCreate(record=record, version=1, value=[])])])
        seq = 1
    padding = "x" * 2000  # big enough that a kill can land inside a write
    while True:
        seq += 1
        first = seq * 10
        entries = [Entry(id=first + i, conversation_id=1, kind="t.note", data={"seq": seq, "pad": padding},
                         seq=seq) for i in range(3)]
        task = Task(id=3, conversation_id=1, kind="t.work", state=TaskState(status="running"), seq=seq)
        change = DocChange(id=2, content=DocumentContent(seq=seq, version=1,
                                                         delta=[{"op": "add", "path": "/-", "value": seq}]))
        await storage.commit([CommitBatch(seq=seq, next_id=first + 10, entries=entries, tasks=[task],
                                          doc_changes=[change])])
        sys.stdout.write(f"{seq}\\n")
        sys.stdout.flush()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def open_store(kind: str, root: Path | str) -> Storage:
    if kind == "postgres":
        return await PostgresStorage.open(str(root), lease_ttl=1.0, on_standby=lambda holder: None)
    if kind == "sqlite":
        return await SqliteStorage.open(Path(root) / "crash.db")
    return await JsonlStorage.open(Path(root) / "crash")


async def run_and_kill(kind: str, root: Path | str, acks_wanted: int) -> list[int]:
    """Start the writer, read some acknowledgements, SIGKILL it; return the acknowledged seqs."""
    target = str(root) if kind == "postgres" else Path(root) / ("crash.db" if kind == "sqlite" else "crash")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WRITER, kind, str(target), stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    acked: list[int] = []
    try:
        for _ in range(acks_wanted):
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
            assert line, "the writer exited before it was killed"
            acked.append(int(line))
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return acked


async def check_complete(storage: Storage, acked: list[int]) -> list[int]:
    """Every acknowledged commit is stored whole and nothing of an unfinished one is. Returns the stored
    commits' seqs. (Seqs may skip after a restart: stores only promise never to reuse one.)"""
    meta = await storage.meta()
    entries = []
    cursor = None
    while True:
        page = await storage.scan_entries(1, order="asc", limit=500, cursor=cursor)
        entries.extend(page.items)
        cursor = page.cursor
        if cursor is None:
            break
    stored = sorted({e.seq for e in entries})
    assert set(acked) <= set(stored)  # every acknowledged commit is there
    # All or nothing: exactly the three entries of every stored commit, and nothing of a later one.
    assert [e.id for e in entries] == [seq * 10 + i for seq in stored for i in range(3)]
    assert all(e.seq == e.id // 10 for e in entries)
    task = await storage.task(3)
    assert task is not None
    assert task.seq == stored[-1]
    log = await storage.document(2)
    assert log is not None
    assert log.value == stored
    assert meta.last_seq >= stored[-1]  # a new writer never reuses a seq or a stored id
    # (An id minted but never stored, here the padding a batch's next_id leaves above its entries, was never
    # observable; SQLite continues right above the stored ids after a crash, so ids people see stay dense.)
    assert meta.next_id > max(e.id for e in entries)
    return stored


@pytest.mark.parametrize("kind", ["sqlite", "jsonl", "postgres"])
async def test_sigkill_mid_stream_loses_no_acknowledged_commit(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # PostgreSQL: a database of its own on the test cluster; the restarted writer waits out the dead one's lease.
    root: Path | str = request.getfixturevalue("pg_url") if kind == "postgres" else tmp_path
    stored: list[int] = []
    for acks_wanted in (30, 15):  # kill, recover, let a new writer continue the same store, kill again
        acked = await run_and_kill(kind, root, acks_wanted)
        assert min(acked) > (stored[-1] if stored else 0)
        storage = await open_store(kind, root)  # the kernel released the dead writer's lock
        try:
            stored = await check_complete(storage, acked)
        finally:
            await storage.close()
