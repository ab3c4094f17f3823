"""`Router` (issue 16): a worker owning some partitions takes in what belongs to them and commits the rest as
ingress records for their owners, whose consumers feed them through the usual exactly-once intake and
decisions. Each partition is a real bot (harness, bridge); the workers share one `MemoryIngress`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from adapters.bridge import (
    ApprovalPolicy,
    Bridge,
    ClickOrigin,
    IncomingMessage,
    Place,
    Router,
    partition_of_place,
)
from adapters.bridge.ingress import MESSAGE, message_payload
from adapters.bridge.partitions import partition_of_key
from adapters.bridge.testing import MemoryIngress, MemoryTransport

from .support import Bot, deploy_flow
from .test_approval_edges import deploy_tool, gate_id, gate_message

BotFactory = Callable[..., Awaitable[Bot]]
PARTITIONS = 4
FAST = 0.05  # the consumers' polling interval in these tests


def place_in(partition: int, *, start: int = 0) -> Place:
    """A channel place whose partition is `partition`."""
    n = start
    while True:
        place = Place("memory", "T1", f"C{n}")
        if partition_of_place(place, PARTITIONS) == partition:
            return place
        n += 1


def message(place: Place, message_id: str, text: str, **kwargs: Any) -> IncomingMessage:
    return IncomingMessage(place, message_id, "U1", "alice", text, mentions_bot=True, **kwargs)


async def eventually(check: Callable[[], Awaitable[bool]], what: str, *, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if await check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def has_texts(bot: Bot, place: Place, texts: list[str]) -> bool:
    doc = await bot.bridge.place_doc(place)
    if doc is None:
        return False
    entries = await bot.user_entries(place)
    return entries == [f"alice: {t}" for t in texts]


@pytest.fixture
async def routers() -> Any:
    """`make(ingress, **kwargs)` -> a Router; every one is stopped after the test (before the bots close)."""
    made: list[Router] = []

    def make(ingress: MemoryIngress, **kwargs: Any) -> Router:
        router = Router(ingress, PARTITIONS, poll_interval=kwargs.pop("poll_interval", FAST), **kwargs)
        made.append(router)
        return router

    yield make
    for router in made:
        await router.stop()


@pytest.mark.parametrize("direct", [False, True])
async def test_a_message_is_taken_in_by_its_partitions_owner_whichever_worker_it_reached(
    bots: BotFactory, routers: Any, direct: bool
) -> None:
    ingress, platform = MemoryIngress(), MemoryTransport()
    here, there = await bots(platform=platform), await bots(platform=platform)
    a, b = routers(ingress, direct_intake=direct), routers(ingress, direct_intake=direct)
    a.attach(platform)
    b.attach(platform)
    await a.add_partition(0, here.bridge)
    await b.add_partition(1, there.bridge)
    mine, theirs = place_in(0), place_in(1)

    assert (await a.intake(message(mine, "1.1", "hello"))).outcome == ("answering" if direct else "forwarded")
    forwarded = await a.intake(message(theirs, "1.2", "over there"))
    assert forwarded.outcome == "forwarded"
    expected = [(1, MESSAGE, theirs.message_key("1.2"))]
    if not direct:  # every message through ingress, its owner's included
        expected.insert(0, (0, MESSAGE, mine.message_key("1.1")))
    assert [(r.partition, r.kind, r.key) for r in ingress.records.values()] == expected

    await eventually(lambda: has_texts(there, theirs, ["over there"]), "the owner to take it in")
    await eventually(lambda: has_texts(here, mine, ["hello"]), "this worker to take its own in")
    await eventually(lambda: asyncio.sleep(0, not ingress.unfinished()), "the records to be finished")
    assert await here.bridge.place_doc(theirs) is None  # never taken in by the worker it reached
    assert await there.bridge.place_doc(mine) is None
    await there.settle()
    assert platform.texts(theirs) == ["answer to alice: over there"]
    assert (a.forwarded, b.consumed) == (1 if direct else 2, 1)


async def test_a_channels_messages_keep_their_order_whichever_worker_each_reached(
    bots: BotFactory, routers: Any
) -> None:
    """The platform hands each event to a random worker: the owner must not take its own ahead of one that
    was committed earlier by another worker and is still on its way."""
    ingress, platform = MemoryIngress(), MemoryTransport()
    ingress.notify = False  # the other worker's records arrive only with the owner's next poll
    owner = await bots(platform=platform)
    other, mine = routers(ingress), routers(ingress, poll_interval=0.3)
    mine.attach(platform)
    await mine.add_partition(2, owner.bridge)
    place = place_in(2)
    texts = [f"m{i}" for i in range(6)]
    for i, text in enumerate(texts):
        await (other if i % 2 == 0 else mine).intake(message(place, f"8.{i + 10}", text))
    await eventually(lambda: has_texts(owner, place, texts), "every message, in the order committed")


async def test_a_message_arriving_directly_and_via_ingress_is_taken_in_once(
    bots: BotFactory, routers: Any
) -> None:
    ingress, platform = MemoryIngress(), MemoryTransport()
    owner = await bots(platform=platform)
    a, b = routers(ingress), routers(ingress, direct_intake=True)
    a.attach(platform)
    b.attach(platform)
    await b.add_partition(2, owner.bridge)
    place = place_in(2)
    first, second = message(place, "5.1", "once"), message(place, "5.2", "twice")

    # first: via ingress, then directly; second: directly, then via ingress.
    assert (await a.intake(first)).outcome == "forwarded"
    await eventually(lambda: asyncio.sleep(0, not ingress.unfinished()), "the forwarded record")
    assert (await b.intake(first)).outcome == "duplicate"
    assert (await b.intake(second)).outcome == "answering"
    assert (await a.intake(second)).outcome == "forwarded"
    await eventually(lambda: asyncio.sleep(0, not ingress.unfinished()), "the second record")

    assert await owner.user_entries(place) == ["alice: once", "alice: twice"]
    await owner.settle()
    assert platform.texts(place) == ["answer to alice: once", "answer to alice: twice"]
    assert owner.bridge.stats.duplicates["memory"] == 2


async def test_forwarded_records_keep_their_order_within_a_place_even_without_notifications(
    bots: BotFactory, routers: Any
) -> None:
    ingress, platform = MemoryIngress(), MemoryTransport()
    ingress.notify = False  # every notification lost: the consumer's polling alone must find them
    owner = await bots(platform=platform)
    a = routers(ingress)
    b = routers(ingress, batch=3)  # several batches
    b.attach(platform)
    place = place_in(3)
    texts = [f"m{i}" for i in range(10)]
    for i, text in enumerate(texts):
        await a.intake(message(place, f"7.{i + 10}", text))
    await b.add_partition(3, owner.bridge)  # the owner arrives after the records were written
    await eventually(lambda: has_texts(owner, place, texts), "every record, in order")
    assert not ingress.unfinished()


async def test_a_poison_record_is_refused_with_its_id_and_the_consumer_goes_on(
    bots: BotFactory, routers: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ingress, platform = MemoryIngress(), MemoryTransport()
    owner = await bots(platform=platform)
    place = place_in(1)
    broken = ingress.put_raw(1, MESSAGE, "memory:T1:x:1", {"v": 1, "place": {"platform": "memory"}})
    unknown = ingress.put_raw(1, "reaction", "memory:T1:x:2", {"v": 1})
    payload = message_payload(message(place, "9.1", "a"))
    payload["text"] = 42
    wrong_type = ingress.put_raw(1, MESSAGE, "memory:T1:x:3", payload)
    elsewhere = ingress.put_raw(
        1, MESSAGE, "memory:T1:x:4", message_payload(message(place_in(2), "9.2", "b"))
    )
    newer = ingress.put_raw(
        1, MESSAGE, "memory:T1:x:5", {**message_payload(message(place, "9.3", "c")), "v": 2}
    )
    # A lone surrogate written by some other writer comes back as the adapters' valid text.
    lone = ingress.put_raw(1, MESSAGE, place.message_key("9.4"), message_payload(message(place, "9.4", "x")))
    ingress.records[lone].payload["text"] = "bad \ud800 half"
    router = routers(ingress)
    router.attach(platform)
    with caplog.at_level(logging.ERROR, logger="adapters.bridge.router"):
        await routers(ingress).intake(message(place, "9.5", "after the poison"))  # forwarded: after them
        await router.add_partition(1, owner.bridge)
        await eventually(lambda: asyncio.sleep(0, not ingress.unfinished()), "every record finished")
    assert await owner.user_entries(place) == ["alice: bad \ufffd half", "alice: after the poison"]
    assert router.refused == 5
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for record_id in (broken, unknown, wrong_type, elsewhere, newer):
        assert f"ingress record {record_id} " in logged
    assert "`text` must be a string" in logged and "unknown ingress kind 'reaction'" in logged
    assert "does not belong to partition 1" in logged and "version 2" in logged


async def test_remove_partition_stops_its_consumer_and_leaves_pending_records_for_the_next_owner(
    bots: BotFactory, routers: Any
) -> None:
    ingress, platform = MemoryIngress(), MemoryTransport()
    owner = await bots(platform=platform)
    a, b, c = routers(ingress), routers(ingress), routers(ingress)
    for router in (a, b, c):
        router.attach(platform)
    place = place_in(0)
    await b.add_partition(0, owner.bridge)
    await a.intake(message(place, "3.1", "before"))
    await eventually(lambda: has_texts(owner, place, ["before"]), "the first owner to take it in")

    tasks = list(b._tasks[0])
    assert await b.remove_partition(0) is owner.bridge
    assert all(t.done() for t in tasks) and b.owned() == frozenset()
    assert (await b.intake(message(place, "3.2", "while nobody owns it"))).outcome == "forwarded"
    await asyncio.sleep(FAST * 6)  # several polling rounds of the removed consumer, had it survived
    assert [r.key for r in ingress.unfinished()] == [place.message_key("3.2")]
    assert await owner.user_entries(place) == ["alice: before"]

    await c.add_partition(0, owner.bridge)  # the next owner (here: the same harness, handed over)
    await eventually(lambda: has_texts(owner, place, ["before", "while nobody owns it"]), "the next owner")
    assert not ingress.unfinished()


async def test_a_failing_store_delays_records_without_losing_them(bots: BotFactory, routers: Any) -> None:
    ingress, platform = MemoryIngress(), MemoryTransport()
    owner = await bots(platform=platform)
    router = routers(ingress)
    router.attach(platform)
    place = place_in(2)
    await routers(ingress).intake(message(place, "4.1", "kept"))
    ingress.fail_next("finish_ingress", ConnectionError("connection dropped"))
    await router.add_partition(2, owner.bridge)
    await eventually(lambda: asyncio.sleep(0, not ingress.unfinished()), "the record finished on a retry")
    assert await owner.user_entries(place) == ["alice: kept"]  # taken in twice, once as a duplicate
    assert owner.bridge.stats.duplicates["memory"] == 1


async def asked_to_deploy(
    bots: BotFactory, platform: MemoryTransport, runs: list[str], policy: ApprovalPolicy
) -> tuple[Bot, Any]:
    """A bot on `platform` asked by alice to deploy: its approval card is up (returned with the bot)."""
    owner = await bots(
        platform=platform, responder=deploy_flow, tools=[deploy_tool(runs)], approvals=[policy]
    )
    await owner.say("100.1", "ship it", user="U1", name="alice")
    return owner, await gate_message(owner)


async def test_a_forwarded_click_is_decided_once_by_the_gates_owner(bots: BotFactory, routers: Any) -> None:
    ingress, platform = MemoryIngress(), MemoryTransport()
    runs: list[str] = []
    owner, card = await asked_to_deploy(
        bots, platform, runs, ApprovalPolicy(tools=["deploy"], approvers=["UBOSS"])
    )
    gate = gate_id(card)
    partition = gate % PARTITIONS
    a, b = routers(ingress), routers(ingress)
    a.attach(platform)
    b.attach(platform)

    # Reached a worker that cannot read the gate: forwarded without a pre-check; a double click is one record.
    origin = ClickOrigin(card.target.channel, card.id)
    for _ in range(2):
        decision = await a.decide(
            gate, user_id="UBOSS", user_name="boss", action="approve", origin=origin, platform="memory"
        )
        assert (decision.accepted, decision.forwarded, decision.status) == (True, True, "approved")
    assert len(ingress.records) == 1
    await b.add_partition(partition, owner.bridge)
    await eventually(lambda: asyncio.sleep(0, not ingress.unfinished()), "the click record")
    doc = await owner.bridge.gate_doc(gate)
    assert doc is not None and (doc["status"], doc["decided_by"]) == ("approved", "boss")
    for _ in range(500):
        await owner.settle()
        if runs:
            break
        await asyncio.sleep(0.01)
    assert runs == ["api"]


async def test_a_click_its_owner_refused_leaves_the_clickers_key_free_for_a_later_valid_click(
    bots: BotFactory, routers: Any
) -> None:
    """A worker that cannot read the gate (a separate intake process) forwards every click. Bob clicks before
    he is in the approvers' group: the owner refuses it. Once in the group he clicks again, and that click is
    decided, not taken for a repeat of the refused one."""
    ingress, platform = MemoryIngress(), MemoryTransport()
    owner, card = await asked_to_deploy(bots, platform, [], ApprovalPolicy(tools=["deploy"], groups=["GOPS"]))
    gate = gate_id(card)
    intake, consumer = routers(ingress, consume=False), routers(ingress)
    intake.attach(platform)
    consumer.attach(platform)
    await consumer.add_partition(gate % PARTITIONS, owner.bridge)
    origin = ClickOrigin(card.target.channel, card.id)

    async def click(groups: tuple[str, ...]) -> None:
        decision = await intake.decide(
            gate,
            user_id="UBOB",
            user_name="bob",
            action="approve",
            user_groups=groups,
            origin=origin,
            platform="memory",
        )
        assert (decision.accepted, decision.forwarded) == (True, True)
        await eventually(lambda: asyncio.sleep(0, not ingress.unfinished()), "the click taken")

    await click(())
    doc = await owner.bridge.gate_doc(gate)
    assert doc is not None and doc["status"] == "pending"  # refused: bob was not an approver yet
    assert not ingress.records  # dropped, not kept for a day under bob's key
    await click(("GOPS",))
    doc = await owner.bridge.gate_doc(gate)
    assert doc is not None and (doc["status"], doc["decided_by"]) == ("approved", "bob")
    assert len(ingress.records) == 1 and not ingress.unfinished()  # the accepted one is kept (finished)


async def test_a_click_the_owner_would_refuse_is_answered_at_once_by_the_worker_it_reached(
    bots: BotFactory, routers: Any
) -> None:
    ingress, platform = MemoryIngress(), MemoryTransport()
    policy = ApprovalPolicy(tools=["deploy"], approvers=["UBOSS"])
    owner = await bots(platform=platform, responder=deploy_flow, tools=[deploy_tool([])], approvals=[policy])
    await owner.say("100.1", "ship it", user="U1", name="alice")
    card = await gate_message(owner)
    gate = gate_id(card)
    # This worker owns another partition; its harness reads the whole store (here: the same one).
    reader = Bridge(owner.harness)
    a = routers(ingress)
    a.attach(platform)
    await a.add_partition((gate + 1) % PARTITIONS, reader)
    refused = await a.decide(
        gate,
        user_id="UNOBODY",
        user_name="eve",
        action="approve",
        origin=ClickOrigin(card.target.channel, card.id),
        platform="memory",
    )
    assert (refused.accepted, refused.reason, refused.forwarded) == (False, "not_an_approver", False)
    wrong = await a.decide(
        gate, user_id="UBOSS", user_name="boss", action="approve", origin=ClickOrigin("elsewhere", "1")
    )
    assert (wrong.accepted, wrong.reason) == (False, "wrong_message")
    assert not ingress.records


async def test_a_partition_gained_later_catches_up_its_share_through_the_attached_transports(
    bots: BotFactory, routers: Any
) -> None:
    ingress, platform = MemoryIngress(), MemoryTransport()
    owner = await bots(platform=platform)
    router = routers(ingress)
    router.attach(platform)
    mine, other = place_in(1), place_in(2)
    for place in (mine, other):
        platform.human[place.key] = [message(place, "10.5", f"missed in {place.channel}")]
    # The adapter's start-up catch-up, while this worker owns nothing yet: nothing taken in, remembered.
    assert await router.catch_up(platform, [mine, other], first_after="10.0") == 0
    await router.add_partition(1, owner.bridge)
    await eventually(lambda: has_texts(owner, mine, [f"missed in {mine.channel}"]), "the partition catch-up")
    assert await owner.bridge.place_doc(other) is None
    assert ("history", other.key) not in platform.calls  # another worker's share


async def test_every_partition_bridge_shares_the_routers_transports_and_governors(
    bots: BotFactory, routers: Any
) -> None:
    ingress = MemoryIngress()
    first, second = await bots(), await bots()
    router = routers(ingress, direct_intake=True)
    await router.add_partition(0, first.bridge)
    platform = MemoryTransport()
    router.attach(platform)  # attached after a partition was added
    await router.add_partition(3, second.bridge)  # added after the transport was attached
    assert first.bridge.transports["memory"] is platform and second.bridge.transports["memory"] is platform
    assert first.bridge.governor("memory") is second.bridge.governor("memory") is router.governor("memory")
    assert sorted(router.owned()) == [0, 3]
    places = {place_in(0), place_in(3)}
    for place in places:
        await router.intake(message(place, "2.1", "hi"))
    assert set(await router.known_places("memory")) == places
    assert await router.place_doc(place_in(0)) is not None
    await first.settle()
    await second.settle()


async def test_recorded_message_ids_are_those_of_every_owned_partition(
    bots: BotFactory, routers: Any
) -> None:
    ingress, platform = MemoryIngress(), MemoryTransport()
    slow = {"platform": platform, "chunk_size": 1, "delay_ms": 40}  # replies stream for a while
    first, second = await bots(**slow), await bots(**slow)
    router = routers(ingress, direct_intake=True)
    router.attach(platform)
    await router.add_partition(0, first.bridge)
    await router.add_partition(3, second.bridge)
    await router.intake(message(place_in(0), "6.1", "tell me a long story"))
    await router.intake(message(place_in(3), "6.1", "tell me another long story"))

    async def both_posting() -> bool:
        return bool(await first.bridge.recorded_message_ids()) and bool(
            await second.bridge.recorded_message_ids()
        )

    await eventually(both_posting, "both replies to have a part posted")
    recorded = await router.recorded_message_ids()
    for place in (place_in(0), place_in(3)):
        assert recorded & {m.id for m in platform.in_place(place)}, place
    await router.stop()
    await router.stop()  # idempotent


async def test_a_thread_belongs_to_its_channels_partition(bots: BotFactory, routers: Any) -> None:
    """A thread forks its channel's conversation in the same commit: both must be taken in by one owner."""
    ingress, platform = MemoryIngress(), MemoryTransport()
    owner = await bots(platform=platform)
    router = routers(ingress, direct_intake=True)
    router.attach(platform)
    await router.add_partition(1, owner.bridge)
    channel = place_in(1)
    thread = next(
        channel.in_thread(f"{n}.0")
        for n in range(1000)
        if partition_of_key(channel.in_thread(f"{n}.0").key, PARTITIONS) != 1
    )
    assert router.partition_of(thread) == 1
    assert (await router.intake(message(channel, "1.0", "top"))).outcome == "answering"
    assert (await router.intake(message(thread, "1.5", "in the thread"))).outcome == "answering"
    assert not ingress.records


async def test_watching_since_is_recorded_by_its_partitions_owner_and_read_elsewhere(
    bots: BotFactory, routers: Any
) -> None:
    ingress = MemoryIngress()
    bot = await bots()
    watch = partition_of_key("memory:T1", PARTITIONS)
    owner, reader, idle = routers(ingress), routers(ingress), routers(ingress)
    before = int(time.time() * 1000)
    assert await idle.watching_since("memory", "T1") >= before  # owns nothing, nothing recorded: now
    await owner.add_partition(watch, bot.bridge)
    since = await owner.watching_since("memory", "T1")
    await asyncio.sleep(0.01)
    assert await owner.watching_since("memory", "T1") == since  # recorded once
    # Another worker reads it through any partition it owns (reads see the whole store; here: the same one).
    await reader.add_partition((watch + 1) % PARTITIONS, Bridge(bot.harness))
    assert await reader.watching_since("memory", "T1") == since


async def test_a_partitions_pending_records_are_taken_as_one_batch_and_finished_in_one_call(
    bots: BotFactory, routers: Any
) -> None:
    ingress, platform = MemoryIngress(), MemoryTransport()
    ingress.notify = False
    owner = await bots(platform=platform)
    first, second = place_in(1), place_in(1, start=100)
    texts = [f"m{i}" for i in range(12)]
    for i, text in enumerate(texts):  # two channels of one partition, interleaved
        await routers(ingress).intake(message(first if i % 2 else second, f"6.{i + 10}", text))
    router = routers(ingress)
    router.attach(platform)
    await router.add_partition(1, owner.bridge)  # everything is already pending: one batch
    await eventually(lambda: asyncio.sleep(0, not ingress.unfinished()), "every record finished")
    assert ingress.finish_calls == 1 and router.consumed == 12
    await eventually(lambda: has_texts(owner, first, texts[1::2]), "one channel's messages, in order")
    await eventually(lambda: has_texts(owner, second, texts[0::2]), "the other's, in order")


async def test_one_poll_query_covers_every_owned_partition(bots: BotFactory, routers: Any) -> None:
    ingress, platform = MemoryIngress(), MemoryTransport()
    ingress.notify = False  # only the poll finds records put by another worker
    router = routers(ingress)
    router.attach(platform)
    for partition in range(PARTITIONS):
        await router.add_partition(partition, (await bots(platform=platform)).bridge)
    await asyncio.sleep(FAST * 3)  # past each consumer's first look at its partition
    ingress.pending_calls.clear()
    await asyncio.sleep(FAST * 6)
    assert ingress.pending_calls and set(ingress.pending_calls) == {frozenset(range(PARTITIONS))}
    place = place_in(3)
    await routers(ingress).intake(message(place, "5.1", "found by the poll"))
    await eventually(lambda: asyncio.sleep(0, not ingress.unfinished()), "the poll to wake its owner")
    assert frozenset({3}) in ingress.pending_calls  # the woken partition's consumer read its own records


async def test_a_router_that_never_consumes_does_not_listen_yet_forwards_every_message() -> None:
    ingress = MemoryIngress()
    router = Router(ingress, 8, consume=False)  # a worker's separate intake process: it owns nothing
    assert ingress._callbacks == []  # no LISTEN: nothing here would ever take a record in
    place = Place("slack", "T1", "C1")
    result = await router.intake(message(place, "1700000000.000100", "hello"))
    assert result.outcome == "forwarded"
    assert [r.key for r in await ingress.pending_ingress(range(8))] == [
        message(place, "1700000000.000100", "hello").request_id
    ]
    await router.stop()
    listening = Router(ingress, 8)
    assert len(ingress._callbacks) == 1
    await listening.stop()
    assert ingress._callbacks == []
