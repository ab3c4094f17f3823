"""Balanced rendezvous assignment of partitions over workers (a pure function, property-tested) and the balancing
loop of several workers over one (in-memory) database: join, drain, death, a lost lease."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from balance_fakes import FakeClaim, FakeDatabase, FakeStore
from hypothesis import given, settings
from hypothesis import strategies as st

from harness_core.storage._postgres_balance import Balancer, Resources, assign

names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
worker_sets = st.lists(names, min_size=1, max_size=8, unique=True)
RESOURCES = range(1024)


def loads(found: dict[int, str], workers: list[str]) -> list[int]:
    counted = Counter(found.values())
    return [counted[w] for w in workers]


@settings(max_examples=60, deadline=None)
@given(workers=worker_sets, count=st.integers(0, 200), seed=st.integers(0, 2**32))
def test_every_resource_has_one_assignee_shares_are_even_and_the_order_of_workers_does_not_matter(
    workers: list[str], count: int, seed: int
) -> None:
    shuffled = list(workers)
    random.Random(seed).shuffle(shuffled)
    first = assign(range(count), workers)
    assert set(first) == set(range(count))
    assert set(first.values()) <= set(workers)
    assert assign(range(count), shuffled) == first  # every worker computes the same answer
    shares = loads(first, workers)
    assert max(shares) - min(shares) <= 1  # e.g. 4 partitions over 2 workers: 2 each, never 4 and 0


def test_a_joining_worker_always_gets_its_share_even_of_a_few_partitions() -> None:
    # Plain rendezvous gave a second worker none of 4 partitions for one holder pair in eight: it idled as
    # a standby while the first carried everything.
    for trial in range(300):
        pair = [f"worker-{trial}-a", f"worker-{trial}-b"]
        assert sorted(loads(assign(range(4), pair), pair)) == [2, 2], pair


@settings(max_examples=40, deadline=None)
@given(workers=worker_sets, newcomer=names)
def test_a_join_moves_little_more_than_the_newcomers_share(workers: list[str], newcomer: str) -> None:
    if newcomer in workers:
        return
    before = assign(RESOURCES, workers)
    after = assign(RESOURCES, [*workers, newcomer])
    moved = [r for r in RESOURCES if before[r] != after[r]]
    share = len(RESOURCES) // (len(workers) + 1)
    assert loads(after, [newcomer]) in ([share], [share + 1])
    assert len(moved) <= share * 1.6 + 2, (len(moved), share)  # never a reshuffle of the whole store


@settings(max_examples=40, deadline=None)
@given(workers=st.lists(names, min_size=2, max_size=8, unique=True), index=st.integers(0, 7))
def test_a_leave_moves_the_leavers_partitions_and_little_else(workers: list[str], index: int) -> None:
    leaver = workers[index % len(workers)]
    before = assign(RESOURCES, workers)
    after = assign(RESOURCES, [w for w in workers if w != leaver])
    moved = {r for r in RESOURCES if before[r] != after[r]}
    theirs = {r for r in RESOURCES if before[r] == leaver}
    assert theirs <= moved and len(moved) <= len(theirs) * 1.6 + 2, (len(moved), len(theirs))


def test_no_worker_no_assignment_and_a_name_given_twice_counts_once() -> None:
    assert assign(range(4), []) == {}
    assert assign(range(4), ["a", "a", "b"]) == assign(range(4), ["b", "a"])


# --- the loop --------------------------------------------------------------------------------------------


class Worker:
    """One worker: a FakeStore and a Balancer whose gain/lose callbacks record what runs here."""

    def __init__(self, db: FakeDatabase, name: str, resources: range, **options: Any) -> None:
        self.store = FakeStore(db, name)
        self.running: set[int] = set()
        self.lost: list[int] = []
        family = Resources(
            ids=tuple(resources),
            take=self.store.take,
            is_claim=lambda claim: isinstance(claim, FakeClaim),
            lost_of=lambda claim: claim.lost,
        )
        self.balancer = Balancer(
            self.store, [family], on_gain=self.gain, on_lose=self.lose, tick=0.02, **options
        )
        self.db = db

    async def gain(self, resource: int, claim: FakeClaim) -> None:
        assert resource not in self.running
        self.running.add(resource)

    async def lose(self, resource: int, claim: FakeClaim) -> None:
        self.running.discard(resource)
        if claim.lost.done():
            self.lost.append(resource)  # nothing is released: the lease is no longer ours
        else:
            self.db.release(claim)


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not reached within {timeout} s")


def balanced(db: FakeDatabase, workers: list[Worker], resources: range) -> bool:
    names = [w.store.holder for w in workers]
    wanted = assign(resources, names)
    return db.owners() == wanted and all(
        w.running == {r for r, n in wanted.items() if n == w.store.holder} for w in workers
    )


def never_two_owners(workers: list[Worker]) -> None:
    seen: dict[int, str] = {}
    for w in workers:
        for r in w.running:
            assert r not in seen, f"partition {r} runs on {seen[r]} and {w.store.holder}"
            seen[r] = w.store.holder


async def test_workers_join_balance_and_drain_without_two_owners() -> None:
    db = FakeDatabase()
    parts = range(64)
    first = Worker(db, "w1", parts)
    await first.balancer.start()
    assert first.running == set(parts)  # alone: everything, taken before start() returns
    others = [Worker(db, f"w{i}", parts, handover_per_tick=3) for i in (2, 3)]
    watching = True

    async def watch() -> None:
        while watching:
            never_two_owners([first, *others])
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch())
    try:
        for worker in others:
            await worker.balancer.start()
        await until(lambda: balanced(db, [first, *others], parts))
        # Hand-overs came a few per tick, not all at once.
        releases = [h for h in db.history if h[0] == "release"]
        assert len(releases) == sum(1 for r in parts if assign(parts, ["w1", "w2", "w3"])[r] != "w1")
        # A graceful stop hands everything over and leaves.
        await first.balancer.stop()
        assert first.running == set() and "w1" not in db.workers
        await until(lambda: balanced(db, others, parts))
    finally:
        watching = False
        await watcher
        for worker in others:
            await worker.balancer.stop()
    assert db.owners() == {} and db.workers == {}


async def test_a_dead_workers_partitions_are_taken_by_the_others() -> None:
    db = FakeDatabase()
    parts = range(16)
    workers = [Worker(db, f"w{i}", parts) for i in range(3)]
    for worker in workers:
        await worker.balancer.start()
    await until(lambda: balanced(db, workers, parts))
    dead = workers[1]
    dead.balancer._stopped = True  # it stops ticking, like a SIGKILLed process
    db.die("w1")
    survivors = [workers[0], workers[2]]
    await until(lambda: db.owners() == assign(parts, ["w0", "w2"]))
    assert dead.running  # it never noticed (it is dead): only the expiry freed its partitions
    for worker in survivors:
        await worker.balancer.stop()


async def test_a_partition_assigned_to_a_silent_worker_is_taken_after_the_grace() -> None:
    db = FakeDatabase()
    parts = range(8)
    db.workers["ghost"] = type("W", (), {"holder": "ghost", "draining": False})()  # joined, never takes
    mine = Worker(db, "me", parts, grace=0.2)
    await mine.balancer.start()
    ghosts = {r for r, n in assign(parts, ["ghost", "me"]).items() if n == "ghost"}
    assert ghosts and mine.running == set(parts) - ghosts
    await until(lambda: mine.running == set(parts))
    await asyncio.sleep(0.3)  # many ticks: what the silent worker left is not handed straight back to it
    assert mine.running == set(parts) and not [h for h in db.history if h[0] == "release"]
    await mine.balancer.stop()


async def test_one_lost_lease_closes_only_that_partition() -> None:
    db = FakeDatabase()
    parts = range(4)
    worker = Worker(db, "w", parts)
    await worker.balancer.start()
    claim = db.leases[2]
    del db.leases[2]  # another process took it over
    db.leases[2] = FakeClaim(2, "thief")
    claim.lost.set_result("taken over")
    await until(lambda: worker.lost == [2])
    assert worker.running == {0, 1, 3}
    await worker.balancer.stop()
    assert db.owners() == {2: "thief"}


async def test_shards_go_only_to_workers_that_own_a_partition() -> None:
    """Discord shards: a worker without a partition is a standby and connects to no platform."""
    db = FakeDatabase()
    parts, shards = range(1), tuple(-1 - s for s in range(4))
    workers = [Worker(db, f"w{i}", parts) for i in range(3)]
    for worker in workers:
        await worker.balancer.start()
    await until(lambda: balanced(db, workers, parts))
    owner = next(w for w in workers if w.running)
    shard_runs: dict[str, set[int]] = {w.store.holder: set() for w in workers}

    def shard_balancer(worker: Worker) -> Balancer:
        async def gain(shard: int, claim: FakeClaim) -> None:
            shard_runs[worker.store.holder].add(shard)

        async def lose(shard: int, claim: FakeClaim) -> None:
            shard_runs[worker.store.holder].discard(shard)
            db.release(claim)

        family = Resources(
            ids=shards,
            take=worker.store.take,
            is_claim=lambda claim: isinstance(claim, FakeClaim),
            lost_of=lambda claim: claim.lost,
            needs_partition=True,
        )
        return Balancer(
            worker.store,
            [family],
            on_gain=gain,
            on_lose=lose,
            tick=0.02,
            grace=0.1,
            membership=False,
            holds_partition=lambda: bool(worker.running),
        )

    balancers = [shard_balancer(w) for w in workers]
    for balancer in balancers:
        await balancer.start()
    await until(lambda: shard_runs[owner.store.holder] == set(shards))
    await asyncio.sleep(0.3)  # past the grace: the standbys still take none
    assert all(not runs for name, runs in shard_runs.items() if name != owner.store.holder)
    for balancer in balancers:
        await balancer.stop()
    assert {r for r in db.owners() if r < 0} == set()
    assert all(w.store.holder in db.workers for w in workers)  # the shard balancers leave membership alone
    for worker in workers:
        await worker.balancer.stop()
