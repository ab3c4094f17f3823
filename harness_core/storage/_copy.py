"""Copy a stopped bot's SQLite store into an empty PostgreSQL database: every row as stored (ids, seqs,
document histories), in one transaction, then verify the row counts.

Both schemas keep each record as the same JSON text, so rows are copied verbatim (no record is re-serialized,
nothing is re-minted). The source is opened with its owner lock (a running bot makes this fail with
`StorageLocked`); the target with its lease, and it must hold no records.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite

from harness_core.errors import StorageError
from harness_core.storage._postgres import PostgresStorage
from harness_core.storage._postgres_lease import FENCE, Lease
from harness_core.storage._sqlite import SqliteStorage

_PARTITION = 0  # a SQLite store is one process's: it becomes a store of one partition (PostgresStorage.open)

# (table, SQLite columns read, PostgreSQL insert, index of the JSON column to encode). The partition column
# is filled with the single partition.
_TABLES: tuple[tuple[str, str, str, int], ...] = (
    (
        "conversations",
        "id, owner_task_id, record",
        "INSERT INTO conversations (id, owner_task_id, record, partition) VALUES ($1, $2, $3, $4)",
        2,
    ),
    (
        "entries",
        "id, conversation_id, head, record",
        "INSERT INTO entries (id, conversation_id, head, record, partition) VALUES ($1, $2, $3, $4, $5)",
        3,
    ),
    (
        "tasks",
        "id, conversation_id, kind, live, record",
        "INSERT INTO tasks (id, conversation_id, kind, live, record, partition) VALUES ($1, $2, $3, $4, $5, $6)",
        4,
    ),
    (
        "submissions",
        "id, conversation_id, request_id, status, record",
        "INSERT INTO submissions (id, conversation_id, request_id, status, record, partition) "
        "VALUES ($1, $2, $3, $4, $5, $6)",
        4,
    ),
    (
        "doc_records",
        "id, kind, scope, scope_id, key, rewindable, created_seq, retired_seq, record",
        "INSERT INTO doc_records (id, kind, scope, scope_id, key, rewindable, created_seq, retired_seq, record, "
        "partition) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        8,
    ),
    (
        "doc_contents",
        "doc_id, seq, part, is_base, content",
        "INSERT INTO doc_contents (doc_id, seq, part, is_base, content) VALUES ($1, $2, $3, $4, $5)",
        4,
    ),
)
_BOOLEAN_COLUMNS = {"tasks": (3,), "doc_records": (5,), "doc_contents": (3,)}


@dataclass
class CopyReport:
    """What was copied: rows per table (equal in source and target, checked) and the id/seq counters."""

    source: str
    target: str
    rows: dict[str, int] = field(default_factory=dict)
    next_id: int = 0
    last_seq: int = 0

    def summary(self) -> str:
        counts = ", ".join(f"{n} {table}" for table, n in self.rows.items())
        return f"copied {counts} from {self.source} to {self.target}; counts verified"


def _convert(table: str, row: tuple[Any, ...], json_index: int) -> tuple[Any, ...]:
    values = list(row)
    for index in _BOOLEAN_COLUMNS.get(table, ()):
        values[index] = bool(values[index])
    text = values[json_index]
    values[json_index] = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    if table != "doc_contents":
        values.append(_PARTITION)
    return tuple(values)


async def copy_sqlite_to_postgres(sqlite_path: str | Path, dsn: str) -> CopyReport:
    """Copy the SQLite store at `sqlite_path` into the empty PostgreSQL database `dsn`.

    Refuses a target that holds any record (`StorageError`), and a source a running process owns
    (`StorageLocked`). Nothing is written to the target unless the whole copy succeeds.
    """
    path = await asyncio.to_thread(Path(sqlite_path).absolute)
    if not await asyncio.to_thread(path.exists):  # open() would create an empty one
        raise StorageError(f"there is no SQLite store at {path}")
    source = await SqliteStorage.open(path)  # the owner lock: the bot must be stopped; also migrates it
    try:
        meta = await source.meta()
        target = await PostgresStorage.open(dsn)
        try:
            return await _copy(source.description, path, target, meta.next_id, meta.last_seq)
        finally:
            await target.close()
    finally:
        await source.close()


async def _copy(
    source_description: str, path: Path, target: PostgresStorage, next_id: int, last_seq: int
) -> CopyReport:
    report = CopyReport(
        source=source_description, target=target.description, next_id=next_id, last_seq=last_seq
    )
    lease = target.lease
    assert lease is not None
    async with target.store.pool.acquire() as writer:
        await _copy_rows(source_description, path, target, writer, lease, next_id, last_seq, report)
    # The target's cached counters must not write the old (empty) values back at close.
    target._next_id, target._last_seq, target._reserved = next_id, last_seq, (next_id, last_seq)
    return report


async def _copy_rows(
    source_description: str,
    path: Path,
    target: PostgresStorage,
    writer: Any,
    lease: Lease,
    next_id: int,
    last_seq: int,
    report: CopyReport,
) -> None:
    for table, *_ in _TABLES:
        if await writer.fetchval(f"SELECT EXISTS (SELECT 1 FROM {table})"):
            raise StorageError(
                f"storage {target.description} already holds records ({table}); migrate only into an empty "
                "database"
            )
    rows: dict[str, list[tuple[Any, ...]]] = {}
    reader = await aiosqlite.connect(f"file:{path}?mode=ro", uri=True)
    try:
        for table, columns, _, json_index in _TABLES:
            order = "doc_id, seq, part" if table == "doc_contents" else "id"
            async with reader.execute(f"SELECT {columns} FROM {table} ORDER BY {order}") as cursor:
                rows[table] = [_convert(table, tuple(r), json_index) for r in await cursor.fetchall()]
    except sqlite3.Error as exc:
        raise StorageError(f"storage {source_description}: reading it failed: {exc}") from exc
    finally:
        await reader.close()
    async with writer.transaction():
        if await writer.fetchval(FENCE, lease.partition, lease.holder) != lease.epoch:
            raise StorageError(f"storage {target.description}: lost the lease while copying")
        for table, _, insert, _ in _TABLES:
            if rows[table]:
                await writer.executemany(insert, rows[table])
        await writer.execute(
            "UPDATE meta SET next_id = $2, last_seq = $3 WHERE partition = $1", _PARTITION, next_id, last_seq
        )
        for table, *_ in _TABLES:
            stored = int(await writer.fetchval(f"SELECT count(*) FROM {table}"))
            if stored != len(rows[table]):
                raise StorageError(
                    f"copy check failed: {table} has {stored} rows in the target, {len(rows[table])} in the source"
                )
            report.rows[table] = stored
