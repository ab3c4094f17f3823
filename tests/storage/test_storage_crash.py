"""A writer killed with SIGKILL mid-stream of commits: every acknowledged commit survives, none is partial."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from harness_core.storage import JsonlStorage, SqliteStorage, Storage

# The writer: each commit appends 3 entries, replaces a task and adds one delta to a rewindable document, then
# prints its seq (the acknowledgement). It resumes from the stored seq, so it can be killed and restarted.
WRITER = """
import asyncio, sys
from harness_core.records import Conversation, DocumentContent, DocumentRecord, Entry, Task, TaskState
from harness_core.storage import CommitBatch, DocChange, DocCreate, JsonlStorage, SqliteStorage

async def main(kind, path):
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


async def open_store(kind: str, root: Path) -> Storage:
    if kind == "sqlite":
        return await SqliteStorage.open(root / "crash.db")
    return await JsonlStorage.open(root / "crash")


async def run_and_kill(kind: str, root: Path, acks_wanted: int) -> int:
    """Start the writer, read some acknowledgements, SIGKILL it; return the highest acknowledged seq."""
    target = root / ("crash.db" if kind == "sqlite" else "crash")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WRITER, kind, str(target), stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    acked = 0
    try:
        for _ in range(acks_wanted):
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
            assert line, "the writer exited before it was killed"
            acked = int(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return acked


async def check_complete(storage: Storage, acked: int) -> int:
    meta = await storage.meta()
    last = meta.last_seq
    assert last >= acked  # every acknowledged commit is there
    entries = []
    cursor = None
    while True:
        page = await storage.scan_entries(1, order="asc", limit=500, cursor=cursor)
        entries.extend(page.items)
        cursor = page.cursor
        if cursor is None:
            break
    # All or nothing: exactly the three entries of every stored commit, and nothing of a later one.
    assert [e.id for e in entries] == [seq * 10 + i for seq in range(2, last + 1) for i in range(3)]
    assert all(e.seq == e.id // 10 for e in entries)
    task = await storage.task(3)
    assert task is not None
    assert task.seq == last
    log = await storage.document(2)
    assert log is not None
    assert log.value == list(range(2, last + 1))
    assert meta.next_id == last * 10 + 10
    return last


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
async def test_sigkill_mid_stream_loses_no_acknowledged_commit(kind: str, tmp_path: Path) -> None:
    last = 0
    for acks_wanted in (30, 15):  # kill, recover, let a new writer continue the same store, kill again
        acked = await run_and_kill(kind, tmp_path, acks_wanted)
        assert acked > last
        storage = await open_store(kind, tmp_path)  # the kernel released the dead writer's lock
        try:
            last = await check_complete(storage, acked)
        finally:
            await storage.close()
