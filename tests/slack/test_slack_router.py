"""The Slack adapter behind a partition `Router` (issue 16), in one process against the fake Slack: an event for
a channel another worker owns is committed as an ingress record and only then acknowledged; once this worker
gains the channel's partition it takes the record in and answers through Slack, exactly once. A click on a gate
owned elsewhere is forwarded the same way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from adapters.bridge import Bridge, Place, Router, partition_of_place
from adapters.bridge.testing import MemoryIngress
from adapters.slack import SlackAdapter, create
from adapters.slack.testing import FakeSlack
from harness_core import AgentChange, Harness, HarnessSettings, ModelRef, Models, Registry
from harness_core.messages import AssistantMessage, UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import FauxProvider, faux_assistant
from harness_core.storage import MemoryStorage

PARTITIONS = 8
MODEL = AgentChange(model=ModelRef(provider="faux", model_id="m"))


def echo(request: ModelRequest) -> AssistantMessage:
    texts = [user_text(m) for m in request.messages if isinstance(m, UserMessage)]
    return faux_assistant(f"answer to {texts[-1]}")


@dataclass
class Partition:
    harness: Harness
    bridge: Bridge


async def open_partition() -> Partition:
    faux = FauxProvider(chunk_size=64)
    faux.set_responder(echo)
    registry = Registry()
    harness = await Harness.open(
        await MemoryStorage.open(), models=Models(faux), registry=registry, settings=HarnessSettings()
    )
    bridge = Bridge(harness, agent=MODEL)
    registry.install(bridge.extension())
    await bridge.start()
    return Partition(harness, bridge)


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(ack_timeout=10.0) as running:
        yield running


async def test_an_event_for_a_channel_owned_elsewhere_is_acknowledged_after_its_ingress_commit(
    fake: FakeSlack,
) -> None:
    alice = fake.add_user("UALICE", name="alice", display_name="Alice")
    general = fake.add_channel("general")
    place = Place("slack", fake.team_id, general.id)
    partition = partition_of_place(place, PARTITIONS)
    ingress = MemoryIngress()
    router = Router(ingress, PARTITIONS, poll_interval=0.05)
    adapter: SlackAdapter = create({}, fake.env)
    owner = await open_partition()
    try:
        await adapter.start(router)
        post = await fake.user_posts(general, alice, f"<@{fake.bot_user_id}> hello from afar")
        for delivery in post.deliveries:
            await delivery.wait_acked(timeout=10.0)
        records = ingress.unfinished()
        assert [(r.partition, r.kind, r.key) for r in records] == [
            (partition, "message", place.message_key(post.ts))
        ]  # the `message` and `app_mention` events of one post: one record
        assert not fake.bot_messages(general)

        await router.add_partition(partition, owner.bridge)  # this worker gains the channel
        answer = f"answer to Alice: &lt;@{fake.bot_user_id}&gt; hello from afar"  # shown, never a mention
        for _ in range(500):
            if [m.text for m in fake.bot_messages(general)] == [answer]:
                break
            await asyncio.sleep(0.02)
        assert not ingress.unfinished()
        await owner.harness.wait_for_idle()
        assert [m.text for m in fake.bot_messages(general)] == [answer]
    finally:
        await adapter.stop()
        for bridge in (await router.stop()).values():
            await bridge.stop()
        await owner.bridge.stop()
        await owner.harness.close()


async def test_two_workers_each_owning_half_the_partitions_answer_every_message_once(fake: FakeSlack) -> None:
    """The fake Slack hands each event to one random Socket Mode connection, as Slack does: whichever worker
    gets it, the channel's owner answers it, once."""
    alice = fake.add_user("UALICE", name="alice", display_name="Alice")
    channels = [fake.add_channel(f"room{i}") for i in range(6)]
    ingress = MemoryIngress()
    partitions = 4
    routers = [Router(ingress, partitions, poll_interval=0.05) for _ in range(2)]
    adapters: list[SlackAdapter] = [create({"edit_interval": 0.1}, fake.env) for _ in routers]
    owned = [await open_partition() for _ in range(partitions)]
    try:
        for worker, (router, adapter) in enumerate(zip(routers, adapters, strict=True)):
            await adapter.start(router)
            for partition in range(partitions):
                if partition % 2 == worker:
                    await router.add_partition(partition, owned[partition].bridge)
        await fake.wait_for_connection(2, timeout=10.0)
        for round_ in range(4):
            posts = [
                await fake.user_posts(channel, alice, f"<@{fake.bot_user_id}> r{round_} {channel.name}")
                for channel in channels
            ]
            # A round goes out at once (to random connections); the next only once it is acknowledged, i.e.
            # committed: from then on no later message of a channel may overtake it, whichever worker has it.
            # (Slack does not order events sent to different connections before they are acknowledged.)
            for delivery in (d for p in posts for d in p.deliveries):
                await delivery.wait_acked(timeout=10.0)

        def answered() -> dict[str, list[str]]:
            return {c.name: [m.text for m in fake.bot_messages(c)] for c in channels}

        mention = f"&lt;@{fake.bot_user_id}&gt;"
        expected = {c.name: [f"answer to Alice: {mention} r{i} {c.name}" for i in range(4)] for c in channels}
        for _ in range(1500):
            if answered() == expected:
                break
            await asyncio.sleep(0.02)
        for partition in owned:
            await partition.harness.wait_for_idle()
        assert answered() == expected  # every message once, in order within each channel
        assert sum(r.forwarded for r in routers) > 0 and not ingress.unfinished()
    finally:
        for adapter in adapters:
            await adapter.stop()
        for router in routers:
            await router.stop()
        for partition in owned:
            await partition.bridge.stop()
            await partition.harness.close()
