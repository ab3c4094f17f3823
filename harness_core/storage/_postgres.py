"""The PostgreSQL backend (asyncpg): a store shared by processes on several machines, one owner per partition.

Same layout as the SQLite backend (each record is one row holding its JSON, a few indexed columns copied out),
with ownership by a lease with fencing instead of a file lock (see `_postgres_lease`). A `PostgresStorage` is
bound to one partition of a store (`PostgresStore.open_partition`): every row it writes carries the partition,
its ids are those of the partition (`id % partitions == partition`, see `StorageMeta.id_stride`), and the
scans recovery uses (live tasks, submissions by status, conversations, global documents) see only its
partition; reads by id see the whole store (a cross-partition read is a plain read, never fenced). One commit
is one statement on a pooled connection (`_postgres_commit`): the fence (the partition's lease epoch) and every
row of the batch.

`PostgresStorage.open(dsn)` is a whole store of one partition: it takes the lease (or raises `StorageLocked`,
or waits as a standby when `on_standby` is given); `open(dsn, read_only=True)` takes nothing and refuses
commits: for operator commands while the bot runs (it sees every partition). Both handles implement
`OperatorRequests` (`_postgres_requests`), so such a command can hand a change to the running owner of the
partition of its target.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from pydantic import BaseModel

from harness_core.errors import (
    LeaseLost,
    StorageClosed,
    StorageError,
    StorageRequestError,
)
from harness_core.records import (
    Conversation,
    DocScope,
    DocumentRecord,
    DocumentValue,
    Entry,
    Submission,
    Task,
)
from harness_core.storage._operator import OperatorRequest, request_from_row
from harness_core.storage._postgres_commit import UNKNOWN_RETIRE, commit_statement
from harness_core.storage._postgres_lease import FENCE, Lease, LeaseHolder
from harness_core.storage._postgres_requests import (
    CLAIM,
    FINISH,
    PENDING,
    PUT,
    SETTLE,
    changed,
    to_text,
)
from harness_core.storage._postgres_requests import GET as GET_REQUEST
from harness_core.storage._protocol import CommitBatch, StorageMeta
from harness_core.storage._sql_plan import CommitPlan, plan_or_refuse
from harness_core.storage._sql_reads import MAX_SEQ, SqlRecordReads, wants_contents

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R", Conversation, Entry, Task, Submission)
T = TypeVar("T")

if TYPE_CHECKING:
    from harness_core.storage._postgres_store import PostgresStore

log = logging.getLogger("harness_core.storage")

_DRIVER_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, asyncio.TimeoutError)


_NEWEST_BASE = (
    "SELECT seq, part FROM doc_contents WHERE doc_id = $1 AND is_base AND seq <= $2 "
    "ORDER BY seq DESC, part DESC LIMIT 1"
)
_CONTENTS_FROM = (
    "SELECT content FROM doc_contents WHERE doc_id = $1 AND (seq, part) >= ($2, $3) AND seq <= $4 "
    "ORDER BY seq, part"
)


# Shown instead of a URL whose password (or query) holds raw '#', '/', '?' or '@': any split of it may cut
# the password in two, so no part of it is shown.
MALFORMED_URL = "postgresql://(url hidden: percent-encode the special characters in its password)"


def redact_url(dsn: str) -> str:
    """The DSN without its password (and without query parameters, which may carry one)."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "postgresql://(unparseable url)"
    if parts.scheme not in ("postgresql", "postgres"):
        return "(not a postgresql:// url)"
    if url_is_ambiguous(dsn):
        return MALFORMED_URL
    # The hosts as written (libpq's multi-host `db1:5432,db2:5432` has no single host or port to parse).
    hosts = parts.netloc.rpartition("@")[2]
    netloc = f"{parts.username}@{hosts}" if parts.username else hosts
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def url_is_ambiguous(dsn: str) -> bool:
    """Does the URL hold a raw '#' or an '@' outside its user info? Then a password with unencoded special
    characters may have been split (by us and by asyncpg) into host, path, query or fragment."""
    try:
        parts = urlsplit(dsn)
    except ValueError:  # e.g. a raw '[' read as an unclosed IPv6 address
        return True
    return bool(parts.fragment) or "#" in dsn or dsn.count("@") != parts.netloc.count("@")


def url_secrets(dsn: str) -> list[str]:
    """The password and any query parameter value of a DSN (a parseable one): what an error text must never
    repeat."""
    parts = urlsplit(dsn)
    found = [parts.password or ""]
    found += [value for _, _, value in (field.partition("=") for field in parts.query.split("&"))]
    return [secret for secret in found if secret]


def _json(record: BaseModel) -> bytes:
    # As in SQLite: fields left at None are omitted (reading restores them). Bytes of the JSON: see the
    # schema module for why bytea rather than jsonb.
    return record.model_dump_json(exclude_none=True).encode("utf-8")


class PostgresStorage(SqlRecordReads):
    """One partition of a PostgreSQL store (from `PostgresStore.open_partition`, or the whole store of one
    partition from `await PostgresStorage.open(dsn)`); one lease holder writes a partition at a time."""

    _numbered = True
    # Its commits can finish ingress records (`CommitBatch.ingress_finished`), fenced like every other row.
    finishes_ingress = True
    _LATEST_HEAD = (
        "SELECT record FROM entries WHERE conversation_id = $1 AND head IS NOT NULL AND id <= $2 "
        "ORDER BY id DESC LIMIT 1"
    )

    def __init__(
        self,
        store: PostgresStore,
        partition: int | None,
        lease: Lease | None,
        meta: StorageMeta,
        *,
        owns_store: bool,
    ) -> None:
        self._store = store
        self._description = store.description
        self._pool = store.pool
        self._partition = partition
        self._lease = lease
        self._owns_store = owns_store
        self._next_id = meta.next_id
        self._last_seq = meta.last_seq
        # As in SQLite: the meta row holds a reservation above what is used, written (fenced) only when
        # commits pass it and set exact at close. A successor starts above it: nothing stored is minted twice.
        self._reserved = (meta.next_id, meta.last_seq)
        self._closed = False
        # Held by a commit from its first check to its cached meta update, and by close() while it writes the
        # exact meta: a close racing a commit must not store a next id below the ids that commit used.
        self._writing = asyncio.Lock()
        # After a commit whose outcome is unknown the exact meta is unknown too: close keeps the reservation.
        self._outcome_unknown = False

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        read_only: bool = False,
        lease_ttl: float = 10.0,
        on_standby: Callable[[LeaseHolder], None] | None = None,
        pool_size: int = 4,  # connections for reads; commits take one more, the lease renewal has its own
        connect_timeout: float = 10.0,
    ) -> PostgresStorage:
        """Connect, migrate the schema, take the store's lease (a store of one partition: the leader/standby
        shape; a store of more partitions is refused, naming its count).

        When another process holds the lease: raise `StorageLocked` naming it, or, with `on_standby`, call it
        once with the holder and wait until the lease is free (released, or expired after `lease_ttl`).
        `read_only=True` takes no lease and migrates nothing; `commit()` is refused; it sees every partition.
        The handle owns its connections: `close()` closes them.
        """
        from harness_core.storage._postgres_store import PostgresStore

        if read_only:
            store = await PostgresStore.open_read_only(dsn, connect_timeout=connect_timeout)
            try:
                meta = await store.read_meta(0)
            except BaseException:
                await store.close()
                raise
            return cls(store, None, None, meta, owns_store=True)
        store = await PostgresStore.open(
            dsn, partitions=1, lease_ttl=lease_ttl, pool_size=pool_size + 1, connect_timeout=connect_timeout
        )
        try:
            handle = await store.wait_partition(0, on_standby)
        except BaseException:
            await store.close()
            raise
        handle._owns_store = True
        return handle

    @classmethod
    async def open_read_only(cls, dsn: str, *, connect_timeout: float = 10.0) -> PostgresStorage:
        """Open for reading beside a running owner: no lease, no migration, commits refused (operator
        commands). Each read sees the latest committed state."""
        return await cls.open(dsn, read_only=True, connect_timeout=connect_timeout)

    @property
    def description(self) -> str:
        return self._description

    @property
    def store(self) -> PostgresStore:
        return self._store

    @property
    def partition(self) -> int | None:
        """The partition this handle writes (None for a read-only handle, which sees every partition)."""
        return self._partition

    @property
    def partitions(self) -> int:
        """The store's partition count."""
        return self._store.partitions

    @property
    def read_only(self) -> bool:
        return self._lease is None

    @property
    def lease(self) -> Lease | None:
        """The held lease (None when opened read-only): `check()` before every external write, `lost` to
        stop when another process took over."""
        return self._lease

    def check_owner(self) -> None:
        """Raise `LeaseLost` unless this process still safely owns the partition (by its own monotonic
        clock)."""
        if self._lease is not None:
            self._lease.check()

    def not_ready(self) -> str | None:
        """Why this process should not count as ready (for a readiness probe), or None: the lease is lost or
        no longer safely valid."""
        if self._closed:
            return "storage closed"
        if self._lease is not None and not self._lease.valid():
            return "storage lease lost" if self._lease.lost.done() else "storage lease not renewed in time"
        return None

    def _check(self) -> None:
        if self._closed:
            raise StorageClosed(f"storage {self._description} is closed")

    async def meta(self) -> StorageMeta:
        self._check()
        return StorageMeta(
            next_id=self._next_id,
            last_seq=self._last_seq,
            id_stride=self.partitions,
            id_offset=self._partition if self._partition is not None else 0,
        )

    def _own(self) -> list[tuple[str, Any]]:
        return [] if self._partition is None else [("partition = ?", self._partition)]

    async def commit(self, batches: Sequence[CommitBatch]) -> None:
        async with self._writing:
            await self._commit(batches)

    async def _commit(self, batches: Sequence[CommitBatch]) -> None:
        self._check()
        if self._lease is None or self._partition is None:
            raise StorageError(f"storage {self._description} is open read-only; it cannot commit")
        last = self._last_seq
        for batch in batches:
            if batch.seq <= last:
                raise StorageRequestError(f"commit seq {batch.seq} is not after {last}")
            last = batch.seq
        if not batches:
            return
        self._lease.check()
        plan = plan_or_refuse(
            batches, self._next_id, self._reserved, _json, self._description, id_stride=self.partitions
        )
        try:
            async with self._pool.acquire() as conn:
                try:
                    await self._write(conn, self._lease, plan)
                except asyncio.CancelledError:
                    # Outcome uncertain: drop the connection (the server rolls back unless COMMIT already
                    # landed) and resync the cached meta from what is stored.
                    conn.terminate()
                    raise
        except asyncio.CancelledError:
            # The COMMIT may still land after this read (it was on its way): close keeps the reservation.
            self._outcome_unknown = True
            with contextlib.suppress(Exception):
                await self._resync_meta()
            raise
        except LeaseLost:
            raise
        except (asyncpg.IntegrityConstraintViolationError, asyncpg.DataError) as exc:
            raise StorageError(f"storage {self._description}: commit failed: {exc}") from exc
        except _DRIVER_ERRORS as exc:
            self._outcome_unknown = True  # it may have landed: the cached next id may be below its ids
            raise StorageError(
                f"storage {self._description}: commit failed (outcome unknown): {exc}"
            ) from exc
        self._next_id = plan.next_id
        self._last_seq = plan.last_seq
        if plan.reserve is not None:
            self._reserved = plan.reserve

    async def _write(self, conn: asyncpg.pool.PoolConnectionProxy, lease: Lease, plan: CommitPlan) -> None:
        sql, args = commit_statement(plan, lease.partition, lease.holder, lease.epoch)
        try:
            row = await conn.fetchrow(sql, *args)
        except asyncpg.InvalidTextRepresentationError as exc:
            if UNKNOWN_RETIRE not in str(exc):
                raise
            retired = [doc_id for _, doc_id in plan.retires]
            raise StorageError(
                f"storage {self._description}: commit retires an unknown document (ids {retired})"
            ) from exc
        assert row is not None  # the statement's SELECT always returns one row
        self._fenced(lease, row["epoch"])

    def _fenced(self, lease: Lease, epoch: int | None) -> None:
        """Raise `LeaseLost` (and mark the lease lost) unless `epoch` is the one this writer holds."""
        if epoch == lease.epoch:
            return
        reason = (
            f"storage {self._description}: the lease of partition {lease.partition} was taken over "
            f"(epoch {epoch} > {lease.epoch}); this process stops writing it"
            if epoch is not None
            else f"storage {self._description}: the lease of partition {lease.partition} is no "
            "longer ours; this process stops writing it"
        )
        lease.mark_lost(reason)
        raise LeaseLost(reason)

    async def _resync_meta(self) -> None:
        if self._partition is None:
            return
        meta = await self._store.read_meta(self._partition)
        self._next_id, self._last_seq = meta.next_id, meta.last_seq
        self._reserved = (self._next_id, self._last_seq)

    # --- reads --------------------------------------------------------------------------------------------

    async def _rows(self, sql: str, params: Sequence[Any], action: str) -> list[Any]:
        self._check()
        try:
            async with self._pool.acquire() as conn:
                return list(await conn.fetch(sql, *params))
        except _DRIVER_ERRORS as exc:
            raise StorageError(f"storage {self._description}: {action} failed: {exc}") from exc

    async def _scan_rows(self, sql: str, params: Sequence[Any], action: str) -> list[Any]:
        return await self._rows(sql, params, action)  # reads already use the pool, beside the writer

    # --- documents ----------------------------------------------------------------------------------------

    async def find_document(
        self,
        kind: str,
        scope: DocScope,
        scope_id: int | None,
        key: str | None = None,
        *,
        at_seq: int | None = None,
    ) -> DocumentRecord | None:
        # `= $n` or `IS NULL`, not IS NOT DISTINCT FROM: only the former can use the address index.
        params: list[Any] = [kind, scope]
        sql = "SELECT retired_seq, record FROM doc_records WHERE kind = $1 AND scope = $2"
        for column, value in (("scope_id", scope_id), ("key", key)):
            if value is None:
                sql += f" AND {column} IS NULL"
            else:
                params.append(value)
                sql += f" AND {column} = ${len(params)}"
        if scope_id is None and self._partition is not None:  # a global document: each partition has its own
            params.append(self._partition)
            sql += f" AND partition = ${len(params)}"
        if at_seq is None:
            sql += " AND retired_seq IS NULL"
        else:
            params.append(at_seq)
            n = len(params)
            sql += f" AND created_seq <= ${n} AND (retired_seq IS NULL OR retired_seq > ${n})"
        rows = await self._rows(sql + " ORDER BY id DESC LIMIT 1", params, "find document")
        return None if not rows else self._doc_record(rows[0][1], rows[0][0])

    async def document(self, doc_id: int, *, at_seq: int | None = None) -> DocumentValue | None:
        self._check()
        try:
            async with (
                self._pool.acquire() as conn,
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):
                row = await conn.fetchrow(
                    "SELECT rewindable, created_seq, retired_seq, record, kind FROM doc_records WHERE id = $1",
                    doc_id,
                )
                content_rows: list[Any] = []
                if row is not None and wants_contents(row[0], row[1], row[2], at_seq):
                    upto = MAX_SEQ if at_seq is None else at_seq
                    found = await conn.fetchrow(_NEWEST_BASE, doc_id, upto)
                    seq, part = (found[0], found[1]) if found is not None else (0, 0)
                    content_rows = list(await conn.fetch(_CONTENTS_FROM, doc_id, seq, part, upto))
        except _DRIVER_ERRORS as exc:
            raise StorageError(f"storage {self._description}: read document failed: {exc}") from exc
        return self._document_value(doc_id, row, content_rows, at_seq)

    async def scan_documents(
        self,
        *,
        scope: DocScope,
        scope_id: int | None = None,
        kind: str | None = None,
        alive_only: bool = True,
    ) -> list[DocumentRecord]:
        params: list[Any] = [scope]
        sql = "SELECT retired_seq, record FROM doc_records WHERE scope = $1"
        if scope_id is None:
            sql += " AND scope_id IS NULL"
            if self._partition is not None:  # global documents: each partition has its own
                params.append(self._partition)
                sql += f" AND partition = ${len(params)}"
        else:
            params.append(scope_id)
            sql += f" AND scope_id = ${len(params)}"
        if kind is not None:
            params.append(kind)
            sql += f" AND kind = ${len(params)}"
        if alive_only:
            sql += " AND retired_seq IS NULL"
        rows = await self._rows(sql + " ORDER BY id", params, "scan documents")
        return [self._doc_record(raw, retired) for retired, raw in rows]

    # --- operator requests (harness_core.storage.OperatorRequests; see _postgres_requests) ---------------

    async def _request_call(
        self, action: str, call: Callable[[asyncpg.pool.PoolConnectionProxy], Awaitable[T]]
    ) -> T:
        """One autocommit statement on a pooled connection: no lease, no fence (read-only handles too)."""
        self._check()
        try:
            async with self._pool.acquire() as conn:
                return await call(conn)
        except _DRIVER_ERRORS as exc:
            raise StorageError(f"storage {self._description}: {action} failed: {exc}") from exc

    def _lease_gone(self) -> bool:
        # A leader that may have been replaced takes no requests and finishes none: what it did not answer
        # stays pending for the successor (every kind is idempotent).
        return self._lease is not None and not self._lease.valid()

    def _request_partition(self, args: dict[str, Any]) -> int:
        """The partition whose owner carries out a request: that of its target task or gate (`id %
        partitions`), else this handle's (0 for a read-only handle)."""
        for name in ("task", "gate"):
            target = args.get(name)
            if type(target) is int:
                return target % self.partitions
        return self._partition or 0

    async def put_operator_request(self, kind: str, args: dict[str, Any]) -> int:
        text = to_text(args)
        partition = self._request_partition(args)
        found = await self._request_call(
            "queue an operator request", lambda conn: conn.fetchval(PUT, partition, kind, text)
        )
        return int(found)

    async def operator_request(self, request_id: int) -> OperatorRequest | None:
        row = await self._request_call(
            "read an operator request", lambda conn: conn.fetchrow(GET_REQUEST, request_id)
        )
        return request_from_row(row) if row is not None else None

    async def withdraw_operator_request(self, request_id: int) -> bool:
        status = await self._request_call(
            "withdraw an operator request", lambda conn: conn.execute(SETTLE, request_id, "withdrawn", None)
        )
        return changed(status)

    async def pending_operator_requests(self, limit: int = 20) -> list[OperatorRequest]:
        if self._lease_gone():
            return []
        rows = await self._request_call(
            "read operator requests", lambda conn: conn.fetch(PENDING, self._partition or 0, limit)
        )
        return [request_from_row(row) for row in rows]

    async def finish_operator_request(
        self, request_id: int, status: Literal["done", "failed"], outcome: dict[str, Any]
    ) -> bool:
        if self._lease_gone():
            raise LeaseLost(
                f"storage {self._description}: the lease is no longer safely ours; operator request "
                f"{request_id} stays pending for the next leader"
            )
        text = to_text(outcome)
        found = await self._request_call(
            "finish an operator request", lambda conn: conn.execute(FINISH, request_id, status, text)
        )
        return changed(found)

    async def claim_operator_request(self, request_id: int) -> bool:
        if self._lease_gone():
            raise LeaseLost(
                f"storage {self._description}: the lease is no longer safely ours; operator request "
                f"{request_id} stays pending for the next leader"
            )
        found = await self._request_call(
            "take an operator request", lambda conn: conn.execute(CLAIM, request_id)
        )
        return changed(found)

    async def _write_exact_meta(self, lease: Lease) -> None:
        """Store the exact next id and seq instead of the reservation, after any commit in flight. Harmless to
        skip (the reservation stays): on a slow or failed database this gives up after a few seconds."""
        try:
            await asyncio.wait_for(self._writing.acquire(), 5)
        except TimeoutError:
            return
        try:
            if not lease.valid() or self._outcome_unknown:
                return
            with contextlib.suppress(*_DRIVER_ERRORS, LeaseLost):
                async with self._pool.acquire(timeout=5) as conn, conn.transaction():
                    epoch = await conn.fetchval(FENCE, lease.partition, lease.holder)
                    if epoch == lease.epoch:
                        await conn.execute(
                            "UPDATE meta SET next_id = $2, last_seq = $3 WHERE partition = $1",
                            lease.partition,
                            self._next_id,
                            self._last_seq,
                        )
        finally:
            self._writing.release()

    async def close(self) -> None:
        """Write the exact meta (fenced), release the partition's lease at once (NOTIFY). The store's
        connections stay open, unless this handle came from `PostgresStorage.open` (then it closes them)."""
        if self._closed:
            return
        self._closed = True  # no new commit starts; one in flight finishes first
        try:
            lease = self._lease
            if lease is not None:
                await self._write_exact_meta(lease)
                await lease.release()
        finally:
            self._store.forget(self)
            if self._owns_store:
                await self._store.close()
