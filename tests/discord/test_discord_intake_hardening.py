"""The Discord adapter against hostile payloads, with the real discord.py client on the loopback fake: a message
carrying a lone surrogate (the JSON escape `\\ud83d`, which orjson refuses) is answered once and read back on
the next start without a second answer; dispatches of any shape discord.py cannot parse are dropped with a log
line and the gateway keeps going. No ``__init__.py`` here (see test_fake_discord.py)."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.bridge import Bridge, BridgeConfig, ChannelPolicy, MessageDoc
from adapters.discord import DiscordAdapter, create
from adapters.discord._endpoints import current_endpoints, override_endpoints
from adapters.discord.testing import FakeDiscord, FakeMessage, FakeResponse
from harness_core import AgentChange, Harness, ModelRef, Models, Registry
from harness_core.messages import UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import FauxProvider, faux_assistant
from harness_core.storage import MemoryStorage

pytestmark = pytest.mark.timeout(120)

MODEL = AgentChange(model=ModelRef(provider="faux", model_id="faux-1"))
FAST = {"edit_interval": 0.05, "guild_ready_timeout": 0.05}


def echo(request: ModelRequest) -> Any:
    return faux_assistant("re " + [user_text(m) for m in request.messages if isinstance(m, UserMessage)][-1])


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    previous = current_endpoints()
    try:
        async with FakeDiscord(heartbeat_interval=0.5) as running:
            yield running
    finally:
        override_endpoints(previous.api_url, previous.gateway_url)


class Bot:
    """Harness + bridge on one MemoryStorage; adapters come and go over it (a restart of the platform side)."""

    def __init__(self, fake: FakeDiscord, harness: Harness, bridge: Bridge, faux: FauxProvider) -> None:
        self.fake, self.harness, self.bridge, self.faux = fake, harness, bridge, faux
        self.adapter: DiscordAdapter | None = None

    async def start_adapter(self) -> DiscordAdapter:
        self.adapter = create(FAST, self.fake.env(), clock=self.fake.clock.now)
        await self.adapter.start(self.bridge)
        return self.adapter

    async def stop_adapter(self) -> None:
        if self.adapter is not None:
            await self.adapter.stop()
            self.adapter = None


@pytest.fixture
async def bot(fake: FakeDiscord) -> AsyncIterator[Bot]:
    faux = FauxProvider()
    faux.set_responder(echo)
    registry = Registry()
    harness = await Harness.open(await MemoryStorage.open(), models=Models(faux), registry=registry)
    bridge = Bridge(harness, config=BridgeConfig(default=ChannelPolicy(answer="mentions")), agent=MODEL)
    registry.install(bridge.extension())
    running = Bot(fake, harness, bridge, faux)
    await bridge.start()
    harness.resume()
    yield running
    await running.stop_adapter()
    await bridge.stop()
    await harness.close()


async def answer(fake: FakeDiscord, channel: Any, contains: str) -> FakeMessage:
    return await fake.wait_for_message(channel, predicate=lambda m: contains in m.content, timeout=15)


async def test_a_message_with_a_lone_surrogate_is_answered_once_and_a_restart_is_clean(
    fake: FakeDiscord, bot: Bot
) -> None:
    guild = fake.add_guild("Ops")
    general = fake.add_text_channel(guild, "general")
    alice = fake.add_user("alice", global_name="Al\udc00ice")
    fake.add_member(guild, alice)
    await bot.start_adapter()
    await fake.user_sends(general, alice, f"{fake.bot.mention} broken \ud83d emoji")
    first = await answer(fake, general, "broken")
    assert first.content.startswith("re Al\ufffdice: ") and first.content.endswith(" broken \ufffd emoji")
    await fake.user_sends(general, alice, f"{fake.bot.mention} still listening?")
    await answer(fake, general, "still listening?")  # the gateway survived the frame

    await bot.stop_adapter()
    await fake.user_sends(general, alice, f"{fake.bot.mention} while you were away \ud800")
    await bot.start_adapter()  # catch-up reads history over REST: the surrogate arrives again
    await answer(fake, general, "while you were away")
    await bot.harness.wait_for_idle()
    await asyncio.sleep(0.2)
    bot_texts = [m.content for m in fake.bot_messages(general)]
    assert len(bot_texts) == 3, bot_texts
    assert sum("broken" in t for t in bot_texts) == 1
    assert len(bot.faux.requests) == 3
    assert all("\ud800" not in t and "\ud83d" not in t for t in bot_texts)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | st.sampled_from(["\ud83d", "\u202e\u2066", "x" * 5000, "2026-01-01T00:00:00+00:00", "0"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)


async def test_hostile_dispatches_never_stop_the_gateway(
    fake: FakeDiscord, bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    guild = fake.add_guild("Ops")
    general = fake.add_text_channel(guild, "general")
    alice = fake.add_user("alice")
    fake.add_member(guild, alice)
    adapter = await bot.start_adapter()
    base = fake.gateway_payload(await fake.user_sends(general, alice, "a template"))
    member = {**base["member"], "user": base["author"]}
    click = {  # what a click on an approval button looks like, for an unknown gate
        "id": "1",
        "application_id": str(fake.application_id),
        "type": 3,
        "token": "t",
        "version": 1,
        "data": {"custom_id": "durable-bots:approve:77", "component_type": 2},
        "channel_id": str(general.id),
        "channel": general.payload(),
        "message": base,
        "locale": "en-US",
        "entitlements": [],
        "attachment_size_limit": 10 * 1024 * 1024,
        "guild_id": str(guild.id),
        "guild": {"id": str(guild.id), "locale": "en-US", "features": []},
        "guild_locale": "en-US",
        "member": member,
        "app_permissions": "0",
        "authorizing_integration_owners": {"0": str(guild.id)},
        "context": 0,
    }
    ids = itertools.count(10**18)
    examples: list[tuple[str, Any]] = []

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(
        st.sampled_from(["MESSAGE_CREATE", "MESSAGE_CREATE", "MESSAGE_UPDATE", "INTERACTION_CREATE"]),
        st.data(),
        st.booleans(),
    )
    def one(event: str, data: st.DataObject, whole: bool) -> None:
        template = click if event == "INTERACTION_CREATE" else base
        keys = sorted(template)
        changed = data.draw(st.dictionaries(st.sampled_from(keys), json_values, max_size=2))
        if data.draw(st.booleans()):  # text that reaches the bridge: mentions, surrogates, bidi, huge
            changed["content"] = data.draw(
                st.sampled_from([fake.bot.mention, "\ud83d", "\u202e\u2066", "x" * 5000]).flatmap(
                    lambda head: st.text(max_size=20).map(lambda tail: f"{head} {tail}")
                )
            )
        dropped = data.draw(st.lists(st.sampled_from(keys), max_size=1))
        nested = data.draw(
            st.dictionaries(
                st.sampled_from(["username", "global_name", "custom_id", "nick", "bot"]),
                json_values,
                max_size=2,
            )
        )
        if whole and not changed:  # not even an object
            examples.append((event, data.draw(json_values)))
            return
        payload = {**template, "id": str(next(ids)), **changed}
        for key in ("author", "data", "member"):
            if isinstance(payload.get(key), dict) and nested:
                payload[key] = {**payload[key], **nested}
        for key in dropped:
            payload.pop(key, None)
        examples.append((event, json.loads(json.dumps(payload))))

    one()
    with caplog.at_level(logging.WARNING, logger="adapters.discord"):
        for event, payload in examples:
            await fake.dispatch_raw(event, payload, guild_id=guild.id)
        await fake.user_sends(general, alice, f"{fake.bot.mention} sentinel")
        await answer(fake, general, "sentinel")
    assert adapter._gateway_tasks() and not any(t.done() for t in adapter._gateway_tasks())
    assert bot.adapter is adapter and adapter.health().connected
    assert "the gateway connection ended" not in caplog.text
    assert "intake failed; retrying" not in caplog.text
    sentinels = [m for m in fake.bot_messages(general) if "sentinel" in m.content]
    assert len(sentinels) == 1
    taken_in = await bot.harness.family(MessageDoc)
    assert len(taken_in) >= 3, taken_in  # the search reached the bridge, not only discord.py's parsers


def test_the_tolerant_decoder_keeps_what_is_valid_and_repairs_the_rest() -> None:
    import discord.utils

    from adapters.discord._hardening import install_tolerant_json

    install_tolerant_json()
    install_tolerant_json()  # idempotent
    decode: Callable[[str], Any] = discord.utils._from_json
    assert decode('{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}
    assert decode('{"a": "x\\ud83dy", "\\udc00": ["\\ud800"]}') == {"a": "x\ufffdy", "\ufffd": ["\ufffd"]}
    with pytest.raises(ValueError):
        decode("{not json")


async def test_a_history_message_that_cannot_be_read_costs_only_itself_on_catch_up(
    fake: FakeDiscord, bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    guild = fake.add_guild("Ops")
    general = fake.add_text_channel(guild, "general")
    alice = fake.add_user("alice")
    fake.add_member(guild, alice)
    await bot.start_adapter()
    await fake.user_sends(general, alice, f"{fake.bot.mention} first")
    await answer(fake, general, "first")
    await bot.stop_adapter()
    poison = await fake.user_sends(general, alice, f"{fake.bot.mention} poison")
    await fake.user_sends(general, alice, f"{fake.bot.mention} after the poison")

    def history(record: Any) -> FakeResponse:
        newest_first = [fake.gateway_payload(m) for m in reversed(fake.messages(general))]
        for payload in newest_first:
            if payload["id"] == str(poison.id):
                payload["content"] = ["not", "text"]  # discord.py keeps it; reading it fails
        return FakeResponse(200, newest_first)

    fake.on_request("GET", "/channels/{channel_id}/messages", history, times=1)
    with caplog.at_level(logging.ERROR, logger="adapters.discord"):
        await bot.start_adapter()
        await answer(fake, general, "after the poison")
    assert f"message {poison.id} could not be read and is dropped" in caplog.text
    answers = [m.content for m in fake.bot_messages(general)]
    assert len(answers) == 2 and answers[0].endswith(" first") and answers[1].endswith(" after the poison")
