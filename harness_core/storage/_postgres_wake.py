"""Coalesced ingress wake-ups: a put marks its partition, and one background task sends one NOTIFY per marked
partition per short window, in a transaction of its own after the puts committed.

Why not NOTIFY inside the put: PostgreSQL serializes the commits of transactions that NOTIFY (one lock per
database, held through the commit's WAL flush), so puts that notify go one fsync at a time whichever worker
makes them (`benchmarks/RESULTS.md`, "Many workers"). A NOTIFY-only transaction writes no WAL: its turn at the
lock is short, and one of them wakes every partition marked meanwhile. A wake-up that is late or lost (the send
failed, the process died between the put and the send) only delays: the owner also polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("harness_core.storage")

WAKE_WINDOW = 0.005  # seconds: puts marked within it share one NOTIFY transaction


class Waker:
    """Collects partitions to wake and sends them with `send(partitions)`, one call at a time, at most one per
    `window`. Started lazily by the first `mark` (it needs the running loop); `close` sends what is still
    marked (best effort) and ends the task. Owned by the store that creates it."""

    def __init__(self, send: Callable[[list[int]], Awaitable[None]], window: float = WAKE_WINDOW) -> None:
        self._send = send
        self.window = window
        self._marked: set[int] = set()
        self._event: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.sent = 0  # NOTIFY transactions sent (tests, metrics)

    def mark(self, partition: int) -> None:
        if self._closed:
            return
        self._marked.add(partition)
        if self._task is None:
            self._event = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ingress-wake")
        assert self._event is not None
        self._event.set()

    async def _run(self) -> None:
        assert self._event is not None
        while True:
            await self._event.wait()
            if self.window > 0:
                await asyncio.sleep(self.window)
            self._event.clear()
            await self._flush()

    async def _flush(self) -> None:
        if not self._marked:
            return
        partitions = sorted(self._marked)
        self._marked.clear()
        try:
            await self._send(partitions)
            self.sent += 1
        except asyncio.CancelledError:
            self._marked.update(partitions)  # closing: `close` sends them once more
            raise
        except Exception as exc:  # the owners' polls cover it; a database outage is reported by the puts
            log.debug("ingress wake-up of %d partition(s) not sent: %s", len(partitions), exc)

    async def close(self, timeout: float = 2.0) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._flush(), timeout)
