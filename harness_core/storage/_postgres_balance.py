"""Spreading partitions (and other leased resources, e.g. Discord shards) over the live workers.

No coordinator: every worker computes the same assignment from the same inputs, the set of live workers read
from the database, with rendezvous (highest-random-weight) hashing under an exact balance (`assign`): each
resource goes to the worker whose hash of (worker, resource) is highest among those with room left, so

- every resource has exactly one assignee among the live workers, whoever computes it;
- every worker is assigned the same share, give or take one (a joining worker always gets its share);
- a join or a leave moves about that share and a little more, never a reshuffle of the whole store. The "more"
  can move a partition between two old workers; while workers briefly disagree on who is live, a partition
  handed over may stay free until its new assignee's next tick (a second at most).

`Balancer` is the loop of one worker around it. Each tick (every `tick` seconds, or at once when the store
says a lease was released or a worker joined or left) it renews its worker row, then

- takes the free resources assigned to it;
- hands over (drain: `on_lose`, which closes the partition's runtime and so releases its lease) the ones it
  holds that are assigned to another live worker, at most `handover_per_tick` per tick, so a join moves load
  gradually instead of stopping every partition at once;
- takes any resource left free longer than `grace` seconds, whoever it is assigned to (its assignee is alive
  but slow or stuck), so nothing stays unowned, and keeps it for a few graces before handing it back. The grace
  should exceed the ttl: a dead worker's row expires within the ttl, and then its resources are simply
  assigned to the live workers;
- drops a resource whose lease was lost (paused past the ttl, cut off from the database): `on_lose` closes
  its runtime, which writes nothing more since its lease is no longer valid.

`stop()` marks the worker draining (the others stop assigning to it), hands everything over and deletes the
worker row. A worker that dies simply stops renewing: its row and its leases expire after the ttl and the
others take its resources then.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("harness_core.storage")


def weight(worker: str, resource: int) -> int:
    """The rendezvous weight of `resource` for `worker`: 8 bytes of blake2b, stable across processes and
    machines (unlike `hash()`)."""
    digest = hashlib.blake2b(f"{worker}\x00{resource}".encode(errors="surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def assign(resources: Collection[int], workers: Collection[str]) -> dict[int, str]:
    """Every resource's assignee among `workers` (empty when there is none): rendezvous with an exact balance.

    In resource order, each resource goes to its highest-weight worker that still has room, and room is exact:
    every worker ends with floor(r / w) or ceil(r / w) of the r resources (the first r mod w workers to fill
    up get the one more). Plain rendezvous moves the least on a join, but its shares are uneven (64 partitions
    over 5 workers: 9 on one, 17 on another), and with few partitions it often gives a joining worker none at
    all, which then idles as a standby while another carries double. Balanced, a join moves a little more than
    its share (measured: about 15 partitions of 64 for a fifth worker, against the 12 or 13 it takes) and every worker
    carries the same load. Ties (astronomically unlikely) go to the greater worker name, so the result never
    depends on the order of `workers`."""
    workers = sorted(set(workers))  # a name twice would count as room that is not there
    if not workers:
        return {}
    base, extra = divmod(len(resources), len(workers))
    load = dict.fromkeys(workers, 0)
    above = 0  # workers already holding base + 1: at most `extra` of them
    found: dict[int, str] = {}
    for resource in sorted(resources):
        ranked = sorted(workers, key=lambda worker: (weight(worker, resource), worker), reverse=True)
        # Always found: the room left (n * base + extra - placed) is at least one until all are placed.
        chosen = next(w for w in ranked if load[w] < base or (load[w] == base and above < extra))
        load[chosen] += 1
        if load[chosen] == base + 1:
            above += 1
        found[resource] = chosen
    return found


class Worker(Protocol):
    @property
    def holder(self) -> str: ...

    @property
    def draining(self) -> bool: ...


class BalanceStore(Protocol):
    """The store-wide operations the balancer needs (`PostgresStore` implements them)."""

    holder: str

    async def heartbeat(self, *, draining: bool = False) -> None: ...

    async def live_workers(self) -> Sequence[Worker]: ...

    async def leases(self) -> Mapping[int, Any]: ...

    async def leave(self) -> None: ...

    def on_change(self, callback: Callable[[], None]) -> Callable[[], None]: ...


@dataclass(frozen=True)
class Resources:
    """One family of leased resources the balancer spreads: `ids`, how to take one (`take` returns the claim,
    or something else, e.g. the current `LeaseHolder`, when it is taken), and the future that resolves when a
    claim's lease is lost (`lost_of`).

    `needs_partition`: assign these only over workers that hold at least one partition (Discord shards: a
    worker that owns no partition is a standby and connects to no platform)."""

    ids: tuple[int, ...]
    take: Callable[[int], Awaitable[object]]
    is_claim: Callable[[object], bool]
    lost_of: Callable[[Any], asyncio.Future[Any]]
    needs_partition: bool = False


class Balancer:
    """One worker's balancing loop (see the module docstring). `on_gain(resource, claim)` opens what runs on a
    resource; `on_lose(resource, claim)` closes it (for a partition: stop the bridge, close the harness, which
    releases the lease). Both are awaited, never run concurrently with each other, and may raise (logged; a
    failed gain is retried on a later tick)."""

    def __init__(
        self,
        store: BalanceStore,
        families: Sequence[Resources],
        *,
        on_gain: Callable[[int, Any], Awaitable[None]],
        on_lose: Callable[[int, Any], Awaitable[None]],
        tick: float = 1.0,
        grace: float = 5.0,
        handover_per_tick: int = 4,
        on_owned_changed: Callable[[int], None] | None = None,
        membership: bool = True,
        holds_partition: Callable[[], bool] | None = None,
    ) -> None:
        """`membership=False`: a second balancer of the same worker (e.g. over Discord shards, started once the
        shard count is known) that neither heartbeats nor leaves: the partition balancer does.
        `holds_partition`: whether this worker owns a partition now (default: one of this balancer's)."""
        self.store = store
        self.families = list(families)
        self.on_gain = on_gain
        self.on_lose = on_lose
        self.tick = tick
        self.grace = grace
        self.handover_per_tick = handover_per_tick
        self.on_owned_changed = on_owned_changed
        self.membership = membership
        self.holds_partition = holds_partition or (lambda: bool(self.partitions))
        self.owned: dict[int, Any] = {}  # resource -> claim, in the order taken
        self.draining = False
        self._family_of = {rid: family for family in self.families for rid in family.ids}
        self._free_since: dict[int, float] = {}
        self._rescued: dict[int, tuple[str, float]] = {}  # resource -> (assignee that left it free, when)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._stopped = False
        self.ticks = 0

    @property
    def partitions(self) -> list[int]:
        """Owned resources that are partitions (non-negative ids)."""
        return sorted(rid for rid in self.owned if rid >= 0)

    def wake(self) -> None:
        self._wake.set()

    async def start(self) -> None:
        """Join (one tick at once, so the first resources are taken before this returns) and keep ticking in a
        task this object owns (`stop()` ends it)."""
        self._unsubscribe = self.store.on_change(self.wake)
        await self.step()
        self._task = asyncio.create_task(self._loop(), name="partition-balancer")

    async def _loop(self) -> None:
        failing = False
        while not self._stopped:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.tick)
            self._wake.clear()
            if self._stopped:
                return
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is unreachable for a while: leases tell the truth
                # Once per outage, not once per tick.
                (log.debug if failing else log.warning)("balancing partitions failed (%s); retrying", exc)
                failing = True
                continue
            if failing:
                log.warning("balancing partitions works again")
                failing = False

    async def step(self) -> None:
        """One tick: drop lost claims, heartbeat, then take, hand over and rescue as the module says."""
        self.ticks += 1
        await self._drop_lost()
        if self.membership:
            await self.store.heartbeat(draining=self.draining)
        if self.draining:
            return
        workers = await self.store.live_workers()
        live = sorted({w.holder for w in workers if not w.draining} | {self.store.holder})
        leases = await self.store.leases()
        holding = {rid: _holder_name(value) for rid, value in leases.items()}
        with_partitions = sorted(
            {name for rid, name in holding.items() if rid >= 0 and name is not None and name in live}
            | ({self.store.holder} if self.holds_partition() else set())
        )
        now = time.monotonic()
        handed = 0
        for family in self.families:
            among = with_partitions if family.needs_partition else live
            targets = assign(family.ids, among)
            for rid in family.ids:
                if self._stopped:
                    return  # stop() waits for this tick: end it early, stop() hands everything over
                target = targets.get(rid)
                if rid in self.owned:
                    self._free_since.pop(rid, None)
                    if (
                        target is not None
                        and target != self.store.holder
                        and handed < self.handover_per_tick
                        and not self._gave_up_on(rid, target, now)
                    ):
                        handed += 1
                        await self._lose(rid)
                    continue
                if holding.get(rid) is not None:
                    self._free_since.pop(rid, None)
                    continue
                if family.needs_partition and not self.holds_partition():
                    continue  # a standby takes no platform resource
                first_free = self._free_since.setdefault(rid, now)
                if target == self.store.holder:
                    await self._gain(rid, family)
                elif now - first_free >= self.grace and await self._gain(rid, family) and target is not None:
                    # Its assignee is alive (its row is fresh) yet does not take it: keep it a while rather
                    # than hand it straight back (a dead worker's row expires within the ttl, before this).
                    self._rescued[rid] = (target, now)

    def _gave_up_on(self, rid: int, target: str, now: float) -> bool:
        """Did `target` leave `rid` free past the grace lately (then we keep it for a while)?"""
        rescued = self._rescued.get(rid)
        if rescued is None:
            return False
        if rescued[0] != target or now - rescued[1] >= self.grace * 3:
            del self._rescued[rid]
            return False
        return True

    async def _gain(self, rid: int, family: Resources) -> bool:
        try:
            claim = await family.take(rid)
        except Exception as exc:
            log.warning("taking partition %s failed (%s); retrying", rid, exc)
            return False
        if not family.is_claim(claim):
            self._free_since.pop(rid, None)  # someone else was quicker
            return False
        self._free_since.pop(rid, None)
        try:
            await self.on_gain(rid, claim)
        except Exception:
            log.exception("opening partition %s failed; retrying later", rid)
            return False
        self.owned[rid] = claim
        family.lost_of(claim).add_done_callback(lambda _: self.wake())
        self._changed()
        return True

    async def _lose(self, rid: int) -> None:
        claim = self.owned.pop(rid)
        try:
            await self.on_lose(rid, claim)
        except Exception:
            log.exception("closing partition %s failed", rid)
        self._changed()

    async def _drop_lost(self) -> None:
        for rid, claim in list(self.owned.items()):
            if self._family_of[rid].lost_of(claim).done():
                await self._lose(rid)

    def _changed(self) -> None:
        if self.on_owned_changed is not None:
            self.on_owned_changed(len(self.partitions))

    async def stop(self) -> None:
        """Drain: tell the others (draining heartbeat), hand every resource over, leave. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._wake.set()
        if self._task is not None:
            # Not cancelled: a tick may be opening a partition (its lease taken, its harness recovering);
            # it ends after that step and the drain below closes what it opened.
            with contextlib.suppress(Exception):
                await self._task
            self._task = None
        self.draining = True
        if self.membership:
            with contextlib.suppress(Exception):
                await self.store.heartbeat(draining=True)
        for rid in list(self.owned):
            await self._lose(rid)
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self.membership:
            with contextlib.suppress(Exception):
                await self.store.leave()


def _holder_name(value: Any) -> str | None:
    """A lease map value (a `LeaseHolder`, a holder string or None) -> the holder's name."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    name = getattr(value, "holder", None)
    return name if isinstance(name, str) else None
