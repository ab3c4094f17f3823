"""On PostgreSQL a message's ingress record is finished by the commit that takes the message in (the router's
owner side): one write transaction less per message, and never a stored message with its record unfinished or
the reverse. Fenced like every other row; other storage refuses to finish records it does not keep."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from pg_commit_cutter import CommitCutter
from pg_partition_support import expire, open_handle

from adapters.bridge import Bridge, IncomingMessage, Place, Router
from adapters.bridge.ingress import message_payload
from adapters.bridge.partitions import partition_of_place
from adapters.bridge.testing import MemoryTransport
from harness_core import AgentChange, Harness, HarnessSettings, InvalidOperation, ModelRef, Models, Registry
from harness_core.errors import LeaseLost, StorageRequestError, StrictJsonError
from harness_core.models.faux import FauxProvider, faux_assistant
from harness_core.storage import CommitBatch, MemoryStorage, PostgresStorage, PostgresStore, SqliteStorage

PARTITIONS = 4


def place_in(partition: int) -> Place:
    n = 0
    while partition_of_place(Place("memory", "T1", f"C{n}"), PARTITIONS) != partition:
        n += 1
    return Place("memory", "T1", f"C{n}")


async def ingress_rows(url: str) -> dict[str, bool]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT key, finished_at IS NOT NULL AS finished FROM ingress ORDER BY id")
    finally:
        await conn.close()
    return {row["key"]: row["finished"] for row in rows}


async def eventually(check: Callable[[dict[str, bool]], bool], url: str) -> None:
    for _ in range(400):
        if check(await ingress_rows(url)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not in time: {await ingress_rows(url)}")


async def submissions_of(url: str, request_ids: list[str]) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(
            await conn.fetchval("SELECT count(*) FROM submissions WHERE request_id = ANY($1)", request_ids)
        )
    finally:
        await conn.close()


async def commits_settled(url: str, partition: int) -> None:
    """Wait until the partition's commit sequence has not moved for half a second."""
    conn = await asyncpg.connect(url)
    try:
        last, steady = None, 0
        while steady < 10:
            seq = await conn.fetchval("SELECT last_seq FROM meta WHERE partition = $1", partition)
            steady = steady + 1 if seq == last else 0
            last = seq
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def owner_stack(
    store: PostgresStore, partition: int, transport: MemoryTransport
) -> tuple[Harness, Bridge, Router]:
    """What a worker runs for a partition it owns: harness, bridge (answers "noted"), router."""
    storage = await store.open_partition(partition)
    assert isinstance(storage, PostgresStorage), storage
    faux = FauxProvider()
    faux.set_responder(lambda _request: faux_assistant("noted"))
    registry = Registry()
    harness = await Harness.open(storage, models=Models(faux), registry=registry, settings=HarnessSettings())
    bridge = Bridge(harness, agent=AgentChange(model=ModelRef(provider="faux", model_id="m")))
    registry.install(bridge.extension())
    bridge.attach(transport)
    await bridge.start()
    harness.resume()  # as a worker does on gaining a partition: recovered work runs at once
    router = Router(store, PARTITIONS, poll_interval=0.05)
    await router.add_partition(partition, bridge)
    return harness, bridge, router


async def test_the_intake_commit_finishes_the_record_and_no_separate_finish_runs(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=PARTITIONS, lease_ttl=30)
    other = await PostgresStore.open(pg_url, partitions=PARTITIONS, lease_ttl=30)  # another worker's
    harness, bridge, owner = await owner_stack(store, 1, MemoryTransport())
    finished_apart: list[list[int]] = []
    finish = store.finish_ingresses

    async def spy(record_ids: Any) -> None:
        finished_apart.append(sorted(record_ids))
        await finish(record_ids)

    store.finish_ingresses = spy  # type: ignore[method-assign]
    sender = Router(other, PARTITIONS, consume=False)
    try:
        place = place_in(1)
        sent = [IncomingMessage(place, f"1.{n}", "U1", "alice", f"hello {n}") for n in range(5)]
        for item in sent:
            assert (await sender.intake(item)).outcome == "forwarded"
        await eventually(lambda rows: len(rows) == 5 and all(rows.values()), pg_url)
        assert finished_apart == []  # every record was finished by its intake's commit
        assert await submissions_of(pg_url, [m.request_id for m in sent]) == 5
        # The same message again (a redelivery through another worker): a duplicate, its record finished too.
        assert await other.put_ingress(1, "message", "duplicate-key", message_payload(sent[0]))
        await eventually(lambda rows: rows.get("duplicate-key", False), pg_url)
        assert finished_apart == [] and await submissions_of(pg_url, [sent[0].request_id]) == 1
    finally:
        await owner.stop()
        await sender.stop()
        await bridge.stop()
        await harness.close()
        await store.close()
        await other.close()


async def test_a_message_the_harness_refuses_has_its_record_finished_and_the_next_goes_on(
    pg_url: str,
) -> None:
    """The refusal rolls the intake commit back, the record's finish with it: the router finishes it apart
    (else it would be taken in and refused again forever, and a batch of them would stop the partition)."""
    store = await PostgresStore.open(pg_url, partitions=PARTITIONS, lease_ttl=30)
    other = await PostgresStore.open(pg_url, partitions=PARTITIONS, lease_ttl=30)
    harness, bridge, owner = await owner_stack(store, 1, MemoryTransport())
    submit = harness.submit_in
    refusals: list[str] = []

    async def refusing(tx: Any, conversation_id: int, draft: Any) -> Any:
        if "poison" in str(getattr(draft, "content", "")):
            refusals.append(str(draft.content))
            raise StrictJsonError("$.content: not valid JSON")
        return await submit(tx, conversation_id, draft)

    harness.submit_in = refusing  # type: ignore[method-assign]
    sender = Router(other, PARTITIONS, consume=False)
    try:
        place = place_in(1)
        sent = [
            IncomingMessage(place, f"1.{n}", "U1", "alice", text, mentions_bot=True)
            for n, text in enumerate(["poison", "fine"])
        ]
        for item in sent:
            await sender.intake(item)
        await eventually(lambda rows: len(rows) == 2 and all(rows.values()), pg_url)
        await commits_settled(pg_url, 1)
        assert len(refusals) == 1  # taken in once, refused once
        assert await submissions_of(pg_url, [sent[1].request_id]) == 1
    finally:
        await owner.stop()
        await sender.stop()
        await bridge.stop()
        await harness.close()
        await store.close()
        await other.close()


async def test_only_this_partitions_records_and_never_from_a_fenced_out_holder(pg_url: str) -> None:
    old_store = await PostgresStore.open(pg_url, partitions=PARTITIONS, lease_ttl=30)
    new_store = await PostgresStore.open(pg_url, partitions=PARTITIONS, lease_ttl=30)
    try:
        for key, partition in (("mine", 2), ("theirs", 3), ("late", 2)):
            assert await old_store.put_ingress(partition, "message", key, {"n": 1})
        ids = {r.key: r.id for r in await old_store.pending_ingress(range(PARTITIONS))}
        old = await open_handle(old_store, 2)
        # A record of another partition named by mistake is left alone (its owner takes it in).
        await old.commit([CommitBatch(seq=1, next_id=9, ingress_finished=[ids["mine"], ids["theirs"]])])
        assert await ingress_rows(pg_url) == {"mine": True, "theirs": False, "late": False}
        await expire(pg_url, 2)
        new = await open_handle(new_store, 2)
        with pytest.raises(LeaseLost, match="partition 2"):
            await old.commit([CommitBatch(seq=2, next_id=9, ingress_finished=[ids["late"]])])
        assert await ingress_rows(pg_url) == {"mine": True, "theirs": False, "late": False}
        await new.commit(
            [CommitBatch(seq=5_000, next_id=99_999, ingress_finished=[ids["late"], ids["mine"]])]
        )
        assert await ingress_rows(pg_url) == {"mine": True, "theirs": False, "late": True}
        await new.close()
    finally:
        await old_store.close()
        await new_store.close()


async def test_storage_without_ingress_records_refuses_to_finish_one(tmp_path: Any) -> None:
    memory = await MemoryStorage.open()
    sqlite = await SqliteStorage.open(tmp_path / "bot.sqlite")
    for storage in (memory, sqlite):
        with pytest.raises(StorageRequestError, match="keeps no ingress records"):
            await storage.commit([CommitBatch(seq=1, next_id=2, ingress_finished=[7])])
        await storage.close()
    harness = await Harness.open(
        await MemoryStorage.open(), models=Models(FauxProvider()), registry=Registry()
    )
    with pytest.raises(InvalidOperation, match="keeps no ingress records"):
        await harness.commit(lambda tx: tx.finish_ingress(7))
    await harness.close()


async def test_an_intake_commit_cut_off_at_the_worst_moment_leaves_record_and_message_together(
    pg_url: str,
) -> None:
    # The intake commit reaches the server and lands, but its answer never comes back (the connection is cut):
    # the owner cannot know. Finished in that same commit, the record is finished exactly because the message
    # is stored, and the worker taking the partition over neither takes it in again nor loses it.
    cutter = CommitCutter(pg_url)
    store = await PostgresStore.open(await cutter.start(), partitions=PARTITIONS, lease_ttl=30)
    sender_store = await PostgresStore.open(pg_url, partitions=PARTITIONS, lease_ttl=30)
    successor_store = await PostgresStore.open(pg_url, partitions=PARTITIONS, lease_ttl=30)
    first, second = MemoryTransport(), MemoryTransport()
    harness, bridge, router = await owner_stack(store, 1, first)
    sender = Router(sender_store, PARTITIONS, consume=False)
    stacks = [(harness, bridge, router)]
    try:
        await commits_settled(
            pg_url, 1
        )  # the owner's start-up commits are done: the next one is the intake's
        cutter.armed = True
        message = IncomingMessage(place_in(1), "7.1", "U1", "alice", "deploy status?", mentions_bot=True)
        assert (await sender.intake(message)).outcome == "forwarded"
        for _ in range(200):
            if cutter.cut:
                break
            await asyncio.sleep(0.05)
        assert cutter.cut == 1
        # Right after the cut, before anyone else acts: both landed, in the one commit.
        assert list((await ingress_rows(pg_url)).values()) == [True]
        assert await submissions_of(pg_url, [message.request_id]) == 1
        await asyncio.wait_for(harness.closed, 10)  # an unknown outcome ends the owner's harness
        await expire(pg_url, 1)
        stacks.append(await owner_stack(successor_store, 1, second))
        for _ in range(200):
            if [m for m in second.in_place(message.place) if "noted" in m.text]:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # polls of the ingress table meanwhile: the finished record stays taken
        assert await submissions_of(pg_url, [message.request_id]) == 1
        answers = [
            m for m in [*first.in_place(message.place), *second.in_place(message.place)] if "noted" in m.text
        ]
        assert len(answers) == 1, answers
    finally:
        for each_harness, each_bridge, each_router in reversed(stacks):
            await each_router.stop()
            await each_bridge.stop()
            await each_harness.close()
        await sender.stop()
        for each_store in (store, sender_store, successor_store):
            await each_store.close()
        await cutter.close()
