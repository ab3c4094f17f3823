"""Partition ownership on PostgreSQL: a lease row with fencing.

A lease row (holder, pid, host, epoch, expiry) per partition. Taking it is one statement that succeeds only
when the row is free (released, expired by the *server's* clock, or never written) and bumps `epoch`; the
holder renews it every `ttl / 3`. Two guards follow from it:

- **fencing**: every commit locks the row (`FOR SHARE`) and checks the epoch inside its own transaction, so
  once a successor has taken over (which bumped the epoch, and waited for any commit holding the row lock),
  the ex-holder can never commit again;
- **validity by our own clock**: the holder records `time.monotonic()` *before* sending each renewal; the
  lease is safely valid until that instant + ttl - margin. The server set the expiry from its own `now()`,
  which is no earlier, so a paused or partitioned holder stops trusting its lease before anyone else can take
  it. Platform writes check this before going out (`check()`).

A graceful stop releases the row at once (holder NULL, expiry in the past) and NOTIFYs, so a standby takes over
at once. A store renews all the leases it holds with one statement on one connection (`LeaseRenewer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from harness_core.errors import LeaseLost, StorageError, StorageLocked
from harness_core.storage._postgres_owned import close_connection, end_task

log = logging.getLogger("harness_core.storage")

_TAKE = """
INSERT INTO leases AS l (partition, holder, pid, host, epoch, acquired_at, expires_at)
VALUES ($1, $2, $3, $4, 1, now(), now() + make_interval(secs => $5))
ON CONFLICT (partition) DO UPDATE
SET holder = excluded.holder, pid = excluded.pid, host = excluded.host, epoch = l.epoch + 1,
    acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE l.holder IS NULL OR l.expires_at <= now()
RETURNING epoch
"""
_RELEASE = """
UPDATE leases SET holder = NULL, expires_at = now() - interval '1 second'
WHERE partition = $1 AND holder = $2 AND epoch = $3
"""
_WHO = """
SELECT holder, pid, host, epoch, GREATEST(0, EXTRACT(EPOCH FROM expires_at - now()))::float8
FROM leases WHERE partition = $1
"""
# Standbys LISTEN here; a graceful release NOTIFYs, so they take over at once instead of at their next poll.
RELEASED_CHANNEL = "durable_bots_lease_released"
# The fence, run first in every commit transaction.
FENCE = "SELECT epoch FROM leases WHERE partition = $1 AND holder = $2 FOR SHARE"


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds a partition's lease, for messages (`pid 41233 on ops-1`)."""

    holder: str
    pid: int | None
    host: str | None
    epoch: int
    expires_in: float  # seconds, by the server's clock

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def new_holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


async def who_holds(conn: asyncpg.Connection, partition: int) -> LeaseHolder | None:
    row = await conn.fetchrow(_WHO, partition)
    if row is None or row[0] is None or row[4] <= 0:
        return None
    return _holder(row)


def _holder(row: Sequence[Any]) -> LeaseHolder:
    """From (holder, pid, host, epoch, expires_in)."""
    return LeaseHolder(holder=row[0], pid=row[1], host=row[2], epoch=int(row[3]), expires_in=float(row[4]))


async def try_take(
    conn: asyncpg.Connection, partition: int, holder: str, ttl: float
) -> tuple[int, float] | LeaseHolder:
    """Take the lease if it is free: (epoch, monotonic time the request was sent), else the current holder."""
    sent = time.monotonic()
    epoch = await conn.fetchval(_TAKE, partition, holder, os.getpid(), socket.gethostname(), ttl)
    if epoch is not None:
        return int(epoch), sent
    current = await who_holds(conn, partition)
    if current is None:  # released or expired between the two statements: try again at once
        return await try_take(conn, partition, holder, ttl)
    return current


async def give_back(conn: asyncpg.Connection, partition: int, holder: str, epoch: int) -> None:
    """Free a lease row if it is still this holder's at this epoch, and wake the standbys (NOTIFY)."""
    status = await conn.execute(_RELEASE, partition, holder, epoch, timeout=2)
    if status.split()[-1] != "0":
        await conn.execute("SELECT pg_notify($1, $2)", RELEASED_CHANNEL, str(partition), timeout=2)


class Lease:
    """A held lease (of a partition, or of a resource with a negative id). Renewed by its store's
    `LeaseRenewer` together with every other lease the store holds; `release()` frees it at once."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        description: str,
        partition: int,
        holder: str,
        epoch: int,
        sent: float,
        ttl: float,
        margin: float,
        renewer: LeaseRenewer | None = None,
    ) -> None:
        self._pool = pool
        self._description = description
        self.partition = partition
        self.holder = holder
        self.epoch = epoch
        self.ttl = ttl
        self.margin = margin
        self._valid_until = sent + ttl - margin
        self._lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._renewer = renewer
        self._released = False

    def start(self) -> None:
        """Hand the lease to its renewer (kept for callers of the single-lease shape)."""
        if self._renewer is not None:
            self._renewer.add(self)

    @property
    def lost(self) -> asyncio.Future[str]:
        """Resolves with the reason once the lease is lost (never when it is released)."""
        return self._lost

    @property
    def released(self) -> bool:
        return self._released

    def valid(self) -> bool:
        return not self._released and not self._lost.done() and time.monotonic() < self._valid_until

    def check(self) -> None:
        """Raise `LeaseLost` unless the lease is still safely valid by this process's monotonic clock."""
        if self._lost.done():
            raise LeaseLost(self._lost.result())
        if self._released:
            raise LeaseLost(f"storage {self._description}: the lease of {self._what()} was released")
        if time.monotonic() >= self._valid_until:
            self.mark_lost(
                f"storage {self._description}: the lease of {self._what()} was not renewed in time "
                f"(ttl {self.ttl:g} s); another process may own it now"
            )
            raise LeaseLost(self._lost.result())

    def _what(self) -> str:
        return f"partition {self.partition}" if self.partition >= 0 else f"resource {self.partition}"

    def mark_lost(self, reason: str) -> None:
        if not self._lost.done():
            log.error("%s", reason)
            self._lost.set_result(reason)

    def renewed(self, sent: float) -> None:
        self._valid_until = max(self._valid_until, sent + self.ttl - self.margin)

    def check_silently(self) -> None:
        with contextlib.suppress(LeaseLost):
            self.check()

    def taken_over(self, successor: LeaseHolder | None) -> None:
        by = f" by {successor.describe()}" if successor is not None else ""
        self.mark_lost(f"storage {self._description}: the lease was taken over{by}; this process stops")

    async def release(self) -> None:
        """Stop renewing and free the row at once (NOTIFY), so a standby takes over without waiting."""
        if self._released:
            return
        self._released = True
        if self._renewer is not None:
            self._renewer.discard(self)
        # Even a lease lost by our own clock: the row may still name us for a while (the server's expiry is
        # later), blocking the partition for everyone. The epoch in the statement keeps a successor's lease.
        try:
            async with self._pool.acquire(timeout=2) as conn:
                await give_back(conn, self.partition, self.holder, self.epoch)
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # The lease then simply expires after its ttl.
            log.warning("storage %s: could not release the lease (%s)", self._description, exc)


# Every lease a store holds, renewed by one statement. A commit holds its lease row FOR SHARE (the fence)
# until it ends, so the update skips rows locked now instead of waiting: one slow commit must not hold back
# the renewal of every other partition. For each lease the answer says whether it was renewed, and, from the
# statement's snapshot, whether the row is still ours (a skipped row of ours is busy, not lost: nobody can
# take it while our commit holds it) or who holds it now.
_RENEW_ALL = """
WITH held AS (SELECT * FROM unnest($1::int[], $2::bigint[]) AS h(partition, epoch)),
free AS (
    SELECT l.partition FROM leases l JOIN held h ON l.partition = h.partition AND l.epoch = h.epoch
    WHERE l.holder = $4 FOR NO KEY UPDATE OF l SKIP LOCKED
),
renewed AS (
    UPDATE leases SET expires_at = now() + make_interval(secs => $3)
    WHERE partition IN (SELECT partition FROM free) RETURNING partition
)
SELECT h.partition, h.partition IN (SELECT partition FROM renewed), l.holder = $4 AND l.epoch = h.epoch,
    l.holder, l.pid, l.host, l.epoch, GREATEST(0, EXTRACT(EPOCH FROM l.expires_at - now()))::float8
FROM held h LEFT JOIN leases l ON l.partition = h.partition
"""


@dataclass(frozen=True)
class Renewal:
    """One lease's outcome of a renewal round."""

    renewed: bool
    ours: bool  # the row still names us at our epoch (when not renewed: a commit of ours holds it)
    holder: LeaseHolder | None  # who holds it otherwise (None: nobody, or released)


def _renewal(row: Sequence[Any]) -> Renewal:
    holder = _holder(row[3:]) if row[3] is not None and not row[2] else None
    return Renewal(renewed=bool(row[1]), ours=bool(row[2]), holder=holder)


class LeaseRenewer:
    """Renews every lease of one store (one holder) with one statement on one connection of its own, every
    `ttl / 3`: 64 partitions cost one connection and one round trip, and busy readers can never starve a
    renewal. A lease whose row names someone else now was taken over: it is marked lost."""

    def __init__(
        self, connect: Callable[[], Awaitable[asyncpg.Connection]], description: str, holder: str, ttl: float
    ) -> None:
        self._connect = connect
        self._description = description
        self.holder = holder
        self.ttl = ttl
        self._leases: dict[int, Lease] = {}
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def add(self, lease: Lease) -> None:
        self._leases[lease.partition] = lease
        if self._task is None and not self._closed:  # never a task nobody would cancel
            self._task = asyncio.create_task(self._loop(), name="postgres-lease-renewal")

    def discard(self, lease: Lease) -> None:
        if self._leases.get(lease.partition) is lease:
            del self._leases[lease.partition]

    def held(self) -> list[Lease]:
        return list(self._leases.values())

    async def _loop(self) -> None:
        wait = self.ttl / 3
        try:
            while True:
                await asyncio.sleep(wait)
                wait = self.ttl / 3
                try:
                    if await self._renew_once():
                        wait = min(self.ttl / 10, 0.5)  # try the busy rows again soon
                except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                    log.warning("storage %s: lease renewal failed (%s); retrying", self._description, exc)
                    await self._drop_connection()
                    wait = min(self.ttl / 3, 0.5)  # retry soon: the leases are still valid for a while
                except Exception:  # never end the renewal: every held lease would silently run out
                    log.exception(
                        "storage %s: lease renewal failed unexpectedly; retrying", self._description
                    )
                    await self._drop_connection()
                    wait = min(self.ttl / 3, 0.5)
        finally:
            await self._drop_connection()

    async def _renew_once(self) -> bool:
        """One round; True when a lease could not be renewed because a commit of ours held its row."""
        sent = time.monotonic()
        for lease in self._leases.values():  # past its validity: nothing to renew any more
            if sent >= lease._valid_until:
                lease.check_silently()
        leases = [lease for lease in self._leases.values() if not lease.lost.done()]
        if not leases:
            return False
        budget = max(min(lease._valid_until for lease in leases) - sent, 0.01)
        outcomes = await self._renew(leases, min(budget, self.ttl / 3))
        busy = False
        for lease in leases:
            outcome = outcomes.get(lease.partition, Renewal(renewed=False, ours=False, holder=None))
            if outcome.renewed:
                lease.renewed(sent)
            elif outcome.ours:
                busy = True
            elif self._leases.get(lease.partition) is lease and not lease.released:
                lease.taken_over(outcome.holder)
        return busy

    async def _renew(self, leases: list[Lease], timeout: float) -> dict[int, Renewal]:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncio.wait_for(self._connect(), timeout)
        conn = self._conn
        assert conn is not None
        rows = await conn.fetch(
            _RENEW_ALL,
            [lease.partition for lease in leases],
            [lease.epoch for lease in leases],
            self.ttl,
            self.holder,
            timeout=timeout,
        )
        return {int(row[0]): _renewal(row) for row in rows}

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        await close_connection(conn)

    async def close(self) -> None:
        """Stop renewing (held leases then expire after their ttl unless released first)."""
        self._closed = True
        task, self._task = self._task, None
        await end_task(task)
        await self._drop_connection()


def lease_error(description: str, holder: LeaseHolder) -> StorageError:
    return StorageLocked(
        description, f"lease held by {holder.describe()}, expires in {holder.expires_in:.0f} s"
    )
