"""Discord sharding in the adapter, with discord.py's real clients against the fake gateway (two shards): each
shard is its own gateway session; every message is taken in exactly once whichever shard carried it; a worker
with no shard opens no gateway session; `set_shards` moves a shard between two adapters without losing a
message, and without disturbing the shard that stays."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from adapters.bridge import Bridge, BridgeConfig, ChannelPolicy, IncomingMessage, IntakeResult
from adapters.discord import DiscordAdapter, DiscordConfigError, create
from adapters.discord._endpoints import current_endpoints, override_endpoints
from adapters.discord.testing import FakeChannel, FakeDiscord, FakeGuild, FakeUser, GatewaySession
from harness_core import AgentChange, Harness, ModelRef, Models, Registry
from harness_core.models.faux import FauxProvider, faux_assistant
from harness_core.storage import MemoryStorage

pytestmark = pytest.mark.timeout(90)

FAST = {"edit_interval": 0.05, "guild_ready_timeout": 0.05}


class CountingBridge(Bridge):
    """Records every intake with its outcome: exactly once means one non-duplicate intake per message."""

    taken: Counter[str]

    async def intake(self, message: IncomingMessage) -> IntakeResult:
        result = await super().intake(message)
        if result.outcome != "duplicate":
            self.taken[message.text] += 1
        return result


@dataclass
class Shop:
    fake: FakeDiscord
    guilds: dict[int, FakeGuild]  # shard id -> a guild on that shard (of 2)
    channels: dict[int, FakeChannel]
    alice: FakeUser
    harness: Harness
    bridge: CountingBridge
    adapters: list[DiscordAdapter]

    async def adapter(self, **options: Any) -> DiscordAdapter:
        adapter = create({**FAST, **options}, self.fake.env(), clock=self.fake.clock.now)
        self.adapters.append(adapter)
        await adapter.start(self.bridge)
        return adapter

    async def say(self, shard: int, text: str) -> None:
        await self.fake.user_sends(self.channels[shard], self.alice, text)

    async def taken_once(self, *texts: str) -> None:
        await self.fake.wait_for(
            lambda: all(self.bridge.taken[t] >= 1 for t in texts), timeout=20, what=f"intake of {texts}"
        )

    def sessions(self, shard: int) -> list[GatewaySession]:
        return [s for s in self.fake.sessions if s.shard == (shard, 2)]


def guild_on(fake: FakeDiscord, shard: int, name: str) -> FakeGuild:
    guild = fake.add_guild(name, id=((1_200_000_000_000 + shard) << 22) | 5)
    assert FakeDiscord.shard_of(guild, 2) == shard
    return guild


@pytest.fixture
async def shop() -> AsyncIterator[Shop]:
    previous = current_endpoints()
    try:
        async with FakeDiscord(heartbeat_interval=0.5, recommended_shards=2) as fake:
            alice = fake.add_user("alice", global_name="Alice")
            guilds = {shard: guild_on(fake, shard, f"Guild {shard}") for shard in (0, 1)}
            channels = {shard: fake.add_text_channel(g, "general") for shard, g in guilds.items()}
            for guild in guilds.values():
                fake.add_member(guild, alice)
            faux = FauxProvider()
            faux.set_responder(lambda r: faux_assistant("noted"))
            registry = Registry()
            harness = await Harness.open(await MemoryStorage.open(), models=Models(faux), registry=registry)
            bridge = CountingBridge(
                harness,
                config=BridgeConfig(default=ChannelPolicy(answer="none")),  # type: ignore[arg-type]
                agent=AgentChange(model=ModelRef(provider="faux", model_id="m")),
            )
            bridge.taken = Counter()
            registry.install(bridge.extension())
            await bridge.start()
            harness.resume()
            made = Shop(fake, guilds, channels, alice, harness, bridge, [])
            try:
                yield made
            finally:
                for adapter in made.adapters:
                    await adapter.stop()
                await bridge.stop()
                await harness.close()
    finally:
        override_endpoints(previous.api_url, previous.gateway_url)


def test_shard_options_are_validated_and_errors_name_the_key() -> None:
    env = {"DISCORD_BOT_TOKEN": "t"}
    assert create({"shard_count": 4, "shard_ids": [3, 1]}, env).settings.options.shard_ids == [1, 3]
    assert create({"shard_ids": []}, env).settings.options.shard_ids == []
    with pytest.raises(DiscordConfigError, match=r"adapters\.discord\.shard_ids: .*shard 2 is out of range"):
        create({"shard_count": 2, "shard_ids": [0, 2]}, env)
    with pytest.raises(DiscordConfigError, match=r"adapters\.discord\.shard_ids: .*listed twice"):
        create({"shard_ids": [1, 1]}, env)
    with pytest.raises(DiscordConfigError, match=r"adapters\.discord\.shard_count"):
        create({"shard_count": 0}, env)


async def test_default_runs_every_recommended_shard_and_takes_each_message_in_once(shop: Shop) -> None:
    adapter = await shop.adapter()
    assert (adapter.shard_count, adapter.shard_ids) == (2, [0, 1])  # GET /gateway/bot recommends 2
    assert [len(shop.sessions(0)), len(shop.sessions(1))] == [1, 1]
    await shop.say(0, "on shard zero")
    await shop.say(1, "on shard one")
    await shop.taken_once("on shard zero", "on shard one")
    assert shop.sessions(0)[0].events.count("MESSAGE_CREATE") == 1  # each carried by its own shard only
    assert shop.sessions(1)[0].events.count("MESSAGE_CREATE") == 1
    assert shop.bridge.taken == Counter({"on shard zero": 1, "on shard one": 1})
    assert adapter.health().connected and adapter.health().connections_opened == 2


async def test_shard_ids_beyond_the_recommended_count_are_refused_at_start(shop: Shop) -> None:
    with pytest.raises(
        DiscordConfigError, match=r"adapters\.discord\.shard_ids: .*adapters\.discord\.shard_count"
    ):
        await shop.adapter(shard_ids=[2])
    assert shop.fake.sessions == []


async def test_set_shards_moves_a_shard_between_two_workers_without_losing_a_message(shop: Shop) -> None:
    first = await shop.adapter()
    second = await shop.adapter(shard_ids=[])
    assert (second.shard_count, second.shard_ids) == (2, [])
    assert len(shop.fake.sessions) == 2  # the worker without a shard opened no gateway session
    await shop.say(1, "before the move")
    await shop.taken_once("before the move")

    with pytest.raises(ValueError, match=r"0\.\.1"):
        await first.set_shards([2], 2)
    await first.set_shards([0], 2)  # hand shard 1 over
    assert first.shard_ids == [0]
    (old,) = shop.sessions(1)
    assert not old.connected
    await shop.say(1, "during the move")  # no worker runs shard 1 now: only history has it
    await second.set_shards([1], 2)
    assert second.shard_ids == [1]
    await shop.say(1, "after the move")
    await shop.say(0, "shard zero stayed")
    await shop.taken_once("during the move", "after the move", "shard zero stayed")

    assert len(shop.sessions(0)) == 1 and shop.sessions(0)[0].connected  # never reconnected
    new = shop.sessions(1)[-1]
    assert new is not old and new.connected
    assert new.events.count("MESSAGE_CREATE") == 1  # "after the move" came live to the second worker
    assert second.catch_ups == 1  # ... and "during the move" from its catch-up of shard 1
    assert shop.bridge.taken == Counter(
        {"before the move": 1, "during the move": 1, "after the move": 1, "shard zero stayed": 1}
    )
