"""One rate governor per platform: a minimum spacing per key (channel or message) and a shared back-off when
the platform says Retry-After."""

from __future__ import annotations

import asyncio
import time


class RateGovernor:
    def __init__(self, *, per_key_interval: float = 1.0) -> None:
        self.per_key_interval = per_key_interval
        self._next_at: dict[str, float] = {}
        self._blocked_until = 0.0  # platform-wide back-off (a 429 without a narrower scope)
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    async def acquire(self, key: str, *, interval: float | None = None) -> None:
        """Wait until a call for `key` may go out, and reserve the slot."""
        spacing = self.per_key_interval if interval is None else interval
        async with self._lock(key):
            now = time.monotonic()
            wait = max(self._next_at.get(key, 0.0), self._blocked_until) - now
            if wait > 0:
                await asyncio.sleep(wait)
            self._next_at[key] = time.monotonic() + spacing

    def back_off(self, seconds: float, key: str | None = None) -> None:
        """The platform asked to wait `seconds` (for this key, or everything)."""
        until = time.monotonic() + max(0.0, seconds)
        if key is None:
            self._blocked_until = max(self._blocked_until, until)
        else:
            self._next_at[key] = max(self._next_at.get(key, 0.0), until)
