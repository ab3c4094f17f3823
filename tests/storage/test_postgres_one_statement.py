"""A PostgreSQL commit is one statement (`_postgres_commit`) whose parts cannot see each other's rows; SQLite
applies the same plan statement by statement. Whatever a commit holds (a task or submission changed by two
batches, a document created, changed, rebased and retired within one commit, current-only and rewindable
ones), both must end with the same rows. Differential, with random commits; and a retire of a document that
does not exist refuses the whole commit."""

from __future__ import annotations

import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pg_partition_support import expire, open_handle

from harness_core.errors import LeaseLost, StorageError
from harness_core.records import Conversation, DocumentContent
from harness_core.storage import CommitBatch, PostgresStorage, PostgresStore, SqliteStorage
from harness_core.storage._protocol import DocChange
from harness_core.testing._storage_conformance import base, conv, create, delta, doc, entry, sub, task

COLUMNS = {
    "conversations": ("id", "owner_task_id, record"),
    "entries": ("id", "conversation_id, head, record"),
    "tasks": ("id", "conversation_id, kind, live, record"),
    "submissions": ("id", "conversation_id, request_id, status, record"),
    "doc_records": ("id", "kind, scope, scope_id, key, rewindable, created_seq, retired_seq, record"),
    "doc_contents": ("doc_id", "seq, part, is_base, content"),
}

KINDS = ("conversation", "entry", "task", "submission", "doc", "delta", "base", "retire")
OPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 40), st.booleans()), max_size=7)
COMMITS = st.lists(st.lists(OPS, min_size=1, max_size=4), min_size=1, max_size=6)


@dataclass
class Script:
    """Turns drawn (kind, pick, flag) triples into valid batches, ids from `next_id` on."""

    next_id: int
    seq: int
    conversations: list[int] = field(default_factory=list)
    tasks: list[int] = field(default_factory=list)
    submissions: list[int] = field(default_factory=list)
    alive_docs: list[int] = field(default_factory=list)

    def mint(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def batch(self, ops: list[tuple[str, int, bool]]) -> CommitBatch:
        self.seq += 1
        b = CommitBatch(seq=self.seq, next_id=0)
        changeable = list(self.alive_docs)  # created in an earlier batch
        retiring: list[int] = []
        for kind, pick, flag in ops:
            if kind != "conversation" and not self.conversations:
                kind = "conversation"
            if kind == "conversation":
                self.conversations.append(self.mint())
                b.conversations.append(conv(self.conversations[-1]))
            elif kind == "entry":
                b.entries.append(entry(self.mint(), self.conversations[pick % len(self.conversations)]))
            elif kind == "task":
                index = pick % (len(self.tasks) + 1)
                if index == len(self.tasks):
                    self.tasks.append(self.mint())
                status = "terminal" if flag else "pending"
                b.tasks.append(task(self.tasks[index], self.conversations[0], status=status, seq=self.seq))
            elif kind == "submission":
                index = pick % (len(self.submissions) + 1)
                if index == len(self.submissions):
                    self.submissions.append(self.mint())
                s = self.submissions[index]
                b.submissions.append(
                    sub(s, self.conversations[0], request_id=f"r{s}", status="done" if flag else "queued")
                )
            elif kind == "doc":
                record = doc(
                    self.mint(),
                    self.seq,
                    scope="conversation",
                    scope_id=self.conversations[pick % len(self.conversations)],
                    history="rewindable" if flag else "latest",
                )
                b.doc_creates.append(create(record, {"n": pick}))
                self.alive_docs.append(record.id)
            elif kind in ("delta", "base") and changeable:
                doc_id = changeable[pick % len(changeable)]
                if kind == "base":
                    content = DocumentContent(seq=self.seq, version=1, base={"n": pick})
                else:
                    content = DocumentContent(
                        seq=self.seq, version=1, delta=[{"op": "add", "path": "/m", "value": pick}]
                    )
                b.doc_changes.append(DocChange(id=doc_id, content=content))
            elif kind == "retire" and changeable:
                doc_id = changeable.pop(pick % len(changeable))
                retiring.append(doc_id)
        b.doc_retires = retiring
        self.alive_docs = [d for d in self.alive_docs if d not in retiring]
        b.next_id = self.next_id
        return b


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, bool):
        return int(value)
    return value


async def pg_rows(url: str, start: int) -> dict[str, list[tuple[Any, ...]]]:
    conn = await asyncpg.connect(url)
    try:
        found = {}
        for table, (key, rest) in COLUMNS.items():
            rows = await conn.fetch(
                f"SELECT {key}, {rest} FROM {table} WHERE {key} >= $1 ORDER BY 1, 2, 3", start
            )
            found[table] = [tuple(_plain(v) for v in row) for row in rows]
        return found
    finally:
        await conn.close()


def sqlite_rows(path: Path, start: int) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(path) as conn:
        return {
            table: [
                tuple(_plain(v) for v in row)
                for row in conn.execute(
                    f"SELECT {key}, {rest} FROM {table} WHERE {key} >= ? ORDER BY 1, 2, 3", (start,)
                )
            ]
            for table, (key, rest) in COLUMNS.items()
        }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(commits=COMMITS)
async def test_one_statement_ends_with_the_rows_statement_by_statement_would(
    pg_url: str, commits: list[list[list[tuple[str, int, bool]]]]
) -> None:
    # One database for every example: each starts where the last one's ids and seqs ended.
    pg = await PostgresStorage.open(pg_url)
    try:
        meta = await pg.meta()
        start = max(meta.next_id, 1)
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "store.db"
            lite = await SqliteStorage.open(path)
            try:
                script = Script(next_id=start, seq=meta.last_seq)
                for ops_per_batch in commits:
                    batches = [script.batch(ops) for ops in ops_per_batch]
                    await lite.commit(batches)
                    await pg.commit(batches)
            finally:
                await lite.close()
            expected = sqlite_rows(path, start)
        assert await pg_rows(pg_url, start) == expected
    finally:
        await pg.close()


async def test_a_retire_of_an_unknown_document_refuses_the_whole_commit(pg_url: str) -> None:
    pg = await PostgresStorage.open(pg_url)
    try:
        await pg.commit([CommitBatch(seq=1, next_id=3, conversations=[Conversation(id=1)])])
        refused = CommitBatch(seq=2, next_id=5, conversations=[Conversation(id=3)], doc_retires=[99])
        with pytest.raises(StorageError, match=r"commit retires an unknown document \(ids \[99\]\)"):
            await pg.commit([refused])
        assert await pg.conversation(3) is None  # nothing of it landed
        await pg.commit([CommitBatch(seq=2, next_id=5, conversations=[Conversation(id=3)])])
        assert await pg.conversation(3) is not None
    finally:
        await pg.close()


async def test_the_commit_statement_is_planned_once_not_on_every_commit(pg_url: str) -> None:
    # PostgreSQL's default would plan this many-part statement anew on every execution (custom plans): most of
    # the server's work per commit. The store's connections use generic plans. (The first commit also writes
    # the meta reservation: a statement of its own shape.)
    store = await PostgresStore.open(pg_url, partitions=1, pool_size=1)  # every commit on the same connection
    try:
        handle = await open_handle(store, 0)
        for seq in range(1, 11):
            await handle.commit([CommitBatch(seq=seq, next_id=seq + 1, conversations=[Conversation(id=seq)])])
        async with store.pool.acquire() as conn:
            plans = await conn.fetchrow(
                "SELECT sum(generic_plans) AS generic_plans, sum(custom_plans) AS custom_plans "
                "FROM pg_prepared_statements WHERE statement LIKE 'WITH fence AS%'"
            )
        assert plans is not None
        assert (plans["generic_plans"], plans["custom_plans"]) == (10, 0)
        await handle.close()
    finally:
        await store.close()


async def test_a_fenced_out_commit_writes_nothing_in_any_part(pg_url: str) -> None:
    # Every part of the statement is guarded by the fence, not only the first: a commit that touches every
    # table (and the meta reservation) from a holder whose lease was taken over leaves every row as it was.
    old_store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=30)
    new_store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=30)
    try:
        old = await open_handle(old_store, 1)
        kept = doc(5, 1, scope="conversation", scope_id=1)
        await old.commit(
            [CommitBatch(seq=1, next_id=9, conversations=[conv(1)], doc_creates=[create(kept, {"n": 0})])]
        )
        await old.commit(
            [
                CommitBatch(
                    seq=2, next_id=9, doc_changes=[delta(5, 2, {"op": "add", "path": "/m", "value": 1})]
                )
            ]
        )
        before = await pg_rows(pg_url, 0)
        conn = await asyncpg.connect(pg_url)
        meta_before = await conn.fetch("SELECT * FROM meta ORDER BY partition")
        await expire(pg_url, 1)
        new = await open_handle(new_store, 1)
        everything = [
            CommitBatch(
                seq=3,
                next_id=99_999,  # past the reservation: the meta row would be written too
                conversations=[conv(9)],
                entries=[entry(13, 1)],
                tasks=[task(17, 1)],
                submissions=[sub(21, 1, request_id="r")],
                doc_creates=[create(doc(25, 3, scope="conversation", scope_id=1), {"n": 1})],
                doc_changes=[base(5, 3, {"n": 2})],
                doc_retires=[5],
            )
        ]
        with pytest.raises(LeaseLost, match="partition 1"):
            await old.commit(everything)
        assert await pg_rows(pg_url, 0) == before
        assert await conn.fetch("SELECT * FROM meta ORDER BY partition") == meta_before
        await conn.close()
        await new.close()
    finally:
        await old_store.close()
        await new_store.close()
