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

A graceful stop releases the row at once (holder NULL, expiry in the past), so a standby takes over within its
poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from harness_core.errors import LeaseLost, StorageError, StorageLocked

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
_RENEW = """
UPDATE leases SET expires_at = now() + make_interval(secs => $4)
WHERE partition = $1 AND holder = $2 AND epoch = $3
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


class Lease:
    """A held lease. Renews itself in a background task it owns (`start()`/`release()`)."""

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
        self._renewing: asyncio.Task[None] | None = None
        self._conn: Any = None  # the renewal connection (a pool connection held by the renewal task)
        self._on_lost: list[Callable[[str], None]] = []

    def start(self) -> None:
        self._renewing = asyncio.create_task(self._renew_loop(), name="postgres-lease-renewal")

    @property
    def lost(self) -> asyncio.Future[str]:
        """Resolves with the reason once the lease is lost (never when it is released)."""
        return self._lost

    def valid(self) -> bool:
        return not self._lost.done() and time.monotonic() < self._valid_until

    def check(self) -> None:
        """Raise `LeaseLost` unless the lease is still safely valid by this process's monotonic clock."""
        if self._lost.done():
            raise LeaseLost(self._lost.result())
        if time.monotonic() >= self._valid_until:
            self.mark_lost(
                f"storage {self._description}: the lease was not renewed in time "
                f"(ttl {self.ttl:g} s); another process may own the store now"
            )
            raise LeaseLost(self._lost.result())

    def mark_lost(self, reason: str) -> None:
        if not self._lost.done():
            log.error("%s", reason)
            self._lost.set_result(reason)

    async def _renew_loop(self) -> None:
        # On a connection of its own, held for the lease's life: busy readers can never starve a renewal.
        wait = self.ttl / 3
        try:
            while not self._lost.done():
                await asyncio.sleep(wait)
                sent = time.monotonic()
                if sent >= self._valid_until:
                    self.check_silently()
                    return
                try:
                    epoch = await self._renew_once(sent)
                except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                    log.warning("storage %s: lease renewal failed (%s); retrying", self._description, exc)
                    await self._drop_connection()
                    wait = min(self.ttl / 3, 0.5)  # retry soon: the lease is still valid for a while
                    continue
                if epoch is None:
                    await self._lost_to_successor()
                    return
                self._valid_until = sent + self.ttl - self.margin
                wait = self.ttl / 3
        finally:
            await self._drop_connection()

    async def _renew_once(self, sent: float) -> Any:
        budget = max(self._valid_until - sent, 0.01)
        if self._conn is None:
            self._conn = await self._pool.acquire(timeout=budget)
        return await self._conn.fetchval(
            _RENEW, self.partition, self.holder, self.epoch, self.ttl, timeout=min(budget, self.ttl / 3)
        )

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await self._pool.release(conn, timeout=1)

    def check_silently(self) -> None:
        with contextlib.suppress(LeaseLost):
            self.check()

    async def _lost_to_successor(self) -> None:
        successor = None
        with contextlib.suppress(Exception):
            async with self._pool.acquire() as conn:
                successor = await who_holds(conn, self.partition)
        by = f" by {successor.describe()}" if successor is not None else ""
        self.mark_lost(f"storage {self._description}: the lease was taken over{by}; this process stops")

    async def release(self) -> None:
        """Stop renewing and free the row at once, so a standby takes over without waiting for the expiry."""
        if self._renewing is not None:
            self._renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewing
            self._renewing = None
        if self._lost.done():
            return
        try:
            async with self._pool.acquire(timeout=2) as conn:
                await conn.execute(_RELEASE, self.partition, self.holder, self.epoch, timeout=2)
                await conn.execute(
                    "SELECT pg_notify($1, $2)", RELEASED_CHANNEL, str(self.partition), timeout=2
                )
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # The lease then simply expires after its ttl.
            log.warning("storage %s: could not release the lease (%s)", self._description, exc)


def lease_error(description: str, holder: LeaseHolder) -> StorageError:
    return StorageLocked(
        description, f"lease held by {holder.describe()}, expires in {holder.expires_in:.0f} s"
    )
