"""The fake Discord gateway with shards, driven by discord.py clients that IDENTIFY with `shard: [id, count]`:
guild events go to the shard `(guild_id >> 22) % shard_count`, DMs to shard 0, and `GET /gateway/bot`
recommends the configured shard count."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import discord
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fake_discord import Bot, intents, running

from adapters.bridge import Place
from adapters.discord._adapter import _shard_of
from adapters.discord._endpoints import override_endpoints
from adapters.discord.testing import FakeDiscord, FakeGuild, GatewaySession


def guild_on(fake: FakeDiscord, shard: int, count: int, name: str) -> FakeGuild:
    base = 1_100_000_000_000 + shard  # (id >> 22) % count == shard
    guild = fake.add_guild(name, id=((base + count * 7) << 22) | 1)
    assert FakeDiscord.shard_of(guild, count) == shard
    return guild


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(heartbeat_interval=0.5, recommended_shards=2) as fake:
        previous = override_endpoints(fake.api_url, fake.gateway_url)
        try:
            yield fake
        finally:
            override_endpoints(previous.api_url, previous.gateway_url)


async def test_gateway_bot_recommends_the_configured_shard_count(fake: FakeDiscord) -> None:
    client = discord.Client(intents=intents())
    await client.login(fake.token)
    try:
        shards, url, _limits = await client.http.get_bot_gateway()
        assert (shards, url) == (2, fake.gateway_url)
        fake.recommended_shards = 3
        assert (await client.http.get_bot_gateway())[0] == 3
    finally:
        await client.close()


async def test_each_guild_is_served_by_its_shard_only_and_dms_by_shard_zero(fake: FakeDiscord) -> None:
    first = guild_on(fake, 0, 2, "Zero")
    second = guild_on(fake, 1, 2, "One")
    zero_channel = fake.add_text_channel(first, "general")
    one_channel = fake.add_text_channel(second, "general")
    alice = fake.add_user("alice")
    fake.add_member(first, alice)
    fake.add_member(second, alice)
    async with (
        running(Bot(intents=intents(), shard_id=0, shard_count=2), fake.token) as shard0,
        running(Bot(intents=intents(), shard_id=1, shard_count=2), fake.token) as shard1,
    ):
        by_shard = {s.shard: s for s in fake.sessions}
        assert set(by_shard) == {(0, 2), (1, 2)}
        assert [g.id for g in shard0.guilds] == [first.id]  # READY/GUILD_CREATE only for its own guilds
        assert [g.id for g in shard1.guilds] == [second.id]
        await fake.user_sends(zero_channel, alice, "to shard zero")
        await fake.user_sends(one_channel, alice, "to shard one")
        await fake.user_sends(fake.dm_channel(alice), alice, "a DM")
        await fake.wait_for(
            lambda: len(shard0.received) == 2 and len(shard1.received) == 1, what="3 messages"
        )
        assert shard0.contents() == ["to shard zero", "a DM"]
        assert shard1.contents() == ["to shard one"]
        assert by_shard[(0, 2)].events.count("MESSAGE_CREATE") == 2
        assert by_shard[(1, 2)].events.count("MESSAGE_CREATE") == 1


async def test_a_shard_id_outside_the_count_is_closed_with_4010(fake: FakeDiscord) -> None:
    bot = Bot(intents=intents(), shard_id=2, shard_count=2)
    with pytest.raises(discord.ConnectionClosed) as closed:
        await asyncio.wait_for(bot.start(fake.token), 15)
    assert closed.value.code == 4010
    with contextlib.suppress(Exception):
        await bot.close()


@settings(max_examples=200, deadline=None)
@given(guild_id=st.integers(min_value=0, max_value=2**64 - 1), count=st.integers(min_value=1, max_value=64))
def test_every_guild_belongs_to_exactly_one_shard_and_the_adapter_agrees(guild_id: int, count: int) -> None:
    sessions = [
        GatewaySession(session_id=str(i), intents=0, shard=(i, count), identify={}, identified_at=0.0)
        for i in range(count)
    ]
    serving = [s.shard[0] for s in sessions if s.shard is not None and s.handles_guild(guild_id)]
    assert serving == [FakeDiscord.shard_of(guild_id, count)]
    assert _shard_of(Place("discord", str(guild_id), "1"), count) == serving[0]
    dm_serving = [s.shard for s in sessions if s.handles_guild(None)]
    assert dm_serving == [(0, count)] and _shard_of(Place("discord", "@me", "1"), count) == 0
