"""One rate governor per platform: a minimum spacing per key (the bridge uses one key per channel) and a
back-off when the platform says Retry-After, for one key or for the whole platform.

Slack (`chat.postMessage` / `chat.update`) and Discord (sends and edits share a bucket) both limit writes per
channel, so the bridge runs every write into a channel inside `slot(channel key)`: posts, continuation posts,
streaming edits and final edits share one budget, and concurrent reply workers in that channel queue for it.

Memory: a key's state (its next turn and its lock) is kept while a call for it waits or runs, or its spacing or
back-off is still ahead; once more than `PRUNE_ABOVE` keys are held, idle keys whose time has passed are
dropped (they would allow a call at once anyway), so the state grows with the channels written to recently,
not with every channel ever written to.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from adapters.bridge.model import RetryLater

PRUNE_ABOVE = 256


class RateGovernor:
    def __init__(self, *, per_key_interval: float = 1.0, guard: Callable[[], None] | None = None) -> None:
        self.per_key_interval = per_key_interval
        # Called right before each call goes out (after waiting its turn); raising refuses the call. The
        # bridge passes the storage owner check, so a process that lost its PostgreSQL lease posts nothing.
        self.guard = guard
        self._next_at: dict[str, float] = {}
        self._blocked_until = 0.0  # platform-wide back-off (a 429 without a narrower scope)
        self._locks: dict[str, asyncio.Lock] = {}
        # For metrics: writes made through slot() and those answered with Retry-After (429), since start.
        self.writes = 0
        self.rate_limited = 0
        self._users: dict[str, int] = {}  # calls waiting for or holding each key's lock

    def _lock(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    @asynccontextmanager
    async def _held(self, key: str) -> AsyncIterator[None]:
        """Hold `key`'s lock; the key's state is never pruned while anyone waits for or holds it."""
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with self._lock(key):
                yield
        finally:
            left = self._users[key] - 1
            if left:
                self._users[key] = left
            else:
                del self._users[key]
            if len(self._next_at) > PRUNE_ABOVE:
                self._prune()

    def _prune(self) -> None:
        now = time.monotonic()
        for key in [k for k, at in self._next_at.items() if at <= now and k not in self._users]:
            del self._next_at[key]
            self._locks.pop(key, None)

    def __len__(self) -> int:
        """Keys with state held."""
        return len(self._next_at.keys() | self._locks.keys())

    async def _wait_turn(self, key: str) -> None:
        # Re-check after every sleep: a Retry-After may arrive (for this key or platform-wide) while waiting.
        while True:
            wait = max(self._next_at.get(key, 0.0), self._blocked_until) - time.monotonic()
            if wait <= 0:
                return
            await asyncio.sleep(wait)

    async def acquire(self, key: str, *, interval: float | None = None) -> None:
        """Wait until a call for `key` may go out, and reserve the slot (spacing counted from now)."""
        spacing = self.per_key_interval if interval is None else interval
        async with self._held(key):
            await self._wait_turn(key)
            self._next_at[key] = time.monotonic() + spacing

    @asynccontextmanager
    async def slot(
        self, key: str, *, interval: float | None = None, guard: Callable[[], None] | None = None
    ) -> AsyncIterator[None]:
        """Run one platform call for `key`: wait for the key's turn, hold the key during the call (callers
        queue in FIFO order), and let the next call for the key start no sooner than `interval` after this
        one finished. Counting from the end (not the start) keeps the spacing the platform sees at least
        `interval` however long the call took. A `RetryLater` raised by the call also pushes the key's next
        turn out by its `seconds`. `guard` (default: the governor's own) is checked right before the call goes
        out: a governor shared by the bridges of several partitions is given each write's own partition guard."""
        check = self.guard if guard is None else guard
        spacing = self.per_key_interval if interval is None else interval
        async with self._held(key):
            await self._wait_turn(key)
            self.writes += 1
            if check is not None:
                check()
            try:
                yield
            except RetryLater as exc:
                self.rate_limited += 1  # here, not in back_off(): Slack's call() backs off too, before this
                self.back_off(exc.seconds, key)
                raise
            finally:
                self._next_at[key] = max(self._next_at.get(key, 0.0), time.monotonic() + spacing)

    def back_off(self, seconds: float, key: str | None = None) -> None:
        """The platform asked to wait `seconds` (for this key, or everything)."""
        until = time.monotonic() + max(0.0, seconds)
        if key is None:
            self._blocked_until = max(self._blocked_until, until)
        else:
            self._next_at[key] = max(self._next_at.get(key, 0.0), until)
