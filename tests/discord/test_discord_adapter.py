"""The Discord adapter in this process: configuration, startup checks, intake rules, the transport's
reconciliation and error mapping, approval clicks, and catch-up after a session Discord did not resume.

The real discord.py client talks to the loopback fake Discord; the harness runs on MemoryStorage. The crash
and restart behaviour with real processes is in test_discord_adapter_e2e.py. No ``__init__.py`` here (see
test_fake_discord.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from adapters.bridge import (
    ApprovalPolicy,
    Bridge,
    BridgeConfig,
    ChannelPolicy,
    EditExpired,
    GateView,
    MessageDoc,
    MessageGone,
    Place,
    PlaceDoc,
    RetryLater,
)
from adapters.discord import (
    DiscordAdapter,
    DiscordConfigError,
    DiscordStartError,
    MessageContentNotEnabled,
    create,
)
from adapters.discord._endpoints import current_endpoints, override_endpoints
from adapters.discord.testing import (
    FakeChannel,
    FakeDiscord,
    FakeGuild,
    FakeMessage,
    FakeResponse,
    FakeRole,
    FakeUser,
)
from adapters.redact import install_log_redaction
from harness_core import AgentChange, Extension, Harness, ModelRef, Models, Registry, tool
from harness_core.messages import AssistantMessage, ToolResultMessage, UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import FauxProvider, faux_assistant, faux_tool_call
from harness_core.storage import MemoryStorage

pytestmark = pytest.mark.timeout(60)

MESSAGES_ROUTE = "/channels/{channel_id}/messages"
MESSAGE_ROUTE = "/channels/{channel_id}/messages/{message_id}"
MODEL = AgentChange(model=ModelRef(provider="faux", model_id="faux-1"))
FAST = {"edit_interval": 0.05, "guild_ready_timeout": 0.05}


class World:
    def __init__(self, fake: FakeDiscord) -> None:
        self.fake = fake
        self.guild: FakeGuild = fake.add_guild("Ops")
        self.general: FakeChannel = fake.add_text_channel(self.guild, "general")
        self.approvers: FakeRole = fake.add_role(self.guild, "approvers")
        self.alice: FakeUser = fake.add_user("alice", global_name="Alice")
        self.bob: FakeUser = fake.add_user("bob")
        self.carol: FakeUser = fake.add_user("carol", global_name="Carol")
        fake.add_member(self.guild, self.alice)
        fake.add_member(self.guild, self.bob, nick="Bobby")
        fake.add_member(self.guild, self.carol, roles=[self.approvers])
        self.place = Place("discord", str(self.guild.id), str(self.general.id))

    def answers(self, channel: FakeChannel | None = None) -> list[FakeMessage]:
        return self.fake.bot_messages(channel or self.general)


def user_lines(request: ModelRequest) -> list[str]:
    return [user_text(m) for m in request.messages if isinstance(m, UserMessage)]


def echo(request: ModelRequest) -> AssistantMessage:
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):  # the gated call: it awaits approval
        return faux_assistant("the deploy is waiting for approval")
    if isinstance(last, UserMessage) and user_text(last).startswith("(approval #"):  # the gate's outcome
        return faux_assistant(f"deploy result: {user_text(last).split('Result: ', 1)[-1]}")
    if "please deploy" in user_lines(request)[-1]:
        return faux_assistant([faux_tool_call("deploy", {"service": "api"}, id="d1")])
    return faux_assistant(f"re {user_lines(request)[-1]}")


@dataclass
class Rig:
    harness: Harness
    bridge: Bridge
    adapter: DiscordAdapter
    faux: FauxProvider
    deploys: list[str]

    @property
    def transport(self) -> Any:
        return self.adapter.transport


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    previous = current_endpoints()
    try:
        async with FakeDiscord(heartbeat_interval=0.5) as fake:
            yield fake
    finally:
        override_endpoints(previous.api_url, previous.gateway_url)  # the adapter points discord.py here


@pytest.fixture
def world(fake: FakeDiscord) -> World:
    return World(fake)


@pytest.fixture
async def rig_factory(fake: FakeDiscord, world: World) -> AsyncIterator[Callable[..., Any]]:
    rigs: list[Rig] = []

    async def make(
        *,
        answer: str = "all",
        policy: ChannelPolicy | None = None,
        options: dict[str, Any] | None = None,
        responder: Any = echo,
        chunk_size: int = 8,
        delay_ms: float = 0,
    ) -> Rig:
        faux = FauxProvider(chunk_size=chunk_size, delay_ms=delay_ms)
        faux.set_responder(responder)
        registry = Registry()
        harness = await Harness.open(await MemoryStorage.open(), models=Models(faux), registry=registry)
        bridge = Bridge(
            harness,
            config=BridgeConfig(default=policy or ChannelPolicy(answer=answer)),  # type: ignore[arg-type]
            agent=MODEL,
            approvals=[ApprovalPolicy(tools=["deploy"], groups=[str(world.approvers.id)])],
        )
        deploys: list[str] = []

        @tool
        def deploy(service: str) -> str:
            """Deploy a service."""
            deploys.append(service)
            return f"deployed {service}"

        registry.install(bridge.extension())
        registry.install(Extension("ops", tools=[deploy]))
        # The fake's clock dates messages, so advancing it ages them for Discord and the adapter alike.
        adapter = create({**FAST, **(options or {})}, fake.env(), clock=fake.clock.now)
        rig = Rig(harness, bridge, adapter, faux, deploys)
        rigs.append(rig)
        await bridge.start()
        await adapter.start(bridge)
        harness.resume()
        return rig

    yield make
    for rig in rigs:
        await rig.adapter.stop()
        await rig.bridge.stop()
        await rig.harness.close()


async def final(fake: FakeDiscord, channel: FakeChannel, text: str) -> FakeMessage:
    return await fake.wait_for_message(channel, predicate=lambda m: m.content == text, timeout=10)


# --- configuration and startup ------------------------------------------------------------------------------


def test_create_validates_options_by_key_and_takes_secrets_only_from_the_environment(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {"DISCORD_BOT_TOKEN": "s3cret-token"}
    adapter = create({"edit_interval": 0.5, "message_content": False}, env)
    assert adapter.name == "discord" and adapter.settings.options.edit_interval == 0.5
    assert "s3cret-token" not in repr(adapter) and "s3cret-token" not in repr(adapter.settings)
    with pytest.raises(
        DiscordConfigError, match=r"adapters\.discord\.edit_interval: Input should be greater"
    ):
        create({"edit_interval": 0}, env)
    with pytest.raises(DiscordConfigError, match=r"adapters\.discord\.token: unknown option"):
        create({"token": "in the file"}, env)  # secrets are refused in the TOML table
    with pytest.raises(DiscordConfigError, match=r"adapters\.discord\.max_ratelimit_timeout"):
        create({"max_ratelimit_timeout": 5}, env)  # discord.py's floor is 30 s
    with pytest.raises(DiscordConfigError, match=r"adapters\.discord\.edit_age_limit"):
        create({"edit_age_limit": 4000}, env)  # Discord refuses edits of messages older than an hour
    assert create({}, env).settings.options.heartbeat_timeout == 60.0  # discord.py's default
    for bad in (0.5, 601, "soon"):
        with pytest.raises(DiscordConfigError, match=r"adapters\.discord\.heartbeat_timeout"):
            create({"heartbeat_timeout": bad}, env)
    with pytest.raises(DiscordConfigError, match="DISCORD_BOT_TOKEN is not set"):
        create({}, {"DISCORD_BOT_TOKEN": "  "})
    with pytest.raises(DiscordConfigError, match="DISCORD_API_URL must be an http"):
        create({}, {**env, "DISCORD_API_URL": "ws://127.0.0.1:1"})
    with pytest.raises(DiscordConfigError, match="DISCORD_GATEWAY_URL must be a ws"):
        create({}, {**env, "DISCORD_GATEWAY_URL": "http://127.0.0.1:1/gateway"})
    assert "s3cret-token" not in caplog.text


async def test_start_refuses_an_application_without_message_content() -> None:
    previous = current_endpoints()
    try:
        async with FakeDiscord(
            heartbeat_interval=0.5, message_content_granted=False, reject_ungranted_privileged_intents=True
        ) as fake:
            World(fake)
            harness = await Harness.open(await MemoryStorage.open())
            bridge = Bridge(harness)
            with pytest.raises(MessageContentNotEnabled, match="Message Content Intent"):
                await create(FAST, fake.env()).start(bridge)
            assert fake.sessions == []  # refused from the application's flags, before the gateway
            # Without the intent, by choice: it connects and asks Discord for no content intent.
            adapter = create({**FAST, "message_content": False}, fake.env())
            await adapter.start(bridge)
            assert not fake.sessions[0].message_content_requested
            await adapter.stop()

            # The intent is switched off between the flags check and IDENTIFY: Discord closes with 4014.
            fake.message_content_granted = True

            def revoke(_: Any) -> None:
                fake.message_content_granted = False

            fake.on_request("GET", "/oauth2/applications/@me", revoke, when="after_effect", times=1)
            with pytest.raises(MessageContentNotEnabled):
                await create(FAST, fake.env()).start(bridge)
            assert fake.connections[-1].server_close_code == 4014
            await harness.close()
    finally:
        override_endpoints(previous.api_url, previous.gateway_url)


async def test_a_rejected_token_is_a_clear_error_that_does_not_repeat_the_token(
    fake: FakeDiscord, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    harness = await Harness.open(await MemoryStorage.open())
    adapter = create(FAST, {**fake.env(), "DISCORD_BOT_TOKEN": "wrong-token-value"})
    with pytest.raises(DiscordStartError, match="rejected DISCORD_BOT_TOKEN") as error:
        await adapter.start(Bridge(harness))
    assert "wrong-token-value" not in str(error.value) and "wrong-token-value" not in caplog.text
    await adapter.stop()
    await harness.close()


# --- intake -------------------------------------------------------------------------------------------------


async def test_mentions_replies_dms_and_the_bots_own_messages(
    fake: FakeDiscord, world: World, rig_factory: Any
) -> None:
    rig = await rig_factory(answer="mentions")
    bot = fake.bot
    await fake.user_sends(world.general, world.alice, "the deploy is at five")  # kept as context only
    asked = await fake.user_sends(world.general, world.alice, f"{bot.mention} when is the deploy?")
    answer = await final(fake, world.general, "re Alice: @durable-bot when is the deploy?")
    # A reply to the bot pings it (so it is addressed) and is attributed with what it replies to.
    await fake.user_sends(world.general, world.bob, "thanks!", reply_to=answer)
    await final(
        fake,
        world.general,
        're Bobby: (replying to durable-bot: "re Alice: @durable-bot when is the deploy?") thanks!',
    )
    await fake.user_sends(world.general, world.carol, "hmm", reply_to=asked, mention_author=False)
    await fake.user_sends(world.general, world.carol, "quietly", reply_to=answer, mention_author=False)
    await final(
        fake,
        world.general,
        're Carol: (replying to durable-bot: "re Alice: @durable-bot when is the deploy?") quietly',
    )
    dm = fake.dm_channel(world.carol)
    await fake.user_sends(dm, world.carol, "psst, a private question")
    await final(fake, dm, "re Carol: psst, a private question")

    # Request ids (the bridge's message keys) are discord:<guild>:<channel>:<message id>; DMs use "@me".
    keys = set((await rig.harness.family(MessageDoc)).keys())
    assert f"discord:{world.guild.id}:{world.general.id}:{asked.id}" in keys
    assert any(k.startswith(f"discord:@me:{dm.id}:") for k in keys)
    contexts = [user_lines(r) for r in rig.faux.requests]
    assert contexts[0] == ["Alice: the deploy is at five", "Alice: @durable-bot when is the deploy?"]
    assert contexts[1][-1].startswith("Bobby: (replying to durable-bot:")
    assert contexts[3] == ["Carol: psst, a private question"]  # a DM is a conversation of its own
    assert len(rig.faux.requests) == 4  # carol's reply to alice (no mention) was recorded, not answered
    place = await rig.harness.snapshot(PlaceDoc, key=world.place.key)
    channel = await rig.harness.conversation(int(place["conversation_id"]))
    assert channel is not None
    page = await channel.entries(limit=20)
    texts = [user_text(e.model[0]) for e in page.items if e.model and isinstance(e.model[0], UserMessage)]
    assert 'Carol: (replying to Alice: "@durable-bot when is the deploy?") hmm' in texts
    # The bot's own posts were never taken as input (no echo loop).
    assert not any(line.startswith("durable-bot:") for context in contexts for line in context)


# --- the transport ------------------------------------------------------------------------------------------


async def test_create_is_deduplicated_by_nonce_and_found_by_its_marker_beyond_the_window(
    fake: FakeDiscord, world: World, rig_factory: Any
) -> None:
    rig = await rig_factory()
    transport = rig.transport
    first = await transport.create(world.place, "partial …", "reply:7#0")
    again = await transport.create(world.place, "final text", "reply:7#0")  # a retry, e.g. after a crash
    assert again == first
    stored = fake.message(int(first))
    assert stored.content == "final text"  # the earlier post now shows what was asked for last
    assert [m.id for m in world.answers()] == [stored.id]
    assert stored.nonce is not None and len(stored.nonce) <= 25
    assert await transport.find(world.place, "reply:7#0") == first
    assert await transport.find(world.place, "reply:7#1") is None
    other = fake.add_text_channel(world.guild, "random")
    assert await transport.find(Place("discord", str(world.guild.id), str(other.id)), "reply:7#0") is None

    fake.clock.advance(fake.nonce_window + 1)  # Discord no longer dedupes: the marker still finds it
    assert await transport.find(world.place, "reply:7#0") == first
    fresh = await transport.create(world.place, "a second message", "reply:7#0")
    assert fresh != first  # which is why the bridge asks `find` before it posts again


async def test_platform_errors_map_to_what_the_bridge_does_next(
    fake: FakeDiscord, world: World, rig_factory: Any
) -> None:
    rig = await rig_factory()
    transport = rig.transport
    old = await transport.create(world.place, "written long ago", "reply:1#0")
    fake.age_message(int(old), 3601)
    with pytest.raises(EditExpired):  # 30046: the bridge continues in a new message
        await transport.edit(world.place, old, "more", "reply:1#0", final=True)
    gone = await transport.create(world.place, "soon deleted", "reply:2#0")
    await fake.user_deletes(int(gone))
    with pytest.raises(MessageGone):
        await transport.edit(world.place, gone, "more", "reply:2#0", final=True)

    fake.rate_limit("POST", MESSAGES_ROUTE, times=1, retry_after=120)  # longer than max_ratelimit_timeout
    with pytest.raises(RetryLater) as limited:
        await transport.create(world.place, "later", "reply:3#0")
    assert limited.value.seconds == 120
    secret = fake.add_text_channel(world.guild, "secret")
    fake.on_request(
        "POST",
        MESSAGES_ROUTE,
        lambda _: FakeResponse.error(403, 50001, "Missing Access"),
        match=lambda r: r.params["channel_id"] == str(secret.id),
    )
    with pytest.raises(RetryLater) as forbidden:  # not every second: 403s count towards an IP ban
        await transport.create(Place("discord", str(world.guild.id), str(secret.id)), "x", "reply:4#0")
    assert forbidden.value.seconds >= 60
    assert await transport.create(world.place, "later", "reply:3#0")  # the rate limit has passed


async def test_a_hung_rest_call_times_out_and_the_answer_is_posted_once(
    fake: FakeDiscord, world: World, rig_factory: Any
) -> None:
    """aiohttp would wait five minutes for a hung POST, and every write into the channel queues behind it."""
    released = asyncio.Event()

    async def hang(_: Any) -> None:
        await released.wait()  # Discord never answers this one (until the test is over)

    hung = fake.on_request("POST", MESSAGES_ROUTE, hang, times=1)
    await rig_factory(options={"request_timeout": 0.5})
    await fake.user_sends(world.general, world.alice, "status please")
    answer = await final(fake, world.general, "re Alice: status please")
    assert hung.calls == 1  # the first post hung; the bridge gave up on it and posted again
    assert [m.id for m in world.answers()] == [answer.id]
    released.set()  # the hung request completes late: Discord dedupes its nonce, still one message
    posts = fake.calls("POST", MESSAGES_ROUTE)
    await fake.wait_for(lambda: all(r.status is not None for r in posts), what="the hung post to finish")
    assert [m.content for m in world.answers()] == ["re Alice: status please"]


def patches_of(fake: FakeDiscord, message_id: int | str) -> list[Any]:
    return [r for r in fake.calls("PATCH", MESSAGE_ROUTE) if r.params["message_id"] == str(message_id)]


async def test_messages_older_than_the_age_limit_are_not_edited_at_all(
    fake: FakeDiscord, world: World, rig_factory: Any
) -> None:
    # Discord would still accept a few edits of old messages: only the adapter's own check keeps them off.
    fake.old_message_edit_limit = 100
    rig = await rig_factory()
    transport = rig.transport
    posted = await transport.create(world.place, "streaming …", "reply:1#0")
    fake.clock.advance(54 * 60)
    await transport.edit(world.place, posted, "streaming … more …", "reply:1#0", final=False)
    assert len(patches_of(fake, posted)) == 1  # younger than the limit (55 minutes): edited
    fake.clock.advance(2 * 60)  # 56 minutes: Discord would still take it, but the hour is too close
    with pytest.raises(EditExpired):
        await transport.edit(world.place, posted, "the final answer", "reply:1#0", final=True)
    assert len(patches_of(fake, posted)) == 1  # the doomed edit was never sent
    assert fake.message(int(posted)).content == "streaming … more …"


async def test_deciding_an_old_gate_replies_when_the_request_can_no_longer_be_edited(
    fake: FakeDiscord, world: World, rig_factory: Any
) -> None:
    fake.old_message_edit_limit = 100  # Discord would accept the edit: the adapter must not try it
    rig = await rig_factory()
    gate = GateView(7, "deploy", {"service": "api"}, None, "Alice", "pending", None, None, 2_000_000_000_000)
    posted = await rig.transport.post_approval(world.place, gate, "approval:7")
    message = fake.message(int(posted))
    assert message.custom_ids() == [
        "durable-bots:approve:7",
        "durable-bots:deny:7",
        "durable-bots:withdraw:7",
    ]
    assert await rig.transport.find(world.place, "approval:7") == posted
    fake.clock.advance(7200)  # a gate decided two hours later
    decided = GateView(7, "deploy", {"service": "api"}, None, "Alice", "approved", "Carol", 1, 2)
    await rig.transport.update_approval(world.place, posted, decided)
    reply = world.answers()[-1]
    assert reply.reply_to == message.id and reply.content.startswith("✅ `deploy` **approved** by Carol")
    assert message.custom_ids()  # the stale buttons stay; a click on them is answered "already decided"
    assert patches_of(fake, posted) == []  # replied straight away, without a doomed edit

    # Discord's clock may call a message old that ours does not: its 30046 also turns into a reply.
    fake.old_message_edit_limit = 0
    gate = GateView(8, "deploy", {"service": "db"}, None, "Alice", "pending", None, None, 2_000_000_000_000)
    posted = await rig.transport.post_approval(world.place, gate, "approval:8")
    fake.age_message(int(posted), 3601)
    decided = GateView(8, "deploy", {"service": "db"}, None, "Alice", "denied", "Carol", 1, 2)
    await rig.transport.update_approval(world.place, posted, decided)
    assert [r.status for r in patches_of(fake, posted)] == [400]
    reply = world.answers()[-1]
    assert reply.reply_to == int(posted) and reply.content.startswith("❌ `deploy` **denied** by Carol")


# --- approvals ----------------------------------------------------------------------------------------------


async def test_deny_click_blocks_the_tool_and_unknown_gates_are_answered(
    fake: FakeDiscord, world: World, rig_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    install_log_redaction()  # what the bots runtime does before anything logs
    caplog.set_level(logging.DEBUG)  # discord.py logs every request URL, interaction tokens included
    rig = await rig_factory()
    await fake.user_sends(world.general, world.alice, "please deploy")
    gate = await fake.wait_for(
        lambda: next((m for m in world.answers() if m.custom_ids()), None), what="the request"
    )
    gate_id = gate.custom_ids()[1].rsplit(":", 1)[1]
    click = await fake.click(gate, f"durable-bots:deny:{gate_id}", world.carol)
    assert click.answered_in_time and click.response_type == 6
    result = await fake.wait_for_message(
        world.general, predicate=lambda m: m.content.startswith("deploy result:"), timeout=10
    )
    assert "was denied by Carol; it did not run" in result.content  # the outcome, a turn of its own
    await fake.wait_for(lambda: not gate.components, what="the buttons to go")
    assert gate.content.startswith("❌ `deploy` **denied** by Carol") and rig.deploys == []

    stray = fake.add_message(
        world.general,
        fake.bot,
        "a request from a bot whose data was removed",
        components=[
            {
                "type": 1,
                "components": [
                    {"type": 2, "style": 3, "label": "Approve", "custom_id": "durable-bots:approve:999"}
                ],
            }
        ],
    )
    unknown = await fake.click(stray, "durable-bots:approve:999", world.carol)
    await fake.wait_for(lambda: unknown.followups, what="the answer")
    assert unknown.followups[0].ephemeral and "unknown" in unknown.followups[0].content
    assert "/interactions/" in caplog.text and "/***/callback" in caplog.text
    for interaction in (click, unknown):
        assert interaction.token not in caplog.text


# --- sessions -----------------------------------------------------------------------------------------------


async def test_a_session_discord_did_not_resume_is_followed_by_a_catch_up(
    fake: FakeDiscord, world: World, rig_factory: Any
) -> None:
    rig = await rig_factory()
    await fake.user_sends(world.general, world.alice, "before")
    await final(fake, world.general, "re Alice: before")
    assert rig.adapter.catch_ups == 1
    fake.hold_new_connections()
    await fake.invalidate_sessions(resumable=False)  # discord.py re-IDENTIFYs: a new session, no replay
    await fake.wait_for(lambda: len(fake.connections) == 2, timeout=15, what="the reconnect")
    await fake.user_sends(world.general, world.bob, "during the gap")  # delivered to no session
    fake.release_new_connections()
    await final(fake, world.general, "re Bobby: during the gap")
    assert len(fake.sessions) == 2 and rig.adapter.catch_ups == 2
    await fake.user_sends(world.general, world.alice, "after")
    await final(fake, world.general, "re Alice: after")
    assert [m.content for m in world.answers()] == [
        "re Alice: before",
        "re Bobby: during the gap",
        "re Alice: after",
    ]


def stale_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "adapters.discord" and r.levelno == logging.WARNING and "went silent" in r.getMessage()
    ]


async def test_a_deaf_gateway_connection_is_replaced_and_resumed_and_loses_nothing(
    fake: FakeDiscord, world: World, rig_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The gateway stops answering on an open connection (no HEARTBEAT_ACK, no events). discord.py gives up on
    it after heartbeat_timeout and RESUMEs on a new one; the RESUME replays what the deaf one swallowed."""
    caplog.set_level(logging.INFO)
    rig = await rig_factory(options={"heartbeat_timeout": 1.0})
    await fake.user_sends(world.general, world.alice, "before")
    await final(fake, world.general, "re Alice: before")
    session = fake.sessions[0]
    deaf = fake.go_deaf()
    await fake.user_sends(world.general, world.bob, "while it was deaf")
    assert deaf.frames_lost >= 1 and rig.adapter.health().stale_detections == 0
    await fake.wait_for(lambda: not deaf.open and session.connected, timeout=15, what="the RESUME")
    await final(fake, world.general, "re Bobby: while it was deaf")
    await fake.user_sends(world.general, world.alice, "after")
    await final(fake, world.general, "re Alice: after")
    assert [m.content for m in world.answers()] == [
        "re Alice: before",
        "re Bobby: while it was deaf",
        "re Alice: after",
    ]
    assert len(fake.sessions) == 1 and session.resumes == 1 and rig.adapter.catch_ups == 1
    health = rig.adapter.health()
    assert (health.connections_opened, health.reconnects, health.stale_detections) == (2, 1, 1)
    assert health.connected and health.last_stale_reason is not None
    assert "heartbeat_timeout 1s" in health.last_stale_reason
    [warning] = stale_warnings(caplog)
    assert warning.startswith("discord: the gateway connection went silent")
    assert fake.token not in caplog.text
    # 1 s is fine for a RESUME, but would not survive a re-IDENTIFY (heartbeat interval 0.5 s + 5 s): said once.
    assert caplog.text.count("heartbeat_timeout (1s) is too short") == 1


async def test_a_deaf_connection_whose_session_ended_meanwhile_is_followed_by_a_catch_up(
    fake: FakeDiscord, world: World, rig_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Same, but Discord ended the session while the connection was deaf: the RESUME is refused, discord.py
    IDENTIFYs (a new session, nothing replayed) and the adapter catches up from history. The timeout covers
    discord.py's 5 s wait before a new IDENTIFY, during which it reads nothing."""
    rig = await rig_factory(options={"heartbeat_timeout": 6.0})
    await fake.user_sends(world.general, world.alice, "before")  # catch-up reads the places the bot knows
    await final(fake, world.general, "re Alice: before")
    deaf = fake.go_deaf()
    await fake.user_sends(world.general, world.bob, "while it was deaf")
    await fake.invalidate_sessions(resumable=False)  # the op 9 is lost on the deaf connection too
    await fake.wait_for(
        lambda: len(fake.connected_sessions) == 1 and not deaf.open, timeout=30, what="IDENTIFY"
    )
    await final(fake, world.general, "re Bobby: while it was deaf")
    await fake.user_sends(world.general, world.alice, "after")
    await final(fake, world.general, "re Alice: after")
    assert [m.content for m in world.answers()] == [
        "re Alice: before",
        "re Bobby: while it was deaf",
        "re Alice: after",
    ]
    assert len(fake.sessions) == 2 and rig.adapter.catch_ups == 2
    health = rig.adapter.health()
    assert (health.connections_opened, health.reconnects, health.stale_detections) == (2, 1, 1)
    assert len(stale_warnings(caplog)) == 1
    assert "is too short" not in caplog.text


async def test_reply_in_thread_policy_starts_the_thread_on_discord_and_answers_there(
    fake: FakeDiscord, world: World, rig_factory: Any
) -> None:
    rig = await rig_factory(policy=ChannelPolicy(answer="all", reply_in_thread=True))
    asked = await fake.user_sends(world.general, world.alice, "is staging healthy?")
    thread = await fake.wait_for(
        lambda: fake.channel(asked.thread_id) if asked.thread_id else None, what="the thread"
    )
    assert thread.is_thread and thread.parent_id == world.general.id and thread.name == "is staging healthy?"
    await final(fake, thread, "re Alice: is staging healthy?")
    assert [m.content for m in world.answers()] == []  # nothing in the channel itself
    await fake.user_sends_in_thread(thread, world.bob, "and production?")
    await final(fake, thread, "re Bobby: and production?")
    assert user_lines(rig.faux.requests[-1]) == ["Alice: is staging healthy?", "Bobby: and production?"]
    key = f"discord:{world.guild.id}:{world.general.id}:{fake.messages(thread)[-2].id}"
    assert key in await rig.harness.family(MessageDoc)  # thread messages are keyed by the parent channel


async def test_an_edit_refused_for_age_continues_the_answer_in_a_new_message(
    fake: FakeDiscord, world: World, rig_factory: Any
) -> None:
    pad = " more" * 60
    await rig_factory(
        responder=lambda r: faux_assistant(f"re {user_lines(r)[-1]}{pad}"), chunk_size=20, delay_ms=10
    )

    patches: list[Any] = []

    def age(record: Any) -> None:  # at the second edit: as if the stream had started more than an hour ago
        patches.append(record)
        if len(patches) == 2:
            fake.age_message(int(record.params["message_id"]), 3601)

    fake.on_request("PATCH", "/channels/{channel_id}/messages/{message_id}", age, times=2)
    await fake.user_sends(world.general, world.alice, "a slow answer")
    await final(fake, world.general, "re Alice: a slow answer" + pad)
    first, second = world.answers()
    # Keeps the partial answer it showed when Discord refused the edit (30046).
    assert first.content.startswith("re Alice") and first.content.endswith("…")
    assert second.content == "re Alice: a slow answer" + pad


async def test_an_answer_streaming_past_the_age_limit_continues_without_editing_the_old_message(
    fake: FakeDiscord, world: World, rig_factory: Any
) -> None:
    fake.old_message_edit_limit = (
        100  # Discord would accept these edits: only the adapter's check avoids them
    )
    pad = " more" * 60
    await rig_factory(
        responder=lambda r: faux_assistant(f"re {user_lines(r)[-1]}{pad}"), chunk_size=20, delay_ms=10
    )
    # Right after the first part is stored, an hour passes (for Discord and the adapter alike).
    fake.on_request("POST", MESSAGES_ROUTE, lambda _: fake.clock.advance(3601), when="after_effect", times=1)
    await fake.user_sends(world.general, world.alice, "a slow answer")
    await final(fake, world.general, "re Alice: a slow answer" + pad)
    (answer,) = world.answers()
    assert answer.content == "re Alice: a slow answer" + pad
    (first,) = [
        m
        for m in fake.messages(world.general, include_deleted=True)
        if m.author is fake.bot and m.id != answer.id
    ]
    # The old message showed only the "…" placeholder: not one PATCH of it, and it is deleted rather than left
    # hanging above the answer.
    assert patches_of(fake, first.id) == [] and first.deleted


async def test_catch_up_reads_at_most_the_limit_and_keeps_the_newest(
    fake: FakeDiscord, world: World, rig_factory: Any
) -> None:
    rig = await rig_factory(options={"catch_up_limit": 2})
    await fake.user_sends(world.general, world.alice, "first")
    await final(fake, world.general, "re Alice: first")
    await rig.adapter.stop()
    for text in ("missed 1", "missed 2", "missed 3"):
        await fake.user_sends(world.general, world.bob, text)
    again = create({**FAST, "catch_up_limit": 2}, fake.env())
    try:
        await again.start(rig.bridge)  # same bridge and store: a restart of the adapter alone
        assert again.caught_up_messages == 2
        await final(fake, world.general, "re Bobby: missed 3")
        assert [m.content for m in world.answers()] == [
            "re Alice: first",
            "re Bobby: missed 2",
            "re Bobby: missed 3",
        ]
    finally:
        await again.stop()


@pytest.mark.parametrize(
    ("reason", "status", "expected"),
    [
        ("not_an_approver", "pending", "not one of the approvers"),
        ("self_approval", "pending", "someone else has to approve"),
        ("unknown_gate", "unknown", "unknown"),
        ("expired", "expired", "expired before your click"),
        ("already_decided", "expired", "has expired"),
        ("already_decided", "denied", "already denied by boss"),
    ],
)
def test_every_refusal_reason_has_its_own_ephemeral_text(reason: str, status: str, expected: str) -> None:
    from adapters.discord._render import refusal_text

    assert expected in refusal_text(reason, status, "boss" if status == "denied" else None)
