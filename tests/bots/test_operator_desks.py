"""`Desks`: a worker looks for operator requests in all the partitions it owns with one query, and asks a
partition's own storage (lease-checked) only when that look names it. A failed look is logged and retried."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from bots.partition_stack import Desks


@dataclass
class Storage:
    requests: list[str]
    asked: int = 0

    async def pending_operator_requests(self) -> list[str]:
        self.asked += 1
        taken, self.requests = self.requests, []
        return taken


@dataclass
class Desk:
    handled: list[str] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: str) -> None:
        self.handled.append(request)
        self.done.set()


@dataclass
class Part:
    number: int
    storage: Storage
    desk: Desk = field(default_factory=Desk)
    harness: Any = None
    gone: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def __post_init__(self) -> None:
        closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.harness = type("H", (), {"closed": closed})()


@dataclass
class Host:
    parts: dict[int, Part]


@dataclass
class Store:
    waiting: set[int]
    failures: int = 0
    looks: list[list[int]] = field(default_factory=list)

    async def partitions_with_operator_requests(self, partitions: list[int]) -> set[int]:
        self.looks.append(sorted(partitions))
        if self.failures:
            self.failures -= 1
            raise OSError("connection reset by peer")
        return set(self.waiting)


async def test_one_look_for_every_owned_partition_and_only_named_ones_are_asked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    parts = {n: Part(n, Storage([f"retry-{n}"] if n == 5 else [])) for n in range(8)}
    store = Store({5}, failures=1)
    desks = Desks(Host(parts), store)  # type: ignore[arg-type]
    desks.start()
    try:
        await asyncio.wait_for(parts[5].desk.done.wait(), 10)
    finally:
        await desks.stop()
    assert parts[5].desk.handled == ["retry-5"]
    assert all(store.looks[n] == list(range(8)) for n in range(len(store.looks)))
    assert len(store.looks) >= 2  # the first look failed (logged), the next one found it
    assert "operator requests: connection reset by peer" in caplog.text
    assert [p.storage.asked for p in parts.values()] == [0, 0, 0, 0, 0, 1, 0, 0]
