"""The Slack adapter's parts in one process: configuration, signatures, what streams, the transport's edge
cases against the fake Slack, and an in-process adapter run (no secrets in logs, nothing left running)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slack_sdk.web.async_client import AsyncWebClient

from adapters.base import Adapter
from adapters.bridge import Bridge, DeleteRefused, GateView, MessageGone, Place, RateGovernor, RetryLater
from adapters.bridge.text import render_partial, split_text
from adapters.redact import install_log_redaction
from adapters.slack import SlackConfigError, SlackOptions, SlackTransport, create, signature_valid
from adapters.slack import transport as slack_transport
from adapters.slack._api import SlackPermanentError
from adapters.slack.blocks import action_id, approval_blocks, fallback_text, parse_action
from adapters.slack.directory import Directory
from adapters.slack.safe_text import slack_text
from adapters.slack.testing import FakeSlack
from adapters.slack.transport import streamable
from harness_core import AgentChange, Extension, Harness, ModelRef, Models, Registry, ToolApi, tool
from harness_core.messages import AssistantMessage, ToolResultMessage, UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import FauxProvider, faux_assistant, faux_text, faux_tool_call
from harness_core.storage import MemoryStorage

ENV = {
    "SLACK_BOT_TOKEN": "xoxb-secret-bot",
    "SLACK_APP_TOKEN": "xapp-secret-app",
    "SLACK_SIGNING_SECRET": "s3cr3t",
}


# --- configuration ----------------------------------------------------------------------------------------------


def test_options_are_validated_and_errors_name_the_key() -> None:
    adapter = create({"mode": "http", "port": 0, "edit_interval": 1.2}, ENV)
    assert adapter.options.mode == "http" and adapter.options.edit_interval == 1.2
    assert isinstance(adapter, Adapter) and adapter.name == "slack"
    with pytest.raises(SlackConfigError, match=r"adapters\.slack\.prot"):
        create({"prot": 3000}, ENV)
    with pytest.raises(SlackConfigError, match=r"adapters\.slack\.port"):
        create({"port": "not a number"}, ENV)
    with pytest.raises(SlackConfigError, match=r"adapters\.slack\.max_chars"):
        create({"max_chars": 50_000}, ENV)
    with pytest.raises(SlackConfigError, match=r"adapters\.slack\.mode"):
        create({"mode": "rtm"}, ENV)
    assert create({}, ENV).options.ping_interval == 5.0  # slack-sdk's own default (bolt's handler uses 10)
    assert create({"ping_interval": 0.5}, ENV).options.ping_interval == 0.5
    for bad in (0, 0.05, 61, "often"):
        with pytest.raises(SlackConfigError, match=r"adapters\.slack\.ping_interval"):
            create({"ping_interval": bad}, ENV)


def test_secrets_come_only_from_the_environment_and_never_show() -> None:
    with pytest.raises(SlackConfigError, match="SLACK_BOT_TOKEN"):
        create({}, {"SLACK_APP_TOKEN": "xapp-1"})
    with pytest.raises(SlackConfigError, match="SLACK_APP_TOKEN"):
        create({"mode": "socket"}, {"SLACK_BOT_TOKEN": "xoxb-1"})
    with pytest.raises(SlackConfigError, match="SLACK_SIGNING_SECRET") as refused:
        create({"mode": "http"}, {"SLACK_BOT_TOKEN": "xoxb-secret-bot"})
    assert "xoxb-secret-bot" not in str(refused.value)
    with pytest.raises(SlackConfigError, match=r"adapters\.slack\.bot_token"):
        create({"bot_token": "xoxb-in-the-config-file"}, ENV)  # not a config key: secrets live in the env
    adapter = create({}, {**ENV, "SLACK_API_URL": "http://127.0.0.1:9/api"})
    assert adapter._secrets.api_url == "http://127.0.0.1:9/api/"
    assert "secret" not in repr(adapter) and "secret" not in repr(adapter._secrets)


def test_request_signatures_are_checked_over_the_raw_bytes() -> None:
    now = time.time()
    body = b'{"type":"event_callback"}'
    stamp = str(int(now))
    good = "v0=" + hmac.new(b"s3cr3t", b"v0:" + stamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    assert signature_valid("s3cr3t", body, stamp, good, now)
    assert not signature_valid("other", body, stamp, good, now)
    assert not signature_valid("s3cr3t", body + b" ", stamp, good, now)
    assert not signature_valid("s3cr3t", body, stamp, good, now + 301)  # replay window: 5 minutes
    assert not signature_valid("s3cr3t", body, "yesterday", good, now)
    assert not signature_valid("s3cr3t", body, None, good, now)
    assert not signature_valid("s3cr3t", b"\xff\xfe", stamp, good, now)  # not UTF-8: no crash


def test_what_streams_is_the_model_text_before_the_bridges_typing_marker() -> None:
    def live(text: str, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        message = {"content": [{"type": "text", "text": text}]} if text else None
        return {"generation": {"message": message}, "tools": tools or []}

    assert streamable(render_partial(live(""), [])) == ""  # the placeholder: start an empty stream
    assert streamable(render_partial(live("Hello wor"), [])) == "Hello wor"
    waiting = render_partial(live("Deploying …", [{"name": "deploy", "status": "pending"}]), ["deploy"])
    assert streamable(waiting) == "Deploying …"  # the model's own ellipsis stays; the status line does not
    assert streamable(render_partial(live("", [{"name": "deploy", "status": "running"}]), [])) is None
    assert streamable("a final answer") is None


# --- the transport against the fake -----------------------------------------------------------------------------


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as running:
        yield running


@pytest.fixture
async def client(fake: FakeSlack) -> AsyncIterator[AsyncWebClient]:
    web = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url, retry_handlers=[])
    yield web
    if web.session is not None:
        await web.session.close()


def transport_for(fake: FakeSlack, client: AsyncWebClient, **options: Any) -> SlackTransport:
    governor = RateGovernor()
    directory = Directory(client, governor, user_ttl=60, group_ttl=60, lookup_timeout=2)
    return SlackTransport(
        client,
        options=SlackOptions(**options),
        directory=directory,
        governor=governor,
        team_id=fake.team_id,
        bot_user_id=fake.bot_user_id,
        bot_id=fake.bot_id,
    )


async def test_posts_carry_their_key_and_are_found_by_it(fake: FakeSlack, client: AsyncWebClient) -> None:
    general = fake.add_channel("general")
    alice = fake.add_user("UALICE", name="alice")
    parent = fake.seed_message(general, "a question", user=alice)
    transport = transport_for(fake, client)
    channel = Place("slack", fake.team_id, general.id)
    thread = channel.in_thread(parent.ts)
    top = await transport.create(channel, "top", "reply:1#0")
    inside = await transport.create(thread, "inside", "reply:2#0")  # nobody to stream to in a channel: posted
    fake.seed_message(
        general, "someone else's", user=alice, metadata={"event_type": "x", "event_payload": {}}
    )
    assert await transport.find(channel, "reply:1#0") == top
    assert await transport.find(thread, "reply:2#0") == inside
    assert await transport.find(channel, "reply:2#0") is None
    assert await transport.find(thread, "reply:9#0") is None  # no bridge: no orphan adoption either
    assert fake.message(general, inside).event_payload == {"key": "reply:2#0"}
    await transport.edit(channel, top, "top, edited", "reply:1#0", final=True)
    assert fake.message(general, top).text == "top, edited"
    assert fake.message(general, top).event_payload == {"key": "reply:1#0"}


async def test_platform_errors_become_the_bridges_errors(fake: FakeSlack, client: AsyncWebClient) -> None:
    general = fake.add_channel("general")
    transport = transport_for(fake, client)
    channel = Place("slack", fake.team_id, general.id)
    fake.rate_limit("chat.postMessage", retry_after=3)
    with pytest.raises(RetryLater) as limited:
        await transport.create(channel, "hi", "reply:1#0")
    assert limited.value.seconds == 3
    fake.rate_limit("chat.postMessage", retry_after=2, status=200)  # the ok:false variant, no HTTP 429
    with pytest.raises(RetryLater):
        await transport.create(channel, "hi", "reply:1#0")
    ts = await transport.create(channel, "hi", "reply:1#0")
    await fake.user_deletes(general, ts, deliver=False)
    with pytest.raises(MessageGone):
        await transport.edit(channel, ts, "again", "reply:1#0", final=True)
    gate = GateView(
        7, "deploy", {"service": "api"}, "UALICE", "alice", "approved", "boss", 1_700_000_000_000, 0
    )
    await transport.update_approval(channel, ts, gate)  # gone: nothing to show it on, and no endless retry


async def test_delete_removes_a_part_repeats_harmlessly_and_reports_a_refusal(
    fake: FakeSlack, client: AsyncWebClient
) -> None:
    general = fake.add_channel("general")
    alice = fake.add_user("UALICE", name="alice")
    transport = transport_for(fake, client)
    channel = Place("slack", fake.team_id, general.id)
    ts = await transport.create(channel, "old tail", "reply:1#1")
    await transport.delete(channel, ts, "reply:1#1")
    assert fake.message(general, ts).deleted
    await transport.delete(channel, ts, "reply:1#1")  # repeated after a crash: already gone is no error
    assert await transport.find(channel, "reply:1#1") is None
    theirs = fake.seed_message(general, "not ours", user=alice)
    with pytest.raises(DeleteRefused):  # the bridge blanks such a part instead
        await transport.delete(channel, theirs.ts, "reply:1#2")
    assert len(fake.calls_to("chat.delete")) == 3


async def test_answer_text_never_mentions_or_broadcasts(fake: FakeSlack, client: AsyncWebClient) -> None:
    general = fake.add_channel("general")
    transport = transport_for(fake, client)
    channel = Place("slack", fake.team_id, general.id)
    quoted = "mallory said <!channel> <!here|here> <@U0BOSS> & @everyone: see <https://evil.test|docs>"
    shown = (
        "mallory said &lt;!channel&gt; &lt;!here|here&gt; &lt;@U0BOSS&gt; &amp; @\u2060everyone: "
        "see &lt;https://evil.test|docs&gt;"
    )
    ts = await transport.create(channel, quoted, "reply:1#0", final=True)
    assert fake.message(general, ts).text == shown
    await transport.edit(channel, ts, quoted + " (edited)", "reply:1#0", final=True)
    assert fake.message(general, ts).text == shown + " (edited)"
    for call in fake.calls_to("chat.postMessage") + fake.calls_to("chat.update"):
        assert "<!" not in str(call.args) and "<@" not in str(call.args)
    gate = GateView(7, "deploy", {"note": "<!channel>"}, None, "<!everyone> eve", "pending", None, None, 0)
    assert "<!" not in fallback_text(gate) and "<!" not in str(approval_blocks(gate))


async def test_after_a_restart_a_top_level_message_is_updated_without_a_stop_stream_first(
    fake: FakeSlack, client: AsyncWebClient
) -> None:
    general = fake.add_channel("general")
    alice = fake.add_user("UALICE", name="alice")
    parent = fake.seed_message(general, "a question", user=alice)
    channel = Place("slack", fake.team_id, general.id)
    thread = channel.in_thread(parent.ts)
    before = transport_for(fake, client)
    top = await before.create(channel, "partial …", "reply:1#0")
    inside = await before.create(thread, "partial …", "reply:2#0")
    after = transport_for(fake, client)  # the restarted process knows neither message
    await after.edit(channel, top, "final", "reply:1#0", final=True)
    assert [c.method for c in fake.calls if c.method.startswith("chat.")][-1:] == ["chat.update"]
    assert fake.calls_to("chat.stopStream") == []  # only thread replies ever stream
    await after.edit(thread, inside, "final", "reply:2#0", final=True)
    assert len(fake.calls_to("chat.stopStream")) == 1  # a thread reply may be a stream a crash left open
    assert fake.message(general, top).text == "final"


class _Requests:
    """A bridge stand-in for `SlackTransport`: the reply of submission 1 is in progress, asked by alice."""

    class harness:
        @staticmethod
        async def submission(submission_id: int) -> Any:
            return type("Handle", (), {"record": type("Record", (), {"status": "placed"})()})()

        @staticmethod
        async def snapshot(definition: Any, key: str | None = None) -> Any:
            return {"requester": {"user_id": "UALICE", "user_name": "alice"}, "parts": []}

        @staticmethod
        async def family(definition: Any) -> dict[str, Any]:
            return {}


async def test_a_stream_that_expires_or_is_refused_falls_back_to_updates(
    fake: FakeSlack, client: AsyncWebClient
) -> None:
    general = fake.add_channel("general")
    alice = fake.add_user("UALICE", name="alice")
    parent = fake.seed_message(general, "tell me", user=alice)
    transport = transport_for(fake, client)
    transport.bridge = _Requests()  # type: ignore[assignment]
    thread = Place("slack", fake.team_id, general.id, parent.ts)
    ts = await transport.create(thread, "Once upon …", "reply:1#0", requester="UALICE")
    await transport.edit(thread, ts, "Once upon a time …", "reply:1#0", final=False)
    assert fake.message(general, ts).text == "Once upon a time" and fake.message(general, ts).streaming
    fake.expire_stream(general, ts)
    await transport.edit(thread, ts, "Once upon a time there …", "reply:1#0", final=False)
    await transport.edit(thread, ts, "Once upon a time there was a bot.", "reply:1#0", final=True)
    message = fake.message(general, ts)
    assert message.text == "Once upon a time there was a bot." and not message.streaming
    assert message.event_payload == {"key": "reply:1#0"}
    assert [c.method for c in fake.calls if c.method.startswith("chat.")] == [
        "chat.startStream",
        "chat.appendStream",
        "chat.appendStream",  # refused: message_not_in_streaming_state
        "chat.stopStream",  # nothing to stop, but it would have stamped the key
        "chat.update",
        "chat.update",
    ]

    placeholder = await transport.create(
        thread, "…", "reply:1#2", requester="UALICE"
    )  # before the first token
    start = fake.calls[-1]
    assert (start.method, "markdown_text" in start.args) == ("chat.startStream", False)
    assert start.args["recipient_user_id"] == "UALICE" and start.args["recipient_team_id"] == fake.team_id
    await transport.edit(thread, placeholder, "Twice …", "reply:1#2", final=False)
    assert fake.message(general, placeholder).text == "Twice"

    fake.fail("chat.startStream", "feature_not_enabled")
    other = await transport.create(thread, "Another …", "reply:1#1", requester="UALICE")
    assert fake.message(general, other).event_payload == {"key": "reply:1#1"}  # posted instead
    assert [c.method for c in fake.calls[-2:]] == ["chat.startStream", "chat.postMessage"]


async def test_display_names_are_looked_up_once_and_a_failure_does_not_block(
    fake: FakeSlack, client: AsyncWebClient
) -> None:
    fake.add_user("UALICE", name="alice", display_name="Alice A.")
    directory = Directory(client, RateGovernor(), user_ttl=60, group_ttl=60, lookup_timeout=2)
    names = await asyncio.gather(*(directory.name("UALICE") for _ in range(5)))
    assert names == ["Alice A."] * 5
    assert len(fake.calls_to("users.info")) == 1
    assert await directory.name("UNOBODY", fallback="nobody") == "nobody"
    fake.add_usergroup("oncall", ["UALICE"], group_id="SONCALL")
    assert await directory.groups_of("UALICE", ["SONCALL", "SMISSING"]) == ["SONCALL"]
    assert await directory.groups_of("UBOB", ["SONCALL"]) == []
    assert len(fake.calls_to("usergroups.users.list")) == 2  # cached since


def _is_fake(task: asyncio.Task[Any]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    filename = getattr(code, "co_filename", "")
    return "/adapters/slack/_fake_" in filename or filename.endswith("/adapters/slack/testing.py")


def test_approval_blocks_encode_the_gate_and_show_the_decision() -> None:
    pending = GateView(
        42, "deploy", {"service": "api", "note": "x" * 5000}, "UALICE", "alice", "pending", None, None, 1
    )
    blocks = approval_blocks(pending)
    actions = [b for b in blocks if b["type"] == "actions"]
    assert [e["action_id"] for e in actions[0]["elements"]] == [
        "durable_bots_gate:approve:42",
        "durable_bots_gate:deny:42",
        "durable_bots_gate:withdraw:42",
    ]
    assert [e["value"] for e in actions[0]["elements"]] == ["42", "42", "42"]
    assert all(len(b["text"]["text"]) <= 3000 for b in blocks if b["type"] == "section")
    assert parse_action("durable_bots_gate:deny:42") == ("deny", 42)
    assert parse_action("durable_bots_gate:withdraw:42") == ("withdraw", 42)
    assert parse_action("someone_elses_button") is None
    for status, shown in (
        ("approved", "Approved by boss"),
        ("denied", "Denied by boss"),
        ("expired", "Expired"),
    ):
        decided = GateView(42, "deploy", {}, "UALICE", "alice", status, "boss", 1_700_000_000_000, 1)
        rendered = approval_blocks(decided)
        assert not [b for b in rendered if b["type"] == "actions"]
        assert shown in rendered[-1]["elements"][0]["text"]


# --- the whole adapter in this process --------------------------------------------------------------------------


async def test_adapter_in_process_answers_logs_no_secret_and_leaves_nothing_running(
    fake: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    install_log_redaction()  # what the bots runtime does before anything logs
    caplog.set_level(logging.DEBUG)
    general = fake.add_channel("general")
    alice = fake.add_user("UALICE", name="alice")
    faux = FauxProvider()
    faux.set_responder(
        lambda r: faux_assistant("re " + [user_text(m) for m in r.messages if isinstance(m, UserMessage)][-1])
    )
    registry = Registry()
    harness = await Harness.open(await MemoryStorage.open(), models=Models(faux), registry=registry)
    bridge = Bridge(harness, agent=AgentChange(model=ModelRef(provider="faux", model_id="m")))
    registry.install(bridge.extension())
    adapter = create({"mode": "socket"}, fake.env)
    before = asyncio.all_tasks()
    await bridge.start()
    await adapter.start(bridge)
    harness.resume()
    post = await fake.user_posts(general, alice, f"<@{fake.bot_user_id}> hi")
    await post.wait_acked()
    await fake.wait_for_message(general, contains="re alice", timeout=10)
    await adapter.stop()
    await bridge.stop()
    await harness.close()
    await asyncio.sleep(0)
    leftover = [t for t in asyncio.all_tasks() - before if not t.done() and not _is_fake(t)]
    assert leftover == [], leftover
    logged = caplog.text
    assert logged  # debug logging was on
    for secret in (fake.bot_token, fake.app_token, fake.signing_secret):
        assert secret not in logged
    # slack-sdk logs the Socket Mode URL at DEBUG; its ticket opens a connection: masked.
    assert "/link/?ticket=***&app_id=***" in logged
    assert re.search(r"ticket=(?!\*\*\*)", logged) is None


async def test_catch_up_covers_member_channels_without_a_place_back_to_the_first_start(
    fake: FakeSlack,
) -> None:
    general = fake.add_channel("general")
    incidents = fake.add_channel("incidents")  # the bot is a member; nobody talked to it there yet
    fake.add_channel("elsewhere", bot_is_member=False)
    alice = fake.add_user("UALICE", name="alice")
    mention = f"<@{fake.bot_user_id}>"
    fake.seed_message(incidents, f"{mention} from before the bot ever ran", user=alice)
    faux = FauxProvider()
    faux.set_responder(
        lambda r: faux_assistant("re " + [user_text(m) for m in r.messages if isinstance(m, UserMessage)][-1])
    )
    registry = Registry()
    harness = await Harness.open(await MemoryStorage.open(), models=Models(faux), registry=registry)
    bridge = Bridge(harness, agent=AgentChange(model=ModelRef(provider="faux", model_id="m")))
    registry.install(bridge.extension())
    await bridge.start()
    harness.resume()
    first = create({"mode": "socket"}, fake.env)
    await first.start(bridge)
    assert first.catch_up_summary == "caught up 0 message(s) in 2 channel(s)"  # general + incidents
    await first.stop()

    # While the bot is down: a mention in a channel that has no place yet.
    fake.seed_message(incidents, f"{mention} is the api down?", user=alice)
    limited = fake.rate_limit("users.conversations", retry_after=1)  # waited out, not a channel skipped
    second = create({"mode": "socket"}, fake.env)
    await second.start(bridge)
    try:
        assert second.catch_up_summary == "caught up 1 message(s) in 2 channel(s)"
        answer = await fake.wait_for_message(incidents, contains="is the api down?", timeout=10)
        assert answer.text.startswith("re alice: ")
        assert not [m for m in fake.bot_messages(incidents) if "from before" in m.text]
        assert not fake.bot_messages(general)
        listed = {c.args.get("types") for c in fake.calls_to("users.conversations")}
        assert listed == {"public_channel", "private_channel", "im", "mpim"}
        assert len(limited.hits) == 1
    finally:
        await second.stop()
        await bridge.stop()
        await harness.close()


async def test_parts_a_shorter_final_answer_no_longer_needs_are_deleted_on_slack(fake: FakeSlack) -> None:
    general = fake.add_channel("general")
    alice = fake.add_user("UALICE", name="alice")
    release = asyncio.Event()

    @tool
    async def lookup(api: ToolApi) -> str:
        """Waits until the test saw the partial in several messages."""
        await release.wait()
        return "found"

    def respond(request: ModelRequest) -> AssistantMessage:
        if isinstance(request.messages[-1], ToolResultMessage):
            return faux_assistant("Short final answer.")
        long = " ".join(f"word{i}" for i in range(400))  # ~3,000 characters: three 1,000-character parts
        return faux_assistant([faux_text(long), faux_tool_call("lookup", {}, id="l1")])

    faux = FauxProvider(chunk_size=100, delay_ms=40)
    faux.set_responder(respond)
    registry = Registry()
    harness = await Harness.open(await MemoryStorage.open(), models=Models(faux), registry=registry)
    bridge = Bridge(harness, agent=AgentChange(model=ModelRef(provider="faux", model_id="m")))
    registry.install(bridge.extension())
    registry.install(Extension("tools", tools=[lookup]))
    adapter = create({"mode": "socket", "max_chars": 1000, "edit_interval": 0.05}, fake.env)
    await bridge.start()
    await adapter.start(bridge)
    harness.resume()
    try:
        await fake.user_posts(general, alice, f"<@{fake.bot_user_id}> look it up")
        await fake.wait_for(lambda: len(fake.bot_messages(general)) >= 2, 20)
        release.set()
        await fake.wait_for(
            lambda: [m.text for m in fake.bot_messages(general)] == ["Short final answer."], 20
        )
        deleted = {c.args.get("ts") for c in fake.calls_to("chat.delete")}
        assert deleted and all(fake.message(general, str(ts)).deleted for ts in deleted)
    finally:
        await adapter.stop()
        await bridge.stop()
        await harness.close()


async def test_a_refused_app_token_fails_the_start_loudly_instead_of_retrying_forever(
    fake: FakeSlack,
) -> None:
    """slack-sdk's own connect loop would ask apps.connections.open again every few seconds, for ever."""
    registry = Registry()
    harness = await Harness.open(await MemoryStorage.open(), models=Models(FauxProvider()), registry=registry)
    bridge = Bridge(harness, agent=AgentChange(model=ModelRef(provider="faux", model_id="m")))
    registry.install(bridge.extension())
    adapter = create({"mode": "socket", "catch_up": False}, {**fake.env, "SLACK_APP_TOKEN": "xapp-revoked"})
    await bridge.start()
    try:
        with pytest.raises(SlackPermanentError) as refused:
            await asyncio.wait_for(adapter.start(bridge), 10)
    finally:
        await bridge.stop()
        await harness.close()
    assert refused.value.method == "apps.connections.open"
    assert "invalid_auth" in str(refused.value) and "SLACK_APP_TOKEN" in str(refused.value)
    assert "xapp-revoked" not in str(refused.value)
    assert len(fake.calls_to("apps.connections.open")) == 1


@pytest.mark.parametrize(
    ("reason", "status", "expected"),
    [
        ("not_an_approver", "pending", "You are not an approver for `deploy`"),
        ("self_approval", "pending", "You cannot approve or deny your own request"),
        ("unknown_gate", "unknown", "not known"),
        ("expired", "expired", "expired before your click"),
        ("already_decided", "expired", "already expired"),
        ("already_decided", "approved", "already approved by boss"),
    ],
)
def test_every_refusal_reason_has_its_own_ephemeral_text(reason: str, status: str, expected: str) -> None:
    from adapters.bridge import Decision
    from adapters.slack.adapter import refusal_text

    decided_by = "boss" if status == "approved" else None
    assert expected in refusal_text(Decision(False, status, decided_by, reason), "deploy")


async def test_stop_during_a_reconnect_leaves_no_task_running(
    fake: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """A `disconnect` frame is handled in a task slack-sdk keeps no reference to (and `close()` does not
    cancel). While apps.connections.open fails, that task waits out the adapter's backoff; stop() must end it,
    not leave it running past the adapter (to call Slack on a closed session later)."""
    caplog.set_level(logging.INFO, logger="adapters.slack")
    registry = Registry()
    harness = await Harness.open(await MemoryStorage.open(), models=Models(FauxProvider()), registry=registry)
    bridge = Bridge(harness, agent=AgentChange(model=ModelRef(provider="faux", model_id="m")))
    registry.install(bridge.extension())
    adapter = create({"mode": "socket", "catch_up": False, "ping_interval": 5}, fake.env)
    before = asyncio.all_tasks()
    await bridge.start()
    await adapter.start(bridge)
    fake.fail("apps.connections.open", "internal_error", times=1)
    await fake.disconnect(reason="refresh_requested", close_after=None)
    await fake.wait_for(lambda: len(fake.calls_to("apps.connections.open")) == 2, 10)
    await fake.disconnect(reason="refresh_requested", close_after=None)  # the next ask waits >= 5 s first
    for _ in range(50):
        if "retrying in" in caplog.text:
            break
        await asyncio.sleep(0.02)
    assert "retrying in" in caplog.text
    await adapter.stop()
    await bridge.stop()
    await harness.close()
    await asyncio.sleep(0)
    leftover = [t for t in asyncio.all_tasks() - before if not t.done() and not _is_fake(t)]
    for task in leftover:
        task.cancel()
    assert leftover == [], leftover
    assert len(fake.calls_to("apps.connections.open")) == 2


def test_the_reconnect_backoff_doubles_and_never_passes_its_cap_even_with_jitter() -> None:
    from adapters.slack._socket import BACKOFF_CAP, backoff_delay

    assert [backoff_delay(n, 5.0, 0.0) for n in (1, 2, 3, 4)] == [5.0, 10.0, 20.0, 40.0]
    assert backoff_delay(2, 5.0, 0.999) > backoff_delay(2, 5.0, 0.0)  # jittered upward
    assert backoff_delay(1, 50.0, 0.999) == BACKOFF_CAP  # 50 s plus a quarter would pass the cap
    assert backoff_delay(30, 5.0, 0.5) == BACKOFF_CAP


async def test_the_memory_of_plain_messages_is_bounded_and_a_forgotten_one_is_still_edited(
    fake: FakeSlack, client: AsyncWebClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slack_transport, "_PLAIN_MEMORY", 3, raising=False)
    general = fake.add_channel("general")
    transport = transport_for(fake, client)
    channel = Place("slack", fake.team_id, general.id)
    posted = [await transport.create(channel, f"answer {n}", f"reply:{n}#0", final=True) for n in range(10)]
    assert len(transport._plain) == 3  # was one per message posted, for ever
    await transport.edit(channel, posted[0], "answer 0, edited", "reply:0#0", final=True)  # long forgotten
    assert fake.message(general, posted[0]).text == "answer 0, edited"


NEAR_MISSES = st.builds(
    lambda verb, tail: f"durable_bots_gate:{verb}:{tail}",
    st.sampled_from(["approve", "deny", "withdraw", "Approve", "", "approve:1"]),
    st.text(max_size=12),
)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=80), NEAR_MISSES))
def test_parse_action_takes_only_its_own_action_ids_whatever_a_click_carries(raw: str) -> None:
    parsed = parse_action(raw)
    if parsed is not None:
        verb, gate = parsed
        head, _, digits = raw.rpartition(":")
        assert head == f"durable_bots_gate:{verb}" and digits.isdigit() and int(digits) == gate


@given(st.sampled_from(["approve", "deny", "withdraw"]), st.integers(min_value=0, max_value=2**53))
def test_action_ids_round_trip(verb: str, gate: int) -> None:
    assert parse_action(action_id(verb, gate)) == (verb, gate)


def test_gate_groups_are_looked_up_by_their_bare_slack_id() -> None:
    from adapters.slack.adapter import slack_group_ids

    entries = ["slack:SONCALL", "SBARE", "discord:123", "devchat:ops", "slack:SONCALL"]
    assert slack_group_ids(entries) == ["SONCALL", "SBARE"]
    assert slack_group_ids(None) == []


@pytest.mark.parametrize(
    ("text", "limit"),
    [("```channelchannel", 16), ("```\n" + "&" * 40, 16), ("```python\n" + "x " * 60, 20)],
)
def test_split_text_always_ends_when_a_part_starts_with_a_fence(text: str, limit: int) -> None:
    """A part that reopens a code fence must carry more than the reopening line; these looped for ever,
    appending the same part until memory ran out (found by the property test below)."""
    for measure in (len, lambda part: len(slack_text(part))):
        parts = split_text(text, limit, measure)
        assert len(parts) <= len(text) and all(measure(part) <= limit for part in parts), parts


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(st.sampled_from([*"ab &<>@\n`", "channel", "```", "```python\n"]), max_size=300).map(
        "".join
    ),
    limit=st.integers(min_value=16, max_value=120),
)
def test_split_parts_fit_the_limit_once_escaped_for_slack(text: str, limit: int) -> None:
    """Escaping grows `&<>` up to five times: a part is cut by its escaped length, and nothing is lost."""
    parts = split_text(text, limit, lambda part: len(slack_text(part)))
    assert all(len(slack_text(part)) <= limit for part in parts)
    if "```" not in text:  # fences are closed and reopened across parts
        assert "".join(parts).replace("\n", "").replace(" ", "") == text.replace("\n", "").replace(" ", "")


async def test_catch_up_of_a_new_channel_stops_at_the_look_back_bound(fake: FakeSlack) -> None:
    """`catch_up_hours` bounds how far back a channel without a place is read: a mention older than the bound
    (but after the first start) is left alone, one inside it is answered."""
    incidents = fake.add_channel("incidents")
    alice = fake.add_user("UALICE", name="alice")
    mention = f"<@{fake.bot_user_id}>"
    faux = FauxProvider()
    faux.set_responder(
        lambda r: faux_assistant("re " + [user_text(m) for m in r.messages if isinstance(m, UserMessage)][-1])
    )
    registry = Registry()
    harness = await Harness.open(await MemoryStorage.open(), models=Models(faux), registry=registry)
    bridge = Bridge(harness, agent=AgentChange(model=ModelRef(provider="faux", model_id="m")))
    registry.install(bridge.extension())
    await bridge.start()
    harness.resume()
    bound_seconds = 2.0  # longer than the second start takes to read, on a loaded machine too
    options = {"mode": "socket", "catch_up_hours": bound_seconds / 3600}
    first = create(options, fake.env)
    await first.start(bridge)
    await first.stop()
    fake.seed_message(incidents, f"{mention} too old to catch up", user=alice)
    await asyncio.sleep(bound_seconds + 0.5)  # the first mention is now past the look-back bound
    fake.seed_message(incidents, f"{mention} recent enough", user=alice)
    second = create(options, fake.env)
    await second.start(bridge)
    try:
        assert second.catch_up_summary == "caught up 1 message(s) in 1 channel(s)"
        await fake.wait_for_message(incidents, contains="recent enough", timeout=10)
        assert not [m for m in fake.bot_messages(incidents) if "too old" in m.text]
    finally:
        await second.stop()
        await bridge.stop()
        await harness.close()
