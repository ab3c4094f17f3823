"""The ingress put line: a store's ingress puts committed together, on a connection of their own.

A put is what a worker waits for before it acknowledges a platform event, so it must not queue behind the
harness commits and reads of 64 partitions for one of the pool's connections. Puts made while a write is in
flight wait for the next one, which inserts all of them in one statement (one transaction, one WAL flush for
many events): under load the put rate is no longer one commit per event. Each put still returns only once its
row is committed, and says whether it was new (`ON CONFLICT (key) DO NOTHING`; within one write a repeated key
is new for its first put only). Ids follow the order the puts were made; rows are inserted in key order, so two
workers' writes sharing keys never deadlock.

A write the server aborted to break a deadlock anyway (with a writer that does not keep key order) is repeated,
after the server's `deadlock_timeout`. Any other write that fails (the
connection dropped, the server is gone) fails every put in it; the connection is dropped and the next write
connects again. A put whose commit was uncertain is safe to repeat: its key makes
it exactly once. `close` fails the puts still queued and closes the connection. Owned by the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from harness_core.errors import StorageClosed
from harness_core.storage._postgres_owned import close_connection, end_task

MAX_WRITE = 500  # puts per statement: bounds the statement while a burst is queued
DEADLOCK_RETRIES = 5  # a write the server aborted to break a deadlock is repeated this many times at most

# Ids are drawn in the order the puts were made, then rows are inserted in key order: two writers (workers) whose
# batches share keys insert them in one order, so one waits for the other's commit instead of each waiting for
# the other's row (a deadlock, which the server breaks only after `deadlock_timeout`, a second by default).
PUT_MANY = """
WITH u AS MATERIALIZED (
    SELECT k, p, t, d, n, nextval('ingress_id_seq'::regclass) AS id
    FROM unnest($1::text[], $2::int[], $3::text[], $4::text[]) WITH ORDINALITY AS u(k, p, t, d, n)
    ORDER BY n
)
INSERT INTO ingress (id, key, partition, kind, payload, created_at) OVERRIDING SYSTEM VALUE
SELECT id, k, p, t, d, (extract(epoch FROM clock_timestamp()) * 1000)::bigint
FROM u ORDER BY k COLLATE "C", n
ON CONFLICT (key) DO NOTHING RETURNING key
"""


@dataclass
class _Put:
    key: str
    partition: int
    kind: str
    payload: str
    done: asyncio.Future[bool]


class PutLine:
    def __init__(self, connect: Callable[[], Awaitable[Any]], description: str) -> None:
        self._connect = connect
        self._description = description
        self._queue: list[_Put] = []
        self._event: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._conn: Any = None
        self._closed = False
        self.writes = 0  # statements written (tests, metrics)
        self.deadlocks = 0  # writes repeated after the server broke a deadlock with another writer

    async def put(self, key: str, partition: int, kind: str, payload: str) -> bool:
        """Commit one record (with the others queued meanwhile); True if its key was new."""
        if self._closed:
            raise StorageClosed(f"storage {self._description} is closed")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        done.add_done_callback(_retrieve)  # a cancelled caller leaves nobody to read a failure
        self._queue.append(_Put(key, partition, kind, payload, done))
        if self._task is None:
            self._event = asyncio.Event()
            self._task = loop.create_task(self._run(), name="ingress-puts")
        assert self._event is not None
        self._event.set()
        # The write goes on if the caller is cancelled: the record is committed (or not) as a whole.
        return await asyncio.shield(done)

    async def _run(self) -> None:
        assert self._event is not None
        while True:
            await self._event.wait()
            self._event.clear()
            while self._queue:
                batch, self._queue = self._queue[:MAX_WRITE], self._queue[MAX_WRITE:]
                try:
                    new = await self._write(batch)
                except BaseException as exc:  # closing included: no put is left waiting
                    error = (
                        exc
                        if isinstance(exc, Exception)
                        else StorageClosed(f"storage {self._description} is closed")
                    )
                    for item in batch:
                        if not item.done.done():
                            item.done.set_exception(error)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for item in batch:
                    fresh = item.key in new
                    new.discard(item.key)  # a key repeated in this write is new for its first put only
                    if not item.done.done():
                        item.done.set_result(fresh)

    async def _write(self, batch: list[_Put]) -> set[str]:
        if self._conn is None or self._conn.is_closed():
            self._conn = await self._connect()
        args = (
            [p.key for p in batch],
            [p.partition for p in batch],
            [p.kind for p in batch],
            [p.payload for p in batch],
        )
        try:
            for attempt in range(DEADLOCK_RETRIES + 1):
                try:
                    rows = await self._conn.fetch(PUT_MANY, *args)
                    break
                except asyncpg.DeadlockDetectedError:
                    # Put lines insert in key order, so only a writer that does not (a hand-run statement, an
                    # older release during a rolling deploy) can make each wait for the other's row. The
                    # server aborts one whole statement; repeating it is safe, as its keys make every row
                    # exactly once, and the connection is still good.
                    if attempt == DEADLOCK_RETRIES:
                        raise
                    self.deadlocks += 1
        except BaseException:
            conn, self._conn = self._conn, None
            conn.terminate()  # its state is unknown: the next write connects afresh
            raise
        self.writes += 1
        return {str(row[0]) for row in rows}

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        await end_task(task)
        for item in self._queue:
            if not item.done.done():
                item.done.set_exception(StorageClosed(f"storage {self._description} is closed"))
        self._queue.clear()
        conn, self._conn = self._conn, None
        await close_connection(conn)


def _retrieve(future: asyncio.Future[bool]) -> None:
    if not future.cancelled():
        future.exception()
