"""The loopback fake Discord (adapters.discord.testing) driven by the real discord.py client.

Every test runs discord.py's own HTTP client, gateway code and parsers against the fake over 127.0.0.1.
No assertion depends on durations; time-dependent rules are exercised through the fake's clock.

This directory must not get an ``__init__.py``: ``tests/`` is on sys.path, and a regular package
``tests/discord`` would then shadow discord.py itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import discord
import pytest
from discord.gateway import DiscordWebSocket
from discord.http import Route

from adapters.discord._endpoints import DEFAULT_ENDPOINTS, current_endpoints, override_endpoints
from adapters.discord.testing import (
    FakeChannel,
    FakeDiscord,
    FakeGuild,
    FakeRole,
    FakeUser,
    GatewayIntent,
    MessageType,
    UnhandledRequestsError,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SENDER_SCRIPT = Path(__file__).with_name("fake_discord_sender.py")
MESSAGES_ROUTE = "/channels/{channel_id}/messages"
CALLBACK_ROUTE = "/interactions/{interaction_id}/{interaction_token}/callback"


# --- fixtures and helpers -----------------------------------------------------------------------------------


class World:
    def __init__(self, fake: FakeDiscord) -> None:
        self.fake = fake
        self.guild: FakeGuild = fake.add_guild("Ops")
        self.general: FakeChannel = fake.add_text_channel(self.guild, "general", topic="ops talk")
        self.random: FakeChannel = fake.add_text_channel(self.guild, "random")
        self.approvers: FakeRole = fake.add_role(self.guild, "approvers")
        self.alice: FakeUser = fake.add_user("alice", global_name="Alice")
        self.bob: FakeUser = fake.add_user("bob")
        fake.add_member(self.guild, self.alice, roles=[self.approvers])
        fake.add_member(self.guild, self.bob, nick="Bobby")


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(heartbeat_interval=0.5) as fake:
        previous = override_endpoints(fake.api_url, fake.gateway_url)
        try:
            yield fake
        finally:
            override_endpoints(previous.api_url, previous.gateway_url)


@pytest.fixture
def world(fake: FakeDiscord) -> World:
    return World(fake)


def intents(*, message_content: bool = True, members: bool = False) -> discord.Intents:
    value = discord.Intents.default()
    value.message_content = message_content
    value.members = members
    return value


class Bot(discord.Client):
    """A discord.py client that records what it receives."""

    def __init__(self, *, intents: discord.Intents, **options: Any) -> None:
        super().__init__(intents=intents, guild_ready_timeout=0.05, **options)
        self.ready = asyncio.Event()
        self.received: list[discord.Message] = []
        self.edits: list[discord.Message] = []
        self.threads: list[discord.Thread] = []

    async def on_ready(self) -> None:
        self.ready.set()

    async def on_message(self, message: discord.Message) -> None:
        self.received.append(message)

    async def on_message_edit(self, before: discord.Message, after: discord.Message) -> None:
        self.edits.append(after)

    async def on_thread_create(self, thread: discord.Thread) -> None:
        self.threads.append(thread)

    def contents(self) -> list[str]:
        return [m.content for m in self.received if self.user is None or m.author.id != self.user.id]


@contextlib.asynccontextmanager
async def running(bot: Bot, token: str) -> AsyncIterator[Bot]:
    """Start ``bot`` against the fake, wait for on_ready, close it afterwards."""
    task = asyncio.create_task(bot.start(token))
    ready = asyncio.create_task(bot.ready.wait())
    done, _ = await asyncio.wait({task, ready}, timeout=15, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        ready.cancel()
        task.result()  # raises what start() raised
        raise AssertionError("client stopped before on_ready")
    assert ready in done, "client did not become ready"
    try:
        yield bot
    finally:
        await bot.close()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)


def text_channel(bot: Bot, channel: FakeChannel) -> discord.TextChannel:
    found = bot.get_channel(channel.id)
    assert isinstance(found, discord.TextChannel)
    return found


# --- endpoint overrides -------------------------------------------------------------------------------------


def test_override_endpoints_sets_and_restores_discord_py_class_attributes() -> None:
    before = current_endpoints()
    previous = override_endpoints("http://127.0.0.1:9/", "ws://127.0.0.1:9/gateway?v=9")
    try:
        assert previous == before
        assert Route.BASE == "http://127.0.0.1:9/api/v10"  # bare host gets discord.py's versioned prefix
        # discord.py adds its own query (v, encoding, compress) on every connect
        assert str(DiscordWebSocket.DEFAULT_GATEWAY) == "ws://127.0.0.1:9/gateway"
        assert Route("GET", "/users/@me").url == "http://127.0.0.1:9/api/v10/users/@me"
        override_endpoints(None, None)  # unset environment variables change nothing
        assert current_endpoints().api_url == "http://127.0.0.1:9/api/v10"
        override_endpoints("https://proxy.example/discord/api/v10/", None)
        assert Route.BASE == "https://proxy.example/discord/api/v10"
        with pytest.raises(ValueError, match="DISCORD_API_URL"):
            override_endpoints("ws://127.0.0.1:9", None)
        with pytest.raises(ValueError, match="DISCORD_GATEWAY_URL"):
            override_endpoints(None, "http://127.0.0.1:9/gateway")
    finally:
        override_endpoints(previous.api_url, previous.gateway_url)
    assert current_endpoints() == before == DEFAULT_ENDPOINTS


# --- connecting ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [True, False], ids=["zlib-stream", "uncompressed"])
async def test_client_identifies_and_sees_guild_channels_and_roles(compression: bool) -> None:
    async with FakeDiscord(heartbeat_interval=0.2, gateway_compression=compression) as fake:
        world = World(fake)
        previous = override_endpoints(fake.api_url, fake.gateway_url)
        try:
            async with running(Bot(intents=intents()), fake.token) as bot:
                assert bot.user is not None and bot.user.id == fake.bot.id
                assert bot.application_id == fake.application_id
                guild = bot.get_guild(world.guild.id)
                assert guild is not None and guild.name == "Ops"
                assert sorted(c.name for c in guild.text_channels) == ["general", "random"]
                assert text_channel(bot, world.general).topic == "ops talk"
                assert {r.name for r in guild.roles} == {"@everyone", "approvers"}
                assert guild.member_count == 3  # the bot (also the owner), alice, bob

                session = fake.sessions[0]
                assert session.message_content_requested
                assert session.has_intent(GatewayIntent.GUILDS | GatewayIntent.GUILD_MESSAGES)
                assert session.intents == bot.intents.value
                assert session.events[:2] == ["READY", "GUILD_CREATE"]
                connection = fake.connections[0]
                # discord.py asks for zstd-stream when a zstd module is importable, zlib-stream otherwise
                requested = discord.utils._ActiveDecompressionContext.COMPRESSION_TYPE
                assert connection.requested_compression == requested
                assert connection.compression == (requested if compression else "none")
                # heartbeats flow and are acknowledged (discord.py measures latency from the ACKs)
                await fake.wait_for(lambda: connection.heartbeats >= 2, what="two heartbeats")
                await fake.wait_for(lambda: bot.latency != float("inf"), what="a heartbeat ACK")
        finally:
            override_endpoints(previous.api_url, previous.gateway_url)
    assert [r.path for r in fake.requests][:2] == ["/users/@me", "/oauth2/applications/@me"]


async def test_wrong_token_is_rejected_with_401(fake: FakeDiscord, world: World) -> None:
    bot = Bot(intents=intents())
    with pytest.raises(discord.LoginFailure):
        await bot.start("not-the-token")
    await bot.close()
    assert fake.requests[0].status == 401
    assert fake.sessions == []


async def test_members_intent_chunks_guild_members_with_roles(fake: FakeDiscord, world: World) -> None:
    async with running(Bot(intents=intents(members=True)), fake.token) as bot:
        guild = bot.get_guild(world.guild.id)
        assert guild is not None and guild.chunked
        alice = guild.get_member(world.alice.id)
        assert alice is not None and alice.display_name == "Alice"
        assert [r.name for r in alice.roles] == ["@everyone", "approvers"]
        bob = guild.get_member(world.bob.id)
        assert bob is not None and bob.display_name == "Bobby"
        fetched = await guild.fetch_member(world.alice.id)
        assert fetched.global_name == "Alice"


# --- messages -----------------------------------------------------------------------------------------------


async def test_message_reply_edit_history(fake: FakeDiscord, world: World) -> None:
    async with running(Bot(intents=intents()), fake.token) as bot:
        asked = await fake.user_sends(world.general, world.alice, "deploy web-1 please")
        await fake.wait_for(lambda: bot.contents() == ["deploy web-1 please"], what="on_message")
        incoming = bot.received[0]
        assert incoming.id == asked.id
        assert isinstance(incoming.author, discord.Member)
        assert incoming.author.display_name == "Alice"
        assert [r.name for r in incoming.author.roles] == ["@everyone", "approvers"]

        reply = await incoming.reply("On it.")
        stored = fake.message(reply.id)
        assert stored.type is MessageType.REPLY and stored.reply_to == asked.id
        assert stored.author is fake.bot
        assert stored.nonce is not None and stored.nonce == str(reply.nonce)  # discord.py always sends one
        assert fake.calls("POST", MESSAGES_ROUTE)[-1].json["enforce_nonce"] is True

        edited = await reply.edit(content="Done: web-1 deployed.")
        assert edited.content == "Done: web-1 deployed."
        assert [v.content for v in stored.edits] == ["On it."] and stored.edited_at is not None
        await fake.wait_for(lambda: [m.content for m in bot.edits] == ["Done: web-1 deployed."], what="edit")

        later = await fake.user_sends(world.general, world.bob, "thanks", reply_to=reply.id)
        await fake.wait_for(lambda: len(bot.contents()) == 2, what="second message")
        assert bot.received[-1].reference is not None
        assert bot.received[-1].reference.message_id == reply.id
        assert bot.user in bot.received[-1].mentions  # replying pings the author by default

        channel = text_channel(bot, world.general)
        newest_first = [m.id async for m in channel.history(limit=10)]
        assert newest_first == [later.id, reply.id, asked.id]  # the bot's own echo is in history too
        oldest_first = [m.content async for m in channel.history(limit=10, after=discord.Object(asked.id))]
        assert oldest_first == ["Done: web-1 deployed.", "thanks"]
        around = [m.id async for m in channel.history(limit=2, around=discord.Object(reply.id))]
        assert set(around) <= {asked.id, reply.id, later.id} and reply.id in around
        fetched = await channel.fetch_message(asked.id)
        assert fetched.content == "deploy web-1 please"
        with pytest.raises(discord.NotFound):
            await channel.fetch_message(12345)


async def test_discord_py_nonce_is_deduplicated_by_enforce_nonce(fake: FakeDiscord, world: World) -> None:
    async with running(Bot(intents=intents()), fake.token) as bot:
        channel = text_channel(bot, world.general)
        first = await channel.send("answer for entry 7", nonce="entry-7")
        again = await channel.send("answer for entry 7", nonce="entry-7")
        assert again.id == first.id
        assert [m.content for m in fake.bot_messages(world.general)] == ["answer for entry 7"]
        posts = fake.calls("POST", MESSAGES_ROUTE)
        assert [(p.deduplicated, p.effect) for p in posts] == [(False, True), (True, False)]

        # Outside the nonce window the same nonce creates a new message.
        fake.clock.advance(fake.nonce_window + 1)
        third = await channel.send("answer for entry 7", nonce="entry-7")
        assert third.id != first.id
        assert len(fake.bot_messages(world.general)) == 2


async def test_server_error_after_the_message_was_stored_is_retried_without_duplicate(
    fake: FakeDiscord, world: World
) -> None:
    fake.fail("POST", MESSAGES_ROUTE, status=500, after_effect=True)
    async with running(Bot(intents=intents()), fake.token) as bot:
        sent = await text_channel(bot, world.general).send("exactly once")  # discord.py retries the 500
        posts = fake.calls("POST", MESSAGES_ROUTE)
        assert [p.status for p in posts] == [500, 200]
        assert posts[1].deduplicated and posts[1].json["nonce"] == posts[0].json["nonce"]
        assert [m.id for m in fake.bot_messages(world.general)] == [sent.id]


async def test_429_with_retry_after_is_honoured_and_nothing_is_applied_until_the_retry(
    fake: FakeDiscord, world: World
) -> None:
    hook = fake.rate_limit("POST", MESSAGES_ROUTE, times=2, retry_after=0.2)
    async with running(Bot(intents=intents()), fake.token) as bot:
        sent = await text_channel(bot, world.general).send("after the rate limit")
        posts = fake.calls("POST", MESSAGES_ROUTE)
        assert [p.status for p in posts] == [429, 429, 200]
        assert [p.effect for p in posts] == [False, False, True]
        assert hook.calls == 2 and not hook.active
        assert posts[0].response["retry_after"] == 0.2
        # Honoured: each retry arrives no sooner than retry_after after the request that got the 429.
        gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(posts)]
        assert min(gaps) >= 0.2, gaps
        assert [m.id for m in fake.bot_messages(world.general)] == [sent.id]


async def test_content_limit_and_empty_message_use_discords_error_shape(
    fake: FakeDiscord, world: World
) -> None:
    async with running(Bot(intents=intents()), fake.token) as bot:
        channel = text_channel(bot, world.general)
        await channel.send("x" * 2000)  # exactly at the limit is fine
        with pytest.raises(discord.HTTPException) as too_long:
            await channel.send("x" * 2001)
        assert too_long.value.status == 400 and too_long.value.code == 50035
        body = fake.calls("POST", MESSAGES_ROUTE)[-1].response
        assert body["errors"]["content"]["_errors"][0]["code"] == "BASE_TYPE_MAX_LENGTH"
        with pytest.raises(discord.HTTPException) as empty:
            await bot.http.send_message(
                world.general.id, params=discord.http.MultipartParameters({}, None, None)
            )
        assert empty.value.code == 50006
        assert len(fake.bot_messages(world.general)) == 1


async def test_editing_a_message_older_than_an_hour_fails_with_30046(fake: FakeDiscord, world: World) -> None:
    async with running(Bot(intents=intents()), fake.token) as bot:
        channel = text_channel(bot, world.general)
        fresh = await channel.send("streaming...")
        old = await channel.send("posted long ago")
        await fresh.edit(content="streaming... more")
        fake.age_message(old.id, 3601)
        with pytest.raises(discord.HTTPException) as error:
            await old.edit(content="late edit")
        assert error.value.code == 30046
        assert fake.message(old.id).content == "posted long ago"

        fake.old_message_edit_limit = 1  # Discord allows a few; the fake's budget is per channel per hour
        await old.edit(content="one late edit")
        with pytest.raises(discord.HTTPException) as budget_spent:
            await old.edit(content="a second late edit")
        assert budget_spent.value.code == 30046
        fake.clock.advance(3600)  # the budget's hour rolls over; `fresh` is now older than an hour as well
        await fresh.edit(content="allowed again")
        assert [v.content for v in fake.message(fresh.id).edits] == ["streaming...", "streaming... more"]
        with pytest.raises(discord.HTTPException) as not_mine:
            await bot.http.edit_message(
                world.general.id,
                (await fake.user_sends(world.general, world.alice, "mine")).id,
                params=discord.http.MultipartParameters({"content": "hijack"}, None, None),
            )
        assert not_mine.value.code == 50005


async def test_events_while_disconnected_are_not_replayed_on_a_fresh_identify(
    fake: FakeDiscord, world: World
) -> None:
    async with running(Bot(intents=intents()), fake.token) as first:
        await fake.user_sends(world.general, world.alice, "before the restart")
        await fake.wait_for(lambda: first.contents() == ["before the restart"], what="first message")
    assert fake.connected_sessions == []
    missed = await fake.user_sends(world.general, world.alice, "while the bot was down")

    async with running(Bot(intents=intents()), fake.token) as second:
        await fake.user_sends(world.general, world.alice, "after the restart")
        await fake.wait_for(lambda: second.contents() != [], what="a message on the new session")
        assert second.contents() == ["after the restart"]  # the gateway sends in order: nothing was replayed
        assert len(fake.sessions) == 2 and fake.sessions[1].resumes == 0
        history = [m.content async for m in text_channel(second, world.general).history(limit=10)]
        assert history == ["after the restart", "while the bot was down", "before the restart"]
        assert missed.id in [m.id for m in fake.messages(world.general)]


async def test_resume_replays_events_missed_during_a_dropped_connection(
    fake: FakeDiscord, world: World
) -> None:
    async with running(Bot(intents=intents()), fake.token) as bot:
        session = await fake.wait_for_session()
        fake.hold_new_connections()
        assert await fake.drop_connections(4000) == 1
        await fake.wait_for(lambda: session.state == "detached", what="the session to detach")
        await fake.user_sends(world.general, world.alice, "sent during the outage")
        await fake.wait_for(lambda: len(fake.connections) == 2, what="the client to reconnect")
        fake.release_new_connections()
        await fake.wait_for(lambda: bot.contents() == ["sent during the outage"], what="the replayed message")
        assert session.resumes == 1 and session.connected
        assert len(fake.sessions) == 1
        assert fake.connections[1].path == "/gateway/resume"  # discord.py used READY's resume_gateway_url
        assert session.events[-2:] == ["MESSAGE_CREATE", "RESUMED"]

        assert await fake.request_reconnect() == 1  # op 7: discord.py resumes again
        await fake.wait_for(lambda: session.resumes == 2 and session.connected, what="a second resume")
        await fake.user_sends(world.general, world.bob, "after op 7")
        await fake.wait_for(lambda: bot.contents()[-1:] == ["after op 7"], what="live delivery after resume")
        assert bot.contents() == ["sent during the outage", "after op 7"]


# --- threads ------------------------------------------------------------------------------------------------


async def test_threads_have_the_starter_message_id_and_deliver_messages_with_a_thread_channel(
    fake: FakeDiscord, world: World
) -> None:
    async with running(Bot(intents=intents()), fake.token) as bot:
        root = await fake.user_sends(world.general, world.alice, "incident: api 500s")
        thread = await fake.user_creates_thread(world.general, root, "api 500s", world.alice)
        assert thread.id == root.id and thread.parent_id == world.general.id
        await fake.wait_for(lambda: len(bot.threads) == 1, what="on_thread_create")
        assert bot.threads[0].id == root.id and bot.threads[0].parent_id == world.general.id

        await fake.user_sends_in_thread(thread, world.bob, "logs attached")
        await fake.wait_for(lambda: bot.contents()[-1:] == ["logs attached"], what="thread message")
        in_thread = bot.received[-1]
        assert isinstance(in_thread.channel, discord.Thread)
        assert in_thread.channel.id == root.id
        assert in_thread.channel.parent == text_channel(bot, world.general)
        # the thread opens with a THREAD_STARTER_MESSAGE that only points at the root message
        starter = next(m for m in bot.received if m.type is discord.MessageType.thread_starter_message)
        assert starter.reference is not None and starter.reference.message_id == root.id

        answer = await in_thread.channel.send("looking")
        assert fake.message(answer.id).channel_id == thread.id
        assert [m.content for m in fake.messages(thread)] == ["", "logs attached", "looking"]

        # the bot starts a thread on its own message; again id == message id, and only one per message
        own = await text_channel(bot, world.general).send("status report")
        started = await own.create_thread(name="status")
        assert started.id == own.id
        assert fake.channel(own.id).owner_id == fake.bot.id
        with pytest.raises(discord.HTTPException) as twice:
            await own.create_thread(name="again")
        assert twice.value.code == 160004
        fetched = await bot.fetch_channel(own.id)
        assert isinstance(fetched, discord.Thread) and fetched.parent_id == world.general.id


# --- MESSAGE_CONTENT ----------------------------------------------------------------------------------------


async def test_content_is_blank_without_the_message_content_intent_except_mentions(
    fake: FakeDiscord, world: World
) -> None:
    async with running(Bot(intents=intents(message_content=False)), fake.token) as bot:
        assert not fake.sessions[0].message_content_requested
        await fake.user_sends(world.general, world.alice, "plain message")
        await fake.user_sends(world.general, world.alice, f"{fake.bot.mention} are you there?")
        await fake.wait_for(lambda: len(bot.received) == 2, what="two messages")
        assert bot.contents() == ["", f"<@{fake.bot.id}> are you there?"]


async def test_content_is_blank_when_the_intent_is_requested_but_not_granted(
    fake: FakeDiscord, world: World
) -> None:
    fake.message_content_granted = False
    async with running(Bot(intents=intents()), fake.token) as bot:
        assert fake.sessions[0].message_content_requested
        posted = await fake.user_sends(world.general, world.alice, "secret plan")
        await fake.wait_for(lambda: len(bot.received) == 1, what="a message")
        assert bot.contents() == [""]
        assert (await text_channel(bot, world.general).fetch_message(posted.id)).content == ""  # REST too
        flags = (await bot.application_info()).flags
        assert not flags.gateway_message_content and not flags.gateway_message_content_limited


async def test_ungranted_privileged_intent_can_close_the_gateway_with_4014(world: World) -> None:
    async with FakeDiscord(
        heartbeat_interval=0.5, message_content_granted=False, reject_ungranted_privileged_intents=True
    ) as fake:
        World(fake)
        previous = override_endpoints(fake.api_url, fake.gateway_url)
        try:
            bot = Bot(intents=intents())
            with pytest.raises(discord.PrivilegedIntentsRequired):
                await asyncio.wait_for(bot.start(fake.token), timeout=15)
            await bot.close()
            assert fake.connections[0].server_close_code == 4014
        finally:
            override_endpoints(previous.api_url, previous.gateway_url)


# --- interactions -------------------------------------------------------------------------------------------


class ApproveButton(
    discord.ui.DynamicItem[discord.ui.Button[discord.ui.View]], template=r"approve:(?P<gate>\d+)"
):
    """A persistent button: its state lives in the custom_id, so any process can handle the click."""

    log: list[tuple[str, Any]] = []

    def __init__(self, gate: int) -> None:
        super().__init__(
            discord.ui.Button(label="Approve", style=discord.ButtonStyle.success, custom_id=f"approve:{gate}")
        )
        self.gate = gate

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: Any
    ) -> ApproveButton:
        return cls(int(match["gate"]))

    async def callback(self, interaction: discord.Interaction) -> None:
        member = interaction.user
        roles = [r.name for r in member.roles] if isinstance(member, discord.Member) else []
        self.log.append(("clicked", (self.gate, member.display_name, roles)))
        try:
            await interaction.response.defer()
        except discord.HTTPException as error:
            self.log.append(("defer failed", error.code))
            return
        try:
            await interaction.followup.send(f"Recorded your approval of gate {self.gate}.", ephemeral=True)
            await interaction.edit_original_response(
                content=f"Gate {self.gate}: approved by {member.display_name}", view=None
            )
        except discord.HTTPException as error:
            self.log.append(("follow-up failed", error.code))
            return
        self.log.append(("done", self.gate))


class GateBot(Bot):
    async def setup_hook(self) -> None:
        self.add_dynamic_items(ApproveButton)  # every start: persistent components survive restarts this way


def gate_components(gate: int) -> list[dict[str, object]]:
    button = {"type": 2, "style": 3, "label": "Approve", "custom_id": f"approve:{gate}"}
    return [{"type": 1, "components": [button]}]


async def test_dynamic_item_button_click_defer_ephemeral_followup_and_edit(
    fake: FakeDiscord, world: World
) -> None:
    ApproveButton.log = []
    # The gate message was posted by an earlier run of the bot; this process only registered the DynamicItem.
    gate = fake.add_message(
        world.general, fake.bot, "Deploy web-1? (gate 42)", components=gate_components(42)
    )
    async with running(GateBot(intents=intents()), fake.token):
        click = await fake.click(gate, "approve:42", world.alice)
        assert click.delivered and click.responded
        assert click.response_type == 6  # DEFERRED_UPDATE_MESSAGE
        assert click.answered_in_time and click.response is not None and click.response.delay <= 3.0
        await fake.wait_for(lambda: ("done", 42) in ApproveButton.log, what="the callback to finish")
        assert ApproveButton.log[0] == ("clicked", (42, "Alice", ["@everyone", "approvers"]))

        followup = click.followups[0]
        assert followup.ephemeral and followup.ephemeral_for == world.alice.id
        assert followup.content == "Recorded your approval of gate 42."
        assert followup not in fake.messages(world.general)  # ephemeral: not in history
        assert fake.ephemeral_messages == [followup]
        # @original of a deferred update (type 6) is the clicked message itself
        assert click.content == "Gate 42: approved by Alice"
        assert gate.components == [] and [v.content for v in gate.edits] == ["Deploy web-1? (gate 42)"]
        assert not click.ephemeral


async def test_a_view_sent_by_discord_py_round_trips_its_custom_ids(fake: FakeDiscord, world: World) -> None:
    ApproveButton.log = []
    async with running(GateBot(intents=intents()), fake.token) as bot:
        view = discord.ui.View(timeout=None)
        view.add_item(ApproveButton(7))
        sent = await text_channel(bot, world.general).send("Approve gate 7?", view=view)
        assert fake.message(sent.id).custom_ids() == ["approve:7"]
        click = await fake.click(sent.id, "approve:7", world.bob)
        assert click.answered_in_time
        await fake.wait_for(lambda: ("done", 7) in ApproveButton.log, what="the callback")
        with pytest.raises(ValueError, match="no component"):
            await fake.click(sent.id, "approve:8", world.bob)


async def test_late_and_second_interaction_responses_are_rejected(fake: FakeDiscord, world: World) -> None:
    ApproveButton.log = []
    gate = fake.add_message(world.general, fake.bot, "gate 9", components=gate_components(9))
    # Make the callback arrive "after" the 3-second window by moving the fake clock when it comes in.
    fake.on_request("POST", CALLBACK_ROUTE, lambda _: fake.clock.advance(5), times=1)
    async with running(GateBot(intents=intents()), fake.token):
        late = await fake.click(gate, "approve:9", world.alice)
        await fake.wait_for(lambda: ("defer failed", 10062) in ApproveButton.log, what="the 10062")
        assert not late.responded and not late.answered_in_time
        assert [(a.accepted, a.error_code) for a in late.attempts] == [(False, 10062)]

        on_time = await fake.click(gate, "approve:9", world.alice)
        assert on_time.answered_in_time
        async with aiohttp.ClientSession() as http:
            url = f"{fake.api_url}/interactions/{on_time.id}/{on_time.token}/callback"
            async with http.post(url, json={"type": 6}) as response:
                assert response.status == 400
                assert (await response.json())["code"] == 40060
        assert [a.accepted for a in on_time.attempts] == [True, False]


async def test_a_click_while_the_bot_is_offline_reaches_nobody(fake: FakeDiscord, world: World) -> None:
    gate = fake.add_message(world.general, fake.bot, "gate 1", components=gate_components(1))
    click = await fake.click(gate, "approve:1", world.alice)
    assert not click.delivered and not click.responded and click.dispatched_at is None


# --- request hooks and SIGKILL ------------------------------------------------------------------------------


async def test_before_hook_can_answer_instead_of_the_fake(fake: FakeDiscord, world: World) -> None:
    from adapters.discord.testing import FakeResponse

    seen: list[int] = []

    async def forbid(record: Any) -> FakeResponse:
        seen.append(record.seq)
        return FakeResponse.error(403, 50013, "Missing Permissions")

    fake.on_request(
        "POST", MESSAGES_ROUTE, forbid, match=lambda r: r.params["channel_id"] == str(world.random.id)
    )
    async with running(Bot(intents=intents()), fake.token) as bot:
        with pytest.raises(discord.Forbidden):
            await text_channel(bot, world.random).send("not allowed here")
        await text_channel(bot, world.general).send("fine here")
    assert len(seen) == 1 and fake.bot_messages(world.random) == []
    assert [m.content for m in fake.bot_messages(world.general)] == ["fine here"]


async def test_kill_hook_sigkills_the_bot_process_after_the_message_was_stored(
    fake: FakeDiscord, world: World
) -> None:
    env = {
        **os.environ,
        **fake.env(),
        "CHANNEL_ID": str(world.general.id),
        "NONCE": "entry-99",
        "PYTHONPATH": str(REPO_ROOT),
    }

    async def run_sender() -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            str(SENDER_SCRIPT),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )

    proc = await run_sender()
    try:
        hook = fake.kill_on("POST", MESSAGES_ROUTE, proc.pid)
        returncode = await asyncio.wait_for(proc.wait(), timeout=30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert returncode == -signal.SIGKILL
    assert hook.calls == 1
    post = fake.calls("POST", MESSAGES_ROUTE)[0]
    assert post.killed_pid == proc.pid and post.effect
    assert [m.content for m in fake.bot_messages(world.general)] == ["hello from the bot process"]
    assert proc.stdout is not None and b"sent" not in await proc.stdout.read()  # it never saw the response

    # The restarted process sends the same deterministic nonce: Discord returns the stored message.
    restarted = await run_sender()
    try:
        assert restarted.stdout is not None
        line = await asyncio.wait_for(restarted.stdout.readline(), timeout=30)
    finally:
        restarted.kill()
        await restarted.wait()
    assert line.decode().strip() == f"sent {fake.bot_messages(world.general)[0].id}"
    assert len(fake.bot_messages(world.general)) == 1
    assert fake.calls("POST", MESSAGES_ROUTE)[-1].deduplicated


async def test_zlib_stream_transport_with_a_discord_py_that_has_no_zstd(
    fake: FakeDiscord, world: World
) -> None:
    # Hide the zstd modules from a subprocess so discord.py falls back to its zlib-stream decompressor.
    hide_zstd = (
        "import runpy, sys; sys.modules['zstandard'] = None; sys.modules['compression.zstd'] = None; "
        f"runpy.run_path({str(SENDER_SCRIPT)!r}, run_name='__main__')"
    )
    env = {
        **os.environ,
        **fake.env(),
        "CHANNEL_ID": str(world.general.id),
        "NONCE": "z1",
        "PYTHONPATH": str(REPO_ROOT),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", hide_zstd, env=env, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=30)
    finally:
        proc.kill()
        await proc.wait()
    assert line.startswith(b"sent ")
    assert [(c.requested_compression, c.compression) for c in fake.connections] == [
        ("zlib-stream", "zlib-stream")
    ]
    assert fake.sessions[0].events[:2] == ["READY", "GUILD_CREATE"]


async def test_strict_fake_reports_routes_it_does_not_implement() -> None:
    fake = FakeDiscord()
    statuses: list[int] = []

    async def call_an_unimplemented_route() -> None:
        async with fake, aiohttp.ClientSession() as http:
            headers = {"Authorization": f"Bot {fake.token}"}
            async with http.get(f"{fake.api_url}/voice/regions", headers=headers) as response:
                statuses.append(response.status)

    with pytest.raises(UnhandledRequestsError, match="GET /voice/regions"):
        await call_an_unimplemented_route()
    assert statuses == [404]
    assert [r.path for r in fake.unhandled_requests] == ["/voice/regions"]


# --- more interaction response types, selects, DMs, liveness ------------------------------------------------


class StyleBot(Bot):
    """Answers component clicks in the style named by the custom_id (`style:<name>`)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.interaction_data: list[dict[str, Any]] = []
        self.failures: list[int] = []

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        data = dict(interaction.data or {})
        self.interaction_data.append(data)
        style = str(data.get("custom_id", "")).removeprefix("style:")
        try:
            if style == "reply":  # type 4, ephemeral
                await interaction.response.send_message("Only you see this.", ephemeral=True)
            elif style == "update":  # type 7, edits the clicked message in place
                await interaction.response.edit_message(content="Decided: yes", view=None)
            elif style == "think":  # type 5, then the real answer replaces the loading message
                await interaction.response.defer(thinking=True)
                await interaction.edit_original_response(content="Thought about it: yes")
                await interaction.followup.send("And one more thing.")
            elif style == "pick":  # a select menu
                await interaction.response.send_message(f"You picked {','.join(data['values'])}")
        except discord.HTTPException as error:
            self.failures.append(error.code)


def styled(*names: str) -> list[dict[str, object]]:
    buttons = [{"type": 2, "style": 1, "label": n, "custom_id": f"style:{n}"} for n in names]
    return [{"type": 1, "components": buttons}]


async def test_interaction_response_types_4_5_and_7(fake: FakeDiscord, world: World) -> None:
    panel = fake.add_message(world.general, fake.bot, "Choose", components=styled("reply", "update", "think"))
    async with running(StyleBot(intents=intents()), fake.token):
        reply = await fake.click(panel, "style:reply", world.alice)
        assert (reply.response_type, reply.ephemeral, reply.content) == (4, True, "Only you see this.")
        assert reply.original is not None and reply.original.ephemeral_for == world.alice.id
        assert reply.original not in fake.messages(world.general)

        think = await fake.click(panel, "style:think", world.bob)
        assert think.response_type == 5 and not think.ephemeral
        await fake.wait_for(lambda: len(think.followups) == 1, what="the follow-up")
        assert think.content == "Thought about it: yes" and think.original is not None
        assert think.original.edits[0].content == ""  # the "thinking..." placeholder was replaced
        assert [m.content for m in fake.bot_messages(world.general)][-2:] == [
            "Thought about it: yes",
            "And one more thing.",
        ]

        update = await fake.click(panel, "style:update", world.alice)
        assert update.response_type == 7 and update.content == "Decided: yes"
        assert panel.content == "Decided: yes" and panel.components == []
        with pytest.raises(ValueError, match="no component"):
            await fake.click(panel, "style:reply", world.alice)  # the buttons are gone


async def test_interaction_tokens_expire_after_15_minutes(fake: FakeDiscord, world: World) -> None:
    ApproveButton.log = []
    gate = fake.add_message(world.general, fake.bot, "gate 5", components=gate_components(5))
    fake.on_request(
        "POST", "/webhooks/{application_id}/{interaction_token}", lambda _: fake.clock.advance(901), times=1
    )
    async with running(GateBot(intents=intents()), fake.token):
        click = await fake.click(gate, "approve:5", world.alice)
        await fake.wait_for(
            lambda: fake.calls("POST", "/webhooks/{a}/{t}") != [], what="the follow-up attempt"
        )
        followup = await fake.wait_for_request("POST", "/webhooks/{a}/{t}")
        assert click.answered_in_time
        assert followup.status == 401 and followup.response["code"] == 50027
        await fake.wait_for(
            lambda: ("follow-up failed", 50027) in ApproveButton.log, what="the bot to see 50027"
        )
        assert click.followups == []


async def test_select_menu_values_reach_the_bot(fake: FakeDiscord, world: World) -> None:
    menu = {
        "type": 3,
        "custom_id": "style:pick",
        "options": [{"label": "web-1", "value": "web-1"}, {"label": "web-2", "value": "web-2"}],
        "min_values": 1,
        "max_values": 2,
    }
    panel = fake.add_message(
        world.general, fake.bot, "Which hosts?", components=[{"type": 1, "components": [menu]}]
    )
    async with running(StyleBot(intents=intents()), fake.token) as bot:
        choice = await fake.select(panel, "style:pick", world.alice, ["web-1", "web-2"])
        assert choice.response_type == 4 and choice.content == "You picked web-1,web-2"
        assert bot.interaction_data[0]["component_type"] == 3


async def test_direct_messages(fake: FakeDiscord, world: World) -> None:
    dm_intents = intents(message_content=False)
    dm_intents.dm_messages = True
    async with running(Bot(intents=dm_intents), fake.token) as bot:
        dm = fake.dm_channel(world.alice)
        await fake.user_sends(dm, world.alice, "psst, deploy web-2")
        await fake.wait_for(lambda: bot.received != [], what="the DM")
        incoming = bot.received[0]
        assert isinstance(incoming.channel, discord.DMChannel)
        assert incoming.content == "psst, deploy web-2"  # DMs carry content without MESSAGE_CONTENT
        await incoming.channel.send("ok")
        user = await bot.fetch_user(world.bob.id)
        await user.send("hello bob")  # opens the DM over REST first
        assert [m.content for m in fake.bot_messages(dm)] == ["ok"]
        assert [m.content for m in fake.bot_messages(fake.dm_channel(world.bob))] == ["hello bob"]


async def test_unacknowledged_heartbeats_make_discord_py_reconnect_and_resume(
    fake: FakeDiscord, world: World
) -> None:
    async with running(Bot(intents=intents(), heartbeat_timeout=0.5), fake.token) as bot:
        session = await fake.wait_for_session()
        fake.ack_heartbeats = False  # a zombie connection: the client gives up on it
        await fake.wait_for(lambda: len(fake.connections) == 2, timeout=10, what="a reconnect")
        fake.ack_heartbeats = True
        await fake.wait_for(lambda: session.resumes == 1 and session.connected, what="the RESUME")
        await fake.user_sends(world.general, world.alice, "still here?")
        await fake.wait_for(lambda: bot.contents() == ["still here?"], what="delivery after the resume")
        assert len(fake.sessions) == 1


async def test_a_deaf_connection_gets_nothing_until_discord_py_gives_up_on_it_and_resumes(
    fake: FakeDiscord, world: World
) -> None:
    async with running(Bot(intents=intents(), heartbeat_timeout=1.0), fake.token) as bot:
        session = await fake.wait_for_session()
        deaf = fake.go_deaf()
        await fake.user_sends(world.general, world.alice, "into the void")  # logged, sent, never heard
        assert deaf.open and deaf.frames_lost >= 1 and bot.contents() == []
        await fake.wait_for(lambda: not deaf.open and session.connected, timeout=10, what="a RESUME")
        assert deaf.heartbeats_unanswered >= 1 and session.resumes == 1
        await fake.wait_for(lambda: bot.contents() == ["into the void"], what="the replay")
        await fake.user_sends(world.general, world.alice, "and after")
        await fake.wait_for(lambda: bot.contents() == ["into the void", "and after"], what="live delivery")
        assert len(fake.sessions) == 1 and not fake.connections[-1].deaf


async def test_world_changes_while_connected_are_dispatched(fake: FakeDiscord, world: World) -> None:
    async with running(Bot(intents=intents(members=True)), fake.token) as bot:
        guild = bot.get_guild(world.guild.id)
        assert guild is not None
        deploys = fake.add_text_channel(world.guild, "deploys")
        carol = fake.add_user("carol", global_name="Carol")
        fake.add_member(world.guild, carol, roles=[world.approvers])
        second = fake.add_guild("Staging")
        await fake.wait_for(lambda: guild.get_channel(deploys.id) is not None, what="CHANNEL_CREATE")
        await fake.wait_for(lambda: guild.get_member(carol.id) is not None, what="GUILD_MEMBER_ADD")
        await fake.wait_for(lambda: bot.get_guild(second.id) is not None, what="GUILD_CREATE")
        member = guild.get_member(carol.id)
        assert member is not None and [r.name for r in member.roles] == ["@everyone", "approvers"]
