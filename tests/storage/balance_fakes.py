"""An in-memory stand-in for the store-wide operations the balancer uses (worker rows, leases, change
notifications), shared by several `FakeStore`s like one database shared by worker processes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class FakeWorker:
    holder: str
    draining: bool = False


@dataclass
class FakeClaim:
    resource: int
    holder: str
    lost: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class FakeDatabase:
    def __init__(self) -> None:
        self.workers: dict[str, FakeWorker] = {}
        self.leases: dict[int, FakeClaim] = {}
        self.listeners: list[Callable[[], None]] = []
        self.history: list[tuple[str, int, str]] = []  # ("take" | "release", resource, holder)

    def notify(self) -> None:
        for listener in list(self.listeners):
            listener()

    def take(self, resource: int, holder: str) -> FakeClaim | str:
        current = self.leases.get(resource)
        if current is not None:
            return current.holder
        claim = self.leases[resource] = FakeClaim(resource, holder)
        self.history.append(("take", resource, holder))
        return claim

    def release(self, claim: FakeClaim) -> None:
        if self.leases.get(claim.resource) is claim:
            del self.leases[claim.resource]
            self.history.append(("release", claim.resource, claim.holder))
            self.notify()

    def die(self, holder: str) -> None:
        """The worker's row and leases expire (it stopped renewing); nobody is notified (expiry is silent)."""
        self.workers.pop(holder, None)
        for resource, claim in list(self.leases.items()):
            if claim.holder == holder:
                del self.leases[resource]
                if not claim.lost.done():
                    claim.lost.set_result("expired")

    def owners(self) -> dict[int, str]:
        return {resource: claim.holder for resource, claim in self.leases.items()}


class FakeStore:
    def __init__(self, db: FakeDatabase, holder: str) -> None:
        self.db = db
        self.holder = holder
        self.heartbeats = 0

    async def heartbeat(self, *, draining: bool = False) -> None:
        self.heartbeats += 1
        joined = self.holder not in self.db.workers
        self.db.workers[self.holder] = FakeWorker(self.holder, draining)
        if joined:
            self.db.notify()

    async def live_workers(self) -> list[FakeWorker]:
        return sorted(self.db.workers.values(), key=lambda w: w.holder)

    async def leases(self) -> dict[int, str | None]:
        return dict(self.db.owners())

    async def leave(self) -> None:
        if self.db.workers.pop(self.holder, None) is not None:
            self.db.notify()

    def on_change(self, callback: Callable[[], None]) -> Callable[[], None]:
        self.db.listeners.append(callback)
        return lambda: self.db.listeners.remove(callback)

    async def take(self, resource: int) -> FakeClaim | str:
        await asyncio.sleep(0)
        return self.db.take(resource, self.holder)
