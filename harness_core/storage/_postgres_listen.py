"""One LISTEN connection per store: lease releases, workers joining or leaving, ingress for a partition.

Notifications only wake: whoever acts on them also polls (a notification sent while this connection was down
is lost, by PostgreSQL's design). A dropped connection is replaced in the background, every second until it
connects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import asyncpg

from harness_core.storage._postgres_owned import close_connection, end_task

log = logging.getLogger("harness_core.storage")

RECONNECT_EVERY = 1.0


class Notifications:
    """Callbacks per channel over one connection of its own (not from the pool: it is held for the store's
    life). Callbacks run on the event loop and must not block; one that raises is logged and skipped."""

    def __init__(self, connect: Callable[[], Awaitable[asyncpg.Connection]], description: str) -> None:
        self._connect = connect
        self._description = description
        self._callbacks: dict[str, list[Callable[[str], None]]] = {}
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._listening: set[str] = set()
        self._up = asyncio.Event()
        self._adding: set[asyncio.Future[None]] = set()
        self._closed = False

    def subscribe(self, channel: str, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call `callback(payload)` for each notification on `channel`; returns the unsubscribe function."""
        self._callbacks.setdefault(channel, []).append(callback)
        if not self._closed:  # after close: never a task nor a connection nobody would close
            self._listen_on(channel)

        def unsubscribe() -> None:
            callbacks = self._callbacks.get(channel, [])
            if callback in callbacks:
                callbacks.remove(callback)

        return unsubscribe

    def _listen_on(self, channel: str) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._keep_listening(), name="postgres-listen")
        elif self._conn is not None and channel not in self._listening:
            # Subscribed while connected: listen on it now (a failure is noticed by the connection watch).
            self._listening.add(channel)
            adding = asyncio.ensure_future(self._conn.add_listener(channel, self._dispatch))
            self._adding.add(adding)
            adding.add_done_callback(self._added)

    def _added(self, adding: asyncio.Future[None]) -> None:
        self._adding.discard(adding)
        if not adding.cancelled():
            adding.exception()  # a failed LISTEN: the connection watch replaces the connection

    def _dispatch(self, _conn: object, _pid: int, channel: str, payload: object) -> None:
        for callback in list(self._callbacks.get(channel, [])):
            try:
                callback(str(payload))
            except Exception:
                log.exception("storage %s: a notification callback failed", self._description)

    async def _keep_listening(self) -> None:
        while True:
            try:
                conn = await self._connect()
            except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("storage %s: cannot LISTEN (%s); retrying", self._description, exc)
                await asyncio.sleep(RECONNECT_EVERY)
                continue
            except Exception:  # never end listening: every wake-up would then wait for a poll
                log.exception("storage %s: cannot LISTEN; retrying", self._description)
                await asyncio.sleep(RECONNECT_EVERY)
                continue
            closed = asyncio.Event()
            conn.add_termination_listener(_setter(closed))
            try:
                self._listening = set()
                # Until no channel is missing: one may be subscribed while we await here.
                while missing := [c for c in self._callbacks if c not in self._listening]:
                    for channel in missing:
                        await conn.add_listener(channel, self._dispatch)
                        self._listening.add(channel)
                self._conn = conn
                self._up.set()
                while not conn.is_closed():
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(closed.wait(), 5)
                log.warning("storage %s: the LISTEN connection was lost; reconnecting", self._description)
            except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("storage %s: LISTEN failed (%s); reconnecting", self._description, exc)
            except Exception:
                log.exception("storage %s: LISTEN failed; reconnecting", self._description)
            finally:
                self._conn = None
                self._up.clear()
                if not conn.is_closed():
                    conn.terminate()
            await asyncio.sleep(RECONNECT_EVERY)

    async def ready(self, timeout: float = 10.0) -> None:
        """Wait until the connection listens (tests, and a store that wants its first wake-ups)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._up.wait(), timeout)
            if self._adding:
                await asyncio.wait_for(asyncio.wait(list(self._adding)), timeout)

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        await end_task(task)
        conn, self._conn = self._conn, None
        await close_connection(conn)


def _setter(event: asyncio.Event) -> Callable[[object], None]:
    return lambda _conn: event.set()
