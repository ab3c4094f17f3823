"""`Feed`: committed changes delivered in order to one consumer, starting from a first item (a snapshot).

Commits published while the first item is read are buffered and replayed after it when they are newer, so
nothing is missed or doubled. A consumer more than `limit` items behind gets one fresh snapshot instead of the
backlog (convergence, not an audit log). The feed ends when the harness closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from harness_core._session import Publication

if TYPE_CHECKING:
    from harness_core.harness import Harness

T = TypeVar("T")


class Feed(Generic[T]):
    limit = 100

    def __init__(self, harness: Harness) -> None:
        self._harness = harness
        self._queue: list[T] = []
        self._event = asyncio.Event()
        self._overflow = False
        self._dispose: Callable[[], None] | None = None
        self._started = False
        self._closed = False

    # --- what a feed provides ---------------------------------------------------------------------------------

    async def first(self) -> tuple[T, int]:
        """The first item and the commit seq it reflects."""
        raise NotImplementedError

    async def snapshot(self) -> T:
        """A fresh item standing for everything (sent after an overflow)."""
        raise NotImplementedError

    def translate(self, publication: Publication) -> T | None:
        """The item for one commit, or None when it does not concern this feed."""
        raise NotImplementedError

    # --- delivery ---------------------------------------------------------------------------------------------

    async def __aenter__(self) -> Any:
        await self._start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._closed = True
        if self._dispose is not None:
            self._dispose()
            self._dispose = None
        self._event.set()

    async def _start(self) -> None:
        if self._started:
            return
        self._started = True
        buffered: list[Publication] = []
        self._dispose = self._harness.add_publication_listener(buffered.append)
        try:
            first, seq = await self.first()
        finally:
            self._dispose()
        self._dispose = self._harness.add_publication_listener(self._on_publication)
        self._queue.append(first)
        for publication in buffered:
            if publication.seq > seq:
                self._on_publication(publication)
        self._event.set()

    def _on_publication(self, publication: Publication) -> None:
        item = self.translate(publication)
        if item is None:
            return
        if len(self._queue) >= self.limit:
            self._overflow = True
            self._queue.clear()
        else:
            self._queue.append(item)
        self._event.set()

    def __aiter__(self) -> AsyncIterator[T]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[T]:
        await self._start()
        while not self._closed:
            if self._overflow:
                self._overflow = False
                self._queue.clear()
                yield await self.snapshot()
                continue
            if not self._queue:
                if self._harness.session.sealed:
                    return
                self._event.clear()
                waiter: asyncio.Future[Any] = asyncio.ensure_future(self._event.wait())
                closed: asyncio.Future[Any] = self._harness.closed
                done, _ = await asyncio.wait([waiter, closed], return_when=asyncio.FIRST_COMPLETED)
                if waiter not in done:
                    waiter.cancel()
                    return
                continue
            yield self._queue.pop(0)
