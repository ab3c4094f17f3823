"""A PostgreSQL store shared by many workers: the store-wide side of partitions (§9 of the design).

A `PostgresStore` is what one worker process holds of a store: one connection pool (reads, commits and the
short store-wide statements of every partition it owns), one connection renewing every lease it holds in one
statement (`LeaseRenewer`), and one LISTEN connection (`Notifications`). So 64 owned partitions cost
`pool_size + 3` connections (the third: ingress puts, `PutLine`, opened by the first put), not one writer and
one renewal connection each.

- `open_partition(p)` takes p's lease and returns a `PostgresStorage` bound to p (its own fencing, commit order
  and ids), or the current holder. Closing the handle writes p's meta and releases the lease (NOTIFY); the
  store's connections stay open.
- `take_resource(rid)` leases something that is not a partition (a Discord shard s as `-1 - s`): renewed and
  released the same way, with no records behind it.
- Ingress and workers: see `_postgres_ingress`.

The partition count is fixed when the store is created; an open naming another count is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any

import asyncpg

from harness_core.errors import StorageClosed, StorageCorrupt, StorageError, StorageRequestError
from harness_core.storage._postgres import PostgresStorage, redact_url, url_is_ambiguous, url_secrets
from harness_core.storage._postgres_ingress import (
    DROP_INGRESS,
    FINISH_INGRESS,
    HEARTBEAT,
    INGRESS_CHANNEL,
    LEAVE,
    LIVE_WORKERS,
    PENDING_INGRESS,
    PRUNE_INGRESS,
    WAKE_INGRESS,
    WORKERS_CHANNEL,
    IngressRecord,
    WorkerInfo,
    check_ingress_text,
    ingress_from_row,
    ingress_payload_text,
    worker_from_row,
)
from harness_core.storage._postgres_lease import (
    RELEASED_CHANNEL,
    Lease,
    LeaseHolder,
    LeaseRenewer,
    give_back,
    lease_error,
    new_holder_id,
    try_take,
)
from harness_core.storage._postgres_listen import Notifications
from harness_core.storage._postgres_put import PutLine
from harness_core.storage._postgres_requests import PRUNE as PRUNE_REQUESTS
from harness_core.storage._postgres_requests import WAITING as OPERATOR_REQUESTS_WAITING
from harness_core.storage._postgres_schema import SCHEMA_VERSION, migrate, store_partitions, stored_version
from harness_core.storage._postgres_wake import Waker
from harness_core.storage._protocol import StorageMeta

log = logging.getLogger("harness_core.storage")

_DRIVER_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, asyncio.TimeoutError)
_APP = "durable-bots"

ResourceLease = Lease  # a lease of a non-partition resource (negative id): same API, no records behind it

_LEASES = """
SELECT partition, holder, pid, host, epoch, GREATEST(0, EXTRACT(EPOCH FROM expires_at - now()))::float8
FROM leases WHERE holder IS NOT NULL AND expires_at > now()
"""


def first_id(partition: int, partitions: int) -> int:
    """The smallest id >= 1 of a partition (`id % partitions == partition`); the session skips id 1 (the
    root conversation's) by itself."""
    return partition if partition >= 1 else partitions


class PostgresStore:
    """A worker's handle on a whole store. Open with `await PostgresStore.open(dsn, partitions=n)`."""

    def __init__(
        self,
        description: str,
        pool: asyncpg.Pool,
        connect: Callable[[str], Any],
        *,
        partitions: int,
        holder: str,
        lease_ttl: float,
        read_only: bool = False,
    ) -> None:
        self.description = description
        self.pool = pool
        self.partitions = partitions
        self.holder = holder
        self.lease_ttl = lease_ttl
        self.read_only = read_only
        self._connect = connect
        self._renewer = LeaseRenewer(lambda: connect("lease renewal"), description, holder, lease_ttl)
        self._notifications = Notifications(lambda: connect("listen"), description)
        self._handles: dict[int, PostgresStorage] = {}
        self._closed = False
        self.waker = Waker(self._wake_owners)  # the one background task that NOTIFYs after puts
        self.puts = PutLine(lambda: connect("ingress"), description)  # puts: own connection, grouped

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        partitions: int,
        lease_ttl: float = 10.0,
        pool_size: int = 8,
        connect_timeout: float = 10.0,
        holder: str | None = None,
    ) -> PostgresStore:
        """Connect, migrate the schema, check (or, for a new store, record) the partition count."""
        if type(partitions) is not int or partitions < 1:
            raise ValueError(f"partitions must be a positive int, not {partitions!r}")
        if lease_ttl <= 0:
            raise ValueError(f"lease_ttl must be positive, not {lease_ttl!r}")
        store = await cls._connect_pool(dsn, pool_size, connect_timeout, lease_ttl, holder, partitions)
        try:
            async with store.pool.acquire() as conn:
                await migrate(conn, store.description)
                store.partitions = await store_partitions(conn, store.description, partitions)
        except _DRIVER_ERRORS as exc:
            await store.close()
            raise StorageError(f"storage {store.description}: open failed: {exc}") from exc
        except BaseException:
            await store.close()
            raise
        return store

    @classmethod
    async def open_read_only(cls, dsn: str, *, connect_timeout: float = 10.0) -> PostgresStore:
        """No migration and no lease: reads, operator requests, `leases()`, `live_workers()`."""
        store = await cls._connect_pool(dsn, 2, connect_timeout, 10.0, None, 1)
        store.read_only = True
        try:
            async with store.pool.acquire() as conn:
                version = await stored_version(conn)
                if version is not None and version > SCHEMA_VERSION:
                    raise StorageError(
                        f"storage {store.description} has schema version {version}, newer than this build "
                        f"knows ({SCHEMA_VERSION}); upgrade durable-bots"
                    )
                if version != SCHEMA_VERSION:
                    found = "no harness store" if version is None else f"schema version {version}"
                    raise StorageError(
                        f"storage {store.description} holds {found} (this build reads version "
                        f"{SCHEMA_VERSION}); start the bot once to create or migrate it"
                    )
                store.partitions = await store_partitions(conn, store.description, None)
        except _DRIVER_ERRORS as exc:
            await store.close()
            raise StorageError(f"storage {store.description}: open failed: {exc}") from exc
        except BaseException:
            await store.close()
            raise
        return store

    @classmethod
    async def _connect_pool(
        cls,
        dsn: str,
        pool_size: int,
        connect_timeout: float,
        lease_ttl: float,
        holder: str | None,
        partitions: int,
    ) -> PostgresStore:
        description = redact_url(dsn)
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=1,
                max_size=max(pool_size, 1),
                timeout=connect_timeout,
                command_timeout=60,
                server_settings={"application_name": _APP},
                init=_generic_plans,
                reset=_keep_session,
            )
        except _DRIVER_ERRORS as exc:
            raise StorageError(f"cannot open storage {description}: {_reason(exc, dsn)}") from exc
        except ValueError as exc:  # a malformed DSN
            raise StorageError(f"storage url {description} is not valid: {_reason(exc, dsn)}") from exc

        def connect(purpose: str) -> Any:
            # The renewal and LISTEN connections are the store's own (never from the pool), named for
            # operators looking at pg_stat_activity.
            return asyncpg.connect(
                dsn,
                timeout=connect_timeout,
                command_timeout=60,
                server_settings={"application_name": f"{_APP} {purpose}"},
            )

        return cls(
            description,
            pool,
            connect,
            partitions=partitions,
            holder=holder or new_holder_id(),
            lease_ttl=lease_ttl,
        )

    # --- partitions and leases ----------------------------------------------------------------------------

    def _check(self) -> None:
        if self._closed:
            raise StorageClosed(f"storage {self.description} is closed")

    def _check_writable(self) -> None:
        self._check()
        if self.read_only:
            raise StorageError(f"storage {self.description} is open read-only")

    async def open_partition(self, partition: int) -> PostgresStorage | LeaseHolder:
        """Take `partition`'s lease and return a storage bound to it, or the live holder when it is taken."""
        self._check_writable()
        if type(partition) is not int or not 0 <= partition < self.partitions:
            raise StorageRequestError(
                f"partition {partition!r} is not one of this store's (0 to {self.partitions - 1})"
            )
        if partition in self._handles:
            raise StorageRequestError(
                f"partition {partition} is already open in this process; close it first"
            )
        lease = await self._take(partition)
        if isinstance(lease, LeaseHolder):
            return lease
        try:
            async with self.pool.acquire() as conn:
                await conn.execute(
                    "INSERT INTO meta (partition, next_id, last_seq) VALUES ($1, $2, 0) ON CONFLICT DO NOTHING",
                    partition,
                    first_id(partition, self.partitions),
                )
                meta = await _read_meta(conn, partition)
        except BaseException as exc:
            await lease.release()
            if isinstance(exc, _DRIVER_ERRORS):
                raise StorageError(
                    f"storage {self.description}: opening partition {partition} failed: {exc}"
                ) from exc
            raise
        if self._closed:  # closed while we read the meta: a handle nobody would close
            await lease.release()
            self._check()
        handle = PostgresStorage(self, partition, lease, meta, owns_store=False)
        self._handles[partition] = handle
        return handle

    async def wait_partition(
        self, partition: int, on_standby: Callable[[LeaseHolder], None] | None
    ) -> PostgresStorage:
        """`open_partition`, but when taken: raise `StorageLocked` (no `on_standby`), or call `on_standby` once
        with the holder and wait until it is free (a release wakes us at once; polling covers an expiry)."""
        released = asyncio.Event()
        unsubscribe: Callable[[], None] | None = None

        def wake(payload: str) -> None:
            if payload == str(partition):
                released.set()

        try:
            while True:
                released.clear()
                got = await self.open_partition(partition)
                if isinstance(got, PostgresStorage):
                    return got
                if on_standby is None:
                    raise lease_error(self.description, got)
                self._check()  # closed while we asked: wait for nothing
                if unsubscribe is None:
                    unsubscribe = self._notifications.subscribe(RELEASED_CHANNEL, wake)
                    await self._notifications.ready()
                    on_standby(got)
                    continue  # released between the first try and LISTEN: try again before waiting
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(released.wait(), min(0.5, self.lease_ttl / 4))
        finally:
            if unsubscribe is not None:
                unsubscribe()

    async def take_resource(self, resource: int) -> ResourceLease | LeaseHolder:
        """Lease a resource that is not a partition (negative ids: a Discord shard s is `-1 - s`): renewed
        with the store's partitions, released with `release()`. No fencing: it guards no records."""
        self._check_writable()
        if type(resource) is not int or resource >= 0:
            raise StorageRequestError(
                f"resource lease ids are negative (a shard s is -1 - s), not {resource!r}"
            )
        return await self._take(resource)

    async def _take(self, lease_id: int) -> Lease | LeaseHolder:
        try:
            async with self.pool.acquire() as conn:
                got = await try_take(conn, lease_id, self.holder, self.lease_ttl)
                if self._closed and not isinstance(got, LeaseHolder):
                    # The store closed while we waited: nobody would renew or release this lease.
                    await give_back(conn, lease_id, self.holder, got[0])
                    self._check()
        except _DRIVER_ERRORS as exc:
            raise StorageError(f"storage {self.description}: taking lease {lease_id} failed: {exc}") from exc
        if isinstance(got, LeaseHolder):
            return got
        epoch, sent = got
        margin = min(2.0, self.lease_ttl / 5)
        lease = Lease(
            self.pool,
            self.description,
            lease_id,
            self.holder,
            epoch,
            sent,
            self.lease_ttl,
            margin,
            self._renewer,
        )
        lease.start()
        return lease

    def held(self) -> dict[int, Lease]:
        """The leases this store holds now (partitions and resources), by id."""
        return {lease.partition: lease for lease in self._renewer.held()}

    async def leases(self) -> dict[int, LeaseHolder | None]:
        """Every partition (None when free) and every held resource lease, with its live holder."""
        self._check()
        rows = await self._call("read leases", lambda conn: conn.fetch(_LEASES))
        found: dict[int, LeaseHolder | None] = dict.fromkeys(range(self.partitions))
        for row in rows:
            found[int(row[0])] = LeaseHolder(
                holder=row[1], pid=row[2], host=row[3], epoch=int(row[4]), expires_in=float(row[5])
            )
        return found

    async def read_meta(self, partition: int) -> StorageMeta:
        """A partition's stored meta ((1, 0) for one never opened)."""
        row = await self._call("read meta", lambda conn: conn.fetchrow(_META, partition))
        if row is None:
            return StorageMeta(next_id=first_id(partition, self.partitions), last_seq=0)
        return StorageMeta(next_id=int(row[0]), last_seq=int(row[1]))

    def reader(self) -> PostgresStorage:
        """A read-only view of every partition on this store's pool: no lease, no fence, commits refused.
        Cross-partition reads (`search_history` over other channels) use it: they never wait for, or block, a
        partition's commit. Closing it leaves the store open."""
        self._check()
        return PostgresStorage(self, None, None, StorageMeta(next_id=0, last_seq=0), owns_store=False)

    def forget(self, handle: PostgresStorage) -> None:
        """A handle closed (called by its `close()`)."""
        if handle.partition is not None and self._handles.get(handle.partition) is handle:
            del self._handles[handle.partition]

    # --- workers -------------------------------------------------------------------------------------------

    async def heartbeat(self, *, draining: bool = False) -> None:
        """Say this worker is alive (for `lease_ttl` from now); a new row, a return after expiry or a change
        of `draining` NOTIFYs the other workers."""
        self._check_writable()

        async def beat(conn: asyncpg.pool.PoolConnectionProxy) -> None:
            news = await conn.fetchval(
                HEARTBEAT, self.holder, os.getpid(), socket.gethostname(), self.lease_ttl, draining
            )
            if news:
                await conn.execute("SELECT pg_notify($1, $2)", WORKERS_CHANNEL, self.holder)

        await self._call("write the worker heartbeat", beat)

    async def live_workers(self) -> list[WorkerInfo]:
        """Workers whose heartbeat has not expired, sorted by holder."""
        self._check()
        rows = await self._call("read workers", lambda conn: conn.fetch(LIVE_WORKERS))
        return [worker_from_row(row) for row in rows]

    async def leave(self) -> None:
        """Remove this worker's row at once (NOTIFY), so the others rebalance without waiting for expiry."""
        self._check_writable()

        async def go(conn: asyncpg.pool.PoolConnectionProxy) -> None:
            await conn.execute(LEAVE, self.holder)
            await conn.execute("SELECT pg_notify($1, $2)", WORKERS_CHANNEL, self.holder)

        await self._call("remove the worker row", go)

    def on_change(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback()` when a lease is released or a worker joins, leaves or starts draining (LISTEN;
        a lost notification is not repeated: balance on a timer too). Returns the unsubscribe function."""
        self._check()
        stops = [
            self._notifications.subscribe(RELEASED_CHANNEL, lambda _payload: callback()),
            self._notifications.subscribe(WORKERS_CHANNEL, lambda _payload: callback()),
        ]

        def unsubscribe() -> None:
            for stop in stops:
                stop()

        return unsubscribe

    # --- ingress -------------------------------------------------------------------------------------------

    async def put_ingress(self, partition: int, kind: str, key: str, payload: dict[str, Any]) -> bool:
        """Commit an event for `partition`'s owner, durably; False when `key` is already there (put by any
        worker: exactly once). Returns once its INSERT committed, on the store's ingress connection together
        with the puts made meanwhile (`PutLine`: never behind the pool's commits and reads); the partition's
        owner is NOTIFYed after it, one wake-up per partition per short window for all puts of this store
        (`Waker`). A payload that is not strict JSON is refused (`StrictJsonError`) before any I/O."""
        self._check()
        if type(partition) is not int or not 0 <= partition < self.partitions:
            raise StorageRequestError(
                f"ingress partition {partition!r} is not one of this store's (0 to {self.partitions - 1})"
            )
        for name, value in (("kind", kind), ("key", key)):
            check_ingress_text(name, value)
        text = ingress_payload_text(key, payload)
        try:
            new = await self.puts.put(key, partition, kind, text)
        except _DRIVER_ERRORS as exc:
            raise StorageError(f"storage {self.description}: put an ingress record failed: {exc}") from exc
        if not new:
            return False
        self.waker.mark(partition)
        return True

    async def pending_ingress(self, partitions: Collection[int], limit: int = 100) -> list[IngressRecord]:
        """Unfinished ingress records of these partitions, in id order."""
        self._check()
        wanted = sorted(set(partitions))
        if not wanted:
            return []
        rows = await self._call(
            "read pending ingress", lambda conn: conn.fetch(PENDING_INGRESS, wanted, max(limit, 0))
        )
        return [ingress_from_row(row) for row in rows]

    async def partitions_with_operator_requests(self, partitions: Collection[int]) -> set[int]:
        """Which of these partitions have operator requests pending (or taken and unfinished): one statement
        for every partition a worker owns, so it asks each partition's storage only when there is something."""
        self._check()
        wanted = sorted(set(partitions))
        if not wanted:
            return set()
        rows = await self._call(
            "look for operator requests", lambda conn: conn.fetch(OPERATOR_REQUESTS_WAITING, wanted)
        )
        return {int(row["partition"]) for row in rows}

    async def finish_ingress(self, record_id: int) -> None:
        """Mark a record done, after the owner's intake of it committed (finishing twice is harmless)."""
        await self.finish_ingresses([record_id])

    async def finish_ingresses(self, record_ids: Collection[int]) -> None:
        """Mark many records done in one statement (a consumer's batch, after their intakes committed)."""
        self._check()
        ids = sorted({int(record_id) for record_id in record_ids})
        if ids:
            await self._call("finish ingress records", lambda conn: conn.execute(FINISH_INGRESS, ids))

    async def drop_ingresses(self, record_ids: Collection[int]) -> None:
        """Delete records at once instead of finishing them: their keys are free again (a click the gate's
        owner refused must not keep its clicker's key for a day, or a later valid click is taken for it)."""
        self._check()
        ids = sorted({int(record_id) for record_id in record_ids})
        if ids:
            await self._call("drop ingress records", lambda conn: conn.execute(DROP_INGRESS, ids))

    async def _wake_owners(self, partitions: list[int]) -> None:
        # Not `_call`: the wake-ups of the last puts are still sent while `close` runs (before the pool closes).
        async with self.pool.acquire() as conn:
            await conn.execute(WAKE_INGRESS, partitions)

    async def prune_ingress(self, *, finished_for: float) -> int:
        """Delete records finished more than `finished_for` seconds ago (by the server's clock); returns how
        many. Their keys are then free again: keep them longer than any platform redelivers an event (Slack
        retries for minutes; a day is plenty)."""
        return await self._prune("prune ingress", PRUNE_INGRESS, finished_for)

    async def prune_operator_requests(self, *, finished_for: float) -> int:
        """Delete operator requests finished more than `finished_for` seconds ago (by the server's clock);
        returns how many. Requests still pending or taken stay whatever their age: their command may still
        be waiting for the answer."""
        return await self._prune("prune operator requests", PRUNE_REQUESTS, finished_for)

    async def _prune(self, action: str, statement: str, finished_for: float) -> int:
        """Run a DELETE of rows finished more than `finished_for` seconds ago; returns how many."""
        self._check()
        if not 0 <= finished_for < 10**12:  # NaN and infinity too: no int of milliseconds
            raise ValueError(f"finished_for must be a number of seconds >= 0, not {finished_for!r}")
        status = await self._call(action, lambda conn: conn.execute(statement, int(finished_for * 1000)))
        return int(status.split()[-1])

    def on_ingress(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Call `callback(partition)` when an ingress record for it is put (LISTEN; poll too: a lost
        notification is not repeated). Returns the unsubscribe function."""
        self._check()

        def wake(payload: str) -> None:
            with contextlib.suppress(ValueError):
                callback(int(payload))

        return self._notifications.subscribe(INGRESS_CHANNEL, wake)

    async def listening(self, timeout: float = 10.0) -> None:
        """Wait until the LISTEN connection is up (after a first `on_change`/`on_ingress`)."""
        await self._notifications.ready(timeout)

    # --- plumbing ------------------------------------------------------------------------------------------

    async def _call(self, action: str, call: Callable[[asyncpg.pool.PoolConnectionProxy], Any]) -> Any:
        self._check()
        try:
            async with self.pool.acquire() as conn:
                return await call(conn)
        except _DRIVER_ERRORS as exc:
            raise StorageError(f"storage {self.description}: {action} failed: {exc}") from exc

    async def close(self) -> None:
        """Close the partition handles still open (each writes its meta and releases its lease), release the
        resource leases, stop renewing and listening, close the pool. All best effort and concurrent: with the
        database gone, closing 64 partitions takes one timeout, not 64."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.puts.close()
            await self.waker.close()  # the last puts' wake-ups, while the pool is still open
            await _quietly(handle.close() for handle in list(self._handles.values()))
            await _quietly(lease.release() for lease in self._renewer.held())
            await self._renewer.close()
            await self._notifications.close()
        finally:
            try:
                await asyncio.wait_for(self.pool.close(), timeout=5)
            except (TimeoutError, *_DRIVER_ERRORS):
                self.pool.terminate()


_META = "SELECT next_id, last_seq FROM meta WHERE partition = $1"


async def _generic_plans(conn: asyncpg.Connection) -> None:
    """Each pooled connection plans a prepared statement once (generic plans). The commit statement
    (`_postgres_commit`) has many parts, and PostgreSQL's default planned it anew on every execution (it
    estimates the generic plan dearer for its arrays): 2.6x the server's CPU per commit and twice the wall time,
    measured (benchmarks/RESULTS.md). The reads are indexed lookups whose plans do not depend on the values.
    A SET, not a startup parameter: connection poolers such as PgBouncer refuse startup parameters they do not
    know. A server without the setting (before PostgreSQL 12) plans as it always did."""
    with contextlib.suppress(asyncpg.UndefinedObjectError):
        await conn.execute("SET plan_cache_mode = force_generic_plan")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset on release, instead of asyncpg's default query (advisory unlock, CLOSE ALL, UNLISTEN,
    RESET ALL: one more round trip per storage call, ~10% of a busy worker's samples under py-spy). Pooled
    connections keep no session state but `_generic_plans`' SET, which is meant to last: LISTEN is on the
    store's own connection, cursors live in transactions, and the migration's advisory lock is released by
    `migrate` (or goes with the pool when `open` fails). asyncpg still rolls back a transaction left open before
    calling this."""


async def _quietly(closing: Iterable[Awaitable[None]]) -> None:
    """Await every close at once; one that fails is logged and does not stop the others."""
    for outcome in await asyncio.gather(*closing, return_exceptions=True):
        if isinstance(outcome, Exception):
            log.warning("closing storage: %s", outcome)
        elif isinstance(outcome, BaseException):
            raise outcome


def _reason(exc: BaseException, dsn: str) -> str:
    """asyncpg's error text, safe to show: it may quote a piece of the DSN (a port that was really part of a
    raw password, a query field), so never for an ambiguous URL, and never with a password or query value."""
    if url_is_ambiguous(dsn):
        return "asyncpg could not use it (details hidden: they may hold part of the password)"
    text = str(exc)
    for secret in url_secrets(dsn):
        text = text.replace(secret, "***")
    return text


async def _read_meta(conn: asyncpg.pool.PoolConnectionProxy, partition: int) -> StorageMeta:
    row = await conn.fetchrow(_META, partition)
    if row is None:
        raise StorageCorrupt(f"storage meta row of partition {partition} is missing")
    return StorageMeta(next_id=int(row[0]), last_seq=int(row[1]))
