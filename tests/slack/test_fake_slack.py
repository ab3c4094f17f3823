"""The loopback fake Slack, exercised with the real slack-sdk and slack-bolt."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.testing import DROP, Channel, FakeSlack, RecordedCall, Respond, User


@dataclass
class Workspace:
    fake: FakeSlack
    general: Channel
    alice: User
    bob: User


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as running:
        yield running


@pytest.fixture
def ws(fake: FakeSlack) -> Workspace:
    general = fake.add_channel("general")
    alice = fake.add_user("UALICE", name="alice", display_name="Alice")
    bob = fake.add_user("UBOB", name="bob", display_name="Bob")
    return Workspace(fake, general, alice, bob)


@pytest.fixture
def client(fake: FakeSlack) -> AsyncWebClient:
    return AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)


SocketConnector = Callable[[AsyncApp], Awaitable[AsyncSocketModeHandler]]


@pytest.fixture
async def connect_socket(fake: FakeSlack) -> AsyncIterator[SocketConnector]:
    """Connect a bolt app to the fake over Socket Mode (closed at teardown)."""
    handlers: list[AsyncSocketModeHandler] = []

    async def connect(app: AsyncApp) -> AsyncSocketModeHandler:
        handler = AsyncSocketModeHandler(app, app_token=fake.app_token)
        handlers.append(handler)
        before = len(fake.connections)
        await handler.connect_async()
        await fake.wait_for(lambda: len(fake.connections) > before and fake.connections[-1].open)
        return handler

    yield connect
    for handler in handlers:
        await handler.close_async()


HttpServer = Callable[[AsyncApp], Awaitable[str]]


@pytest.fixture
async def serve_http() -> AsyncIterator[HttpServer]:
    """Serve a bolt app over HTTP on 127.0.0.1 (the way an adapter would: raw request -> async_dispatch)."""
    runners: list[web.AppRunner] = []

    async def serve(app: AsyncApp) -> str:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                bolt_request = await to_bolt_request(request)
            except ValueError:  # malformed body: bolt's adapter would answer 500
                return web.json_response({"error": "malformed body"}, status=400)
            return await to_aiohttp_response(await app.async_dispatch(bolt_request))

        web_app = web.Application()
        web_app.router.add_post("/slack/events", handle)
        runner = web.AppRunner(web_app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/slack/events"

    yield serve
    for runner in runners:
        await runner.cleanup()


APPROVE_BLOCKS: list[dict[str, Any]] = [
    {"type": "section", "block_id": "gate", "text": {"type": "mrkdwn", "text": "Deploy to prod?"}},
    {
        "type": "actions",
        "block_id": "gate-actions",
        "elements": [
            {
                "type": "button",
                "action_id": "approve",
                "text": {"type": "plain_text", "text": "Approve"},
                "value": "gate-7",
                "style": "primary",
            },
            {
                "type": "button",
                "action_id": "deny",
                "text": {"type": "plain_text", "text": "Deny"},
                "value": "gate-7",
            },
        ],
    },
]


# ------------------------------------------------------------------------------------------------ Web API


async def test_post_update_and_read_history_with_metadata(ws: Workspace, client: AsyncWebClient) -> None:
    fake = ws.fake
    metadata = {"event_type": "durable_bots.entry", "event_payload": {"entry_id": 42}}
    posted = await client.chat_postMessage(
        channel=ws.general.id, text="working on it", blocks=APPROVE_BLOCKS, metadata=metadata
    )
    ts = posted["ts"]
    assert posted["message"]["bot_id"] == fake.bot_id
    assert posted["message"]["user"] == fake.bot_user_id

    updated = await client.chat_update(channel=ws.general.id, ts=ts, text="done", blocks=[])
    assert updated["message"]["edited"]["user"] == fake.bot_user_id

    plain = await client.conversations_history(channel=ws.general.id)
    assert [m["text"] for m in plain["messages"]] == ["done"]
    assert "metadata" not in plain["messages"][0]
    assert "blocks" not in plain["messages"][0]

    with_meta = await client.conversations_history(channel=ws.general.id, include_all_metadata=True)
    assert with_meta["messages"][0]["metadata"] == metadata

    stored = fake.message(ws.general, ts)
    assert stored.text == "done"
    assert stored.event_payload == {"entry_id": 42}
    assert [r.text for r in stored.revisions] == ["working on it"]
    assert stored.revisions[0].blocks == APPROVE_BLOCKS
    assert [c.method for c in fake.calls] == [
        "chat.postMessage",
        "chat.update",
        *["conversations.history"] * 2,
    ]


async def test_ts_values_are_slack_shaped_and_increase(ws: Workspace, client: AsyncWebClient) -> None:
    stamps = [(await client.chat_postMessage(channel=ws.general.id, text=str(i)))["ts"] for i in range(5)]
    for ts in stamps:
        seconds, dot, micros = ts.partition(".")
        assert dot == "."
        assert seconds.isdigit()
        assert len(micros) == 6
        assert micros.isdigit()
    assert stamps == sorted(stamps, key=float)
    assert len(set(stamps)) == 5


async def test_threads_replies_paging_and_time_window(ws: Workspace, client: AsyncWebClient) -> None:
    fake = ws.fake
    parent = await fake.user_posts(ws.general, ws.alice, "parent", deliver=False)
    reply_ts = []
    for i in range(5):
        reply = await client.chat_postMessage(channel=ws.general.id, thread_ts=parent.ts, text=f"r{i}")
        reply_ts.append(reply["ts"])
    broadcast = await client.chat_postMessage(
        channel=ws.general.id, thread_ts=parent.ts, text="also in channel", reply_broadcast=True
    )
    # a reply to a reply lands in the same (single-level) thread
    nested = await client.chat_postMessage(channel=ws.general.id, thread_ts=reply_ts[0], text="nested")
    assert nested["message"]["thread_ts"] == parent.ts

    history = await client.conversations_history(channel=ws.general.id)
    assert [m["text"] for m in history["messages"]] == ["also in channel", "parent"]
    top = history["messages"][1]
    assert top["reply_count"] == 7
    assert top["thread_ts"] == parent.ts

    texts: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await client.conversations_replies(channel=ws.general.id, ts=parent.ts, limit=3, cursor=cursor)
        texts += [m["text"] for m in page["messages"]]
        pages += 1
        cursor = page["response_metadata"]["next_cursor"]
        if not page["has_more"]:
            assert cursor == ""
            break
    assert pages == 3
    assert texts == ["parent", "r0", "r1", "r2", "r3", "r4", "also in channel", "nested"]

    window = await client.conversations_replies(
        channel=ws.general.id, ts=parent.ts, oldest=reply_ts[1], latest=reply_ts[3], inclusive=True
    )
    assert [m["text"] for m in window["messages"]] == ["parent", "r1", "r2", "r3"]
    exclusive = await client.conversations_replies(
        channel=ws.general.id, ts=parent.ts, oldest=reply_ts[1], latest=reply_ts[3]
    )
    assert [m["text"] for m in exclusive["messages"]] == ["parent", "r2"]
    assert broadcast["message"]["subtype"] == "thread_broadcast"


async def test_history_paging_newest_first_with_oldest(ws: Workspace, client: AsyncWebClient) -> None:
    stamps = [(await client.chat_postMessage(channel=ws.general.id, text=f"m{i}"))["ts"] for i in range(7)]
    first = await client.conversations_history(channel=ws.general.id, limit=4, oldest=stamps[1])
    assert [m["text"] for m in first["messages"]] == ["m6", "m5", "m4", "m3"]
    assert first["has_more"] is True
    second = await client.conversations_history(
        channel=ws.general.id, limit=4, oldest=stamps[1], cursor=first["response_metadata"]["next_cursor"]
    )
    assert [m["text"] for m in second["messages"]] == ["m2"]
    assert second["has_more"] is False
    with pytest.raises(SlackApiError) as bad:
        await client.conversations_history(channel=ws.general.id, cursor="not-a-cursor")
    assert bad.value.response["error"] == "invalid_cursor"


async def test_form_encoded_and_json_bodies_are_both_understood(
    ws: Workspace, client: AsyncWebClient
) -> None:
    fake = ws.fake
    metadata = {"event_type": "t", "event_payload": {"k": "v"}}
    form = await client.api_call(
        "chat.postMessage",
        data={
            "channel": ws.general.id,
            "text": "form",
            "blocks": json.dumps(APPROVE_BLOCKS),
            "metadata": json.dumps(metadata),
        },
    )
    as_json = await client.api_call(
        "chat.postMessage", json={"channel": ws.general.id, "text": "json", "metadata": metadata}
    )
    token_in_body = AsyncWebClient(base_url=fake.api_url)
    await token_in_body.api_call(
        "chat.delete", data={"token": fake.bot_token, "channel": ws.general.id, "ts": as_json["ts"]}
    )

    calls = fake.calls_to("chat.postMessage")
    assert [c.content_type for c in calls] == ["form", "json"]
    assert fake.message(ws.general, form["ts"]).blocks == APPROVE_BLOCKS
    assert fake.message(ws.general, form["ts"]).metadata == metadata
    assert fake.message(ws.general, as_json["ts"]).deleted
    delete_call = fake.last_call("chat.delete")
    assert delete_call is not None
    assert delete_call.ok
    assert delete_call.token == fake.bot_token
    history = await client.conversations_history(channel=ws.general.id)
    assert fake.last_call("conversations.history") is not None
    assert fake.calls_to("conversations.history")[0].http_method == "GET"
    assert [m["text"] for m in history["messages"]] == ["form"]


async def test_tokens_are_checked(ws: Workspace) -> None:
    fake = ws.fake
    errors = []
    for token, method, kwargs in [
        ("xoxb-wrong", "chat.postMessage", {"channel": ws.general.id, "text": "x"}),
        (None, "auth.test", {}),
        (fake.app_token, "chat.postMessage", {"channel": ws.general.id, "text": "x"}),
        (fake.bot_token, "apps.connections.open", {}),
    ]:
        with pytest.raises(SlackApiError) as err:
            await AsyncWebClient(token=token, base_url=fake.api_url).api_call(method, json=kwargs)
        errors.append(err.value.response["error"])
    assert errors == ["invalid_auth", "not_authed", "not_allowed_token_type", "not_allowed_token_type"]
    assert fake.messages(ws.general) == []

    auth = await AsyncWebClient(token=fake.bot_token, base_url=fake.api_url).auth_test()
    assert (auth["user_id"], auth["bot_id"], auth["team_id"]) == (fake.bot_user_id, fake.bot_id, fake.team_id)
    opened = await AsyncWebClient(base_url=fake.api_url).apps_connections_open(app_token=fake.app_token)
    assert opened["url"].startswith("ws://127.0.0.1:")


async def test_arguments_are_validated_like_slack(ws: Workspace, client: AsyncWebClient) -> None:
    fake = ws.fake
    user_post = await fake.user_posts(ws.general, ws.alice, "mine", deliver=False)
    secret = fake.add_channel("secret", private=True, bot_is_member=False)
    outside = fake.add_channel("outside", bot_is_member=False)
    cases = [
        client.api_call("chat.postMessage", json={"channel": ws.general.id}),
        client.chat_postMessage(channel="CNOPE", text="x"),
        client.chat_postMessage(channel=secret.id, text="x"),
        client.chat_postMessage(channel=outside.id, text="x"),
        client.chat_postMessage(channel=ws.general.id, text="x", thread_ts="1.000001"),
        client.chat_postMessage(channel=ws.general.id, text="x", metadata={"event_type": "x"}),
        client.chat_update(channel=ws.general.id, ts=user_post.ts, text="hijack"),
        client.chat_delete(channel=ws.general.id, ts="1.000002"),
        client.conversations_replies(channel=ws.general.id, ts="1.000003"),
        client.users_info(user="UNOBODY"),
        client.usergroups_users_list(usergroup="SNOPE"),
        client.api_call("no.suchMethod"),
    ]
    errors = []
    for case in cases:
        with pytest.raises(SlackApiError) as err:
            await case
        errors.append(err.value.response["error"])
    assert errors == [
        "no_text",
        "channel_not_found",
        "channel_not_found",
        "not_in_channel",
        "invalid_thread_ts",
        "invalid_metadata_format",
        "cant_update_message",
        "message_not_found",
        "thread_not_found",
        "user_not_found",
        "no_such_subteam",
        "unknown_method",
    ]
    assert fake.message(ws.general, user_post.ts).text == "mine"


async def test_directory_methods_and_ephemeral(ws: Workspace, client: AsyncWebClient) -> None:
    fake = ws.fake
    group = fake.add_usergroup("deployers", [ws.alice, ws.bob])
    private = fake.add_channel("ops", private=True, members=[ws.alice])
    info = await client.users_info(user=ws.alice.id)
    assert info["user"]["profile"]["display_name"] == "Alice"
    assert info["user"]["name"] == "alice"
    members = await client.usergroups_users_list(usergroup=group.id)
    assert members["users"] == [ws.alice.id, ws.bob.id]
    channel = await client.conversations_info(channel=private.id, include_num_members=True)
    assert channel["channel"]["is_private"]
    assert channel["channel"]["is_member"]
    assert channel["channel"]["num_members"] == 2
    dm = await client.conversations_info(channel=fake.open_dm(ws.bob).id)
    assert dm["channel"]["is_im"]
    assert dm["channel"]["user"] == ws.bob.id

    sent = await client.chat_postEphemeral(channel=private.id, user=ws.alice.id, text="only you")
    assert [(e.user, e.text, e.ts) for e in fake.ephemerals] == [
        (ws.alice.id, "only you", sent["message_ts"])
    ]
    with pytest.raises(SlackApiError) as err:
        await client.chat_postEphemeral(channel=private.id, user=ws.bob.id, text="not a member")
    assert err.value.response["error"] == "user_not_in_channel"
    assert fake.messages(private) == []


# ------------------------------------------------------------------------------------------------ streaming


async def test_chat_stream_helper_streams_into_a_thread(ws: Workspace, client: AsyncWebClient) -> None:
    fake = ws.fake
    question = await fake.user_posts(ws.general, ws.alice, "how do I deploy?", deliver=False)
    streamer = await client.chat_stream(
        channel=ws.general.id,
        thread_ts=question.ts,
        recipient_team_id=fake.team_id,
        recipient_user_id=ws.alice.id,
        buffer_size=8,
    )
    for piece in ["First, ", "check the ", "pipeline. ", "Then ", "run `make deploy`."]:
        await streamer.append(markdown_text=piece)
    assert streamer.ts is not None
    live = fake.message(ws.general, streamer.ts)
    assert live.streaming
    assert live.thread_ts == question.ts
    assert live.text.startswith("First, ")

    feedback = [{"type": "context", "elements": [{"type": "mrkdwn", "text": "Was this helpful?"}]}]
    metadata = {"event_type": "durable_bots.entry", "event_payload": {"entry_id": 7}}
    await streamer.stop(blocks=feedback, metadata=metadata)

    final = fake.message(ws.general, streamer.ts)
    assert not final.streaming
    assert final.text == "First, check the pipeline. Then run `make deploy`."
    assert final.blocks == feedback
    assert final.metadata == metadata
    assert {"chat.startStream", "chat.appendStream", "chat.stopStream"} <= {c.method for c in fake.calls}
    replies = await client.conversations_replies(
        channel=ws.general.id, ts=question.ts, include_all_metadata=True
    )
    assert replies["messages"][-1]["metadata"] == metadata
    assert replies["messages"][-1]["bot_id"] == fake.bot_id


async def test_stream_rules(ws: Workspace, client: AsyncWebClient) -> None:
    fake = ws.fake
    question = await fake.user_posts(ws.general, ws.alice, "q", deliver=False)
    recipients = {"recipient_team_id": fake.team_id, "recipient_user_id": ws.alice.id}
    errors = []
    for call in [
        client.api_call("chat.startStream", json={"channel": ws.general.id, **recipients}),
        client.chat_startStream(channel=ws.general.id, thread_ts=question.ts),
        client.chat_startStream(
            channel=ws.general.id, thread_ts=question.ts, markdown_text="x" * 12_001, **recipients
        ),
    ]:
        with pytest.raises(SlackApiError) as err:
            await call
        errors.append(err.value.response["error"])
    assert errors == ["invalid_arguments", "invalid_arguments", "msg_too_long"]

    started = await client.chat_startStream(
        channel=ws.general.id, thread_ts=question.ts, markdown_text="x" * 12_000, **recipients
    )
    await client.chat_stopStream(channel=ws.general.id, ts=started["ts"])
    with pytest.raises(SlackApiError) as stopped:
        await client.chat_appendStream(channel=ws.general.id, ts=started["ts"], markdown_text="more")
    assert stopped.value.response["error"] == "message_not_in_streaming_state"
    # a stopped stream is an ordinary bot message: chat.update works (the documented fallback)
    await client.chat_update(channel=ws.general.id, ts=started["ts"], text="rewritten")
    assert fake.message(ws.general, started["ts"]).text == "rewritten"

    dm = fake.open_dm(ws.alice)
    dm_question = await fake.user_posts(dm, ws.alice, "hi", deliver=False)
    in_dm = await client.chat_startStream(
        channel=dm.id, thread_ts=dm_question.ts, markdown_text="no recipients needed"
    )
    fake.expire_stream(dm, in_dm["ts"])
    with pytest.raises(SlackApiError) as expired:
        await client.chat_stopStream(channel=dm.id, ts=in_dm["ts"])
    assert expired.value.response["error"] == "message_not_in_streaming_state"
    assert fake.message(dm, in_dm["ts"]).text == "no recipients needed"


# ------------------------------------------------------------------------------------------------ faults


async def test_http_429_rate_limit_is_visible_to_the_retry_handler(
    ws: Workspace, client: AsyncWebClient
) -> None:
    fake = ws.fake
    fake.rate_limit("chat.postMessage", retry_after=7)
    with pytest.raises(SlackApiError) as err:
        await client.chat_postMessage(channel=ws.general.id, text="hello")
    assert err.value.response.status_code == 429
    assert err.value.response["error"] == "ratelimited"
    assert err.value.response.headers["Retry-After"] == "7"
    assert fake.messages(ws.general) == []

    fault = fake.rate_limit("chat.postMessage", retry_after=0)
    patient = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
    patient.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=1))
    posted = await patient.chat_postMessage(channel=ws.general.id, text="hello again")
    assert posted["ok"]
    assert len(fault.hits) == 1
    assert [c.outcome for c in fake.calls_to("chat.postMessage")] == ["ratelimited", "ratelimited", "ok"]
    assert [m.text for m in fake.messages(ws.general)] == ["hello again"]


async def test_http_200_ratelimited_variant_is_not_retried_by_the_sdk(ws: Workspace) -> None:
    fake = ws.fake
    fake.rate_limit("chat.update", status=200, times=2)
    client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
    client.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=3))
    posted = await client.chat_postMessage(channel=ws.general.id, text="v1")
    with pytest.raises(SlackApiError) as err:
        await client.chat_update(channel=ws.general.id, ts=posted["ts"], text="v2")
    assert err.value.response.status_code == 200
    assert err.value.response["error"] == "ratelimited"
    assert len(fake.calls_to("chat.update")) == 1
    assert fake.message(ws.general, posted["ts"]).text == "v1"


async def test_generic_failures_before_and_after_the_effect(ws: Workspace, client: AsyncWebClient) -> None:
    fake = ws.fake
    fake.fail("chat.postMessage", "fatal_error", status=500)
    with pytest.raises(SlackApiError) as server_error:
        await client.chat_postMessage(channel=ws.general.id, text="lost")
    assert server_error.value.response.status_code == 500
    assert fake.messages(ws.general) == []

    fake.fail("chat.postMessage", "internal_error", after_effect=True)
    with pytest.raises(SlackApiError) as uncertain:
        await client.chat_postMessage(channel=ws.general.id, text="stored anyway")
    assert uncertain.value.response["error"] == "internal_error"
    assert [m.text for m in fake.messages(ws.general)] == ["stored anyway"]
    last = fake.last_call("chat.postMessage")
    assert last is not None
    assert last.effect_applied
    assert not last.ok


async def test_lost_response_after_effect_makes_the_sdk_post_twice(
    ws: Workspace, client: AsyncWebClient
) -> None:
    """slack-sdk's default AsyncConnectionErrorRetryHandler resends a non-idempotent post once."""
    fake = ws.fake
    fake.drop_on("chat.postMessage", after_effect=False)
    await client.chat_postMessage(channel=ws.general.id, text="dropped before storing")
    assert [m.text for m in fake.messages(ws.general)] == ["dropped before storing"]

    fake.drop_on("chat.postMessage", after_effect=True)
    await client.chat_postMessage(channel=ws.general.id, text="dropped after storing")
    texts = [m.text for m in fake.messages(ws.general)]
    assert texts == ["dropped before storing", "dropped after storing", "dropped after storing"]
    assert [c.outcome for c in fake.calls_to("chat.postMessage")] == ["dropped", "ok", "dropped", "ok"]


async def test_request_hooks_see_the_call_and_can_answer(ws: Workspace, client: AsyncWebClient) -> None:
    fake = ws.fake
    seen: list[RecordedCall] = []

    async def spy(call: RecordedCall) -> None:
        seen.append(call)

    fake.on_request("chat.postMessage", spy, when="after_effect", times=None)
    fake.on_request(
        "chat.postMessage",
        lambda call: Respond({"ok": False, "error": "is_archived"}),
        match=lambda call: call.args.get("text") == "refuse me",
    )
    await client.chat_postMessage(channel=ws.general.id, text="fine")
    with pytest.raises(SlackApiError) as err:
        await client.chat_postMessage(channel=ws.general.id, text="refuse me")
    assert err.value.response["error"] == "is_archived"
    assert [c.args["text"] for c in seen] == ["fine"]
    assert seen[0].effect_applied
    assert [m.text for m in fake.messages(ws.general)] == ["fine"]


KILLABLE_BOT = """
import asyncio, os
from slack_sdk.web.async_client import AsyncWebClient

async def main():
    client = AsyncWebClient(token=os.environ["SLACK_BOT_TOKEN"], base_url=os.environ["SLACK_API_URL"])
    await client.chat_postMessage(channel=os.environ["CHANNEL"], text="answer for entry 1")
    print("survived", flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("after_effect", [True, False])
async def test_kill_hook_sigkills_the_bot_process(ws: Workspace, after_effect: bool) -> None:
    fake = ws.fake
    proc: asyncio.subprocess.Process | None = None

    def bot_pid() -> int:
        assert proc is not None
        return proc.pid

    hook = fake.kill_on("chat.postMessage", bot_pid, after_effect=after_effect)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        KILLABLE_BOT,
        env={**os.environ, **fake.env, "CHANNEL": ws.general.id},
        stdout=asyncio.subprocess.PIPE,
    )
    stdout, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == -signal.SIGKILL
    assert b"survived" not in stdout
    assert len(hook.fired) == 1
    await fake.wait_for(lambda: hook.fired[0].outcome == "dropped")
    stored = [m.text for m in fake.messages(ws.general)]
    assert stored == (["answer for entry 1"] if after_effect else [])


# ------------------------------------------------------------------------------------------------ Socket Mode


def _recording_app(fake: FakeSlack, **kwargs: Any) -> tuple[AsyncApp, list[tuple[str, str, str | None]]]:
    """A bolt app recording (event type, event_id, x-slack-retry-num) for message and app_mention."""
    app = AsyncApp(client=AsyncWebClient(token=fake.bot_token, base_url=fake.api_url), **kwargs)
    seen: list[tuple[str, str, str | None]] = []

    async def record(body: dict[str, Any], request: AsyncBoltRequest) -> None:
        retry = request.headers.get("x-slack-retry-num")
        seen.append((body["event"]["type"], body["event_id"], retry[0] if retry else None))

    app.event("message")(record)
    app.event("app_mention")(record)
    return app, seen


async def test_socket_mode_message_and_app_mention_for_one_post(
    ws: Workspace, connect_socket: SocketConnector
) -> None:
    fake = ws.fake
    app, seen = _recording_app(fake)
    await connect_socket(app)
    assert fake.calls_to("apps.connections.open")[0].token == fake.app_token

    post = await fake.user_posts(ws.general, ws.alice, f"<@{fake.bot_user_id}> deploy please")
    await post.wait_acked()
    await fake.wait_for(lambda: len(seen) == 2)

    assert [d.event_type for d in post.deliveries] == ["message", "app_mention"]
    message_event, mention_event = (d.event for d in post.deliveries)
    assert message_event is not None
    assert mention_event is not None
    assert message_event["ts"] == mention_event["ts"] == post.ts
    assert message_event["channel_type"] == "channel"
    assert message_event["user"] == ws.alice.id
    assert len({d.event_id for d in post.deliveries}) == 2
    assert sorted(seen) == sorted((d.event_type or "", d.event_id or "", "0") for d in post.deliveries)
    acks = [f["envelope_id"] for f in fake.connections[0].frames_received if "envelope_id" in f]
    assert sorted(acks) == sorted(d.attempts[0].envelope_id or "" for d in post.deliveries)
    assert all(d.attempts[0].acked_in_time for d in post.deliveries)


async def test_socket_mode_redelivery_reuses_the_event_id(
    ws: Workspace, connect_socket: SocketConnector
) -> None:
    fake = ws.fake
    app, seen = _recording_app(fake)
    await connect_socket(app)
    post = await fake.user_posts(ws.general, ws.alice, "just chatting")
    await post.wait_acked()
    delivery = post.deliveries[0]
    for n in (1, 2, 3):
        attempt = await fake.deliver(delivery, retry_num=n)
        assert await attempt.wait_settled(5) == "acked"
        assert attempt.retry_reason == "timeout"
    await fake.wait_for(lambda: len(seen) == 4)
    assert seen == [("message", delivery.event_id, str(n)) for n in range(4)]
    assert len({a.envelope_id for a in delivery.attempts}) == 4


async def test_a_deaf_socket_stays_open_but_answers_no_ping_and_loses_envelopes_and_acks(
    ws: Workspace,
) -> None:
    """`go_deaf` models a half-open link: the app sees an open WebSocket that no longer hears anything."""
    fake = ws.fake
    opener = AsyncWebClient(base_url=fake.api_url)

    async def socket_url() -> str:
        return str((await opener.apps_connections_open(app_token=fake.app_token))["url"])

    async with aiohttp.ClientSession() as session:
        first = await session.ws_connect(await socket_url(), autoping=False)
        assert (await first.receive_json())["type"] == "hello"
        await first.ping(b"are you there")
        pong = await first.receive()
        assert (pong.type, pong.data) == (aiohttp.WSMsgType.PONG, b"are you there")
        conn = fake.go_deaf()
        await first.ping(b"still there?")
        await fake.wait_for(lambda: conn.pings_unanswered == 1)
        post = await fake.user_posts(ws.general, ws.alice, "into the void")
        delivery = post.deliveries[0]
        attempt = delivery.attempts[0]
        assert attempt.connection_id == conn.id and conn.envelopes_lost == 1  # Slack chose it: still "open"
        await first.send_json({"envelope_id": attempt.envelope_id})  # an ack that never arrives
        await first.ping(b"last try")
        await fake.wait_for(lambda: conn.pings_unanswered == 2)
        assert conn.frames_received == [] and not delivery.acked and conn.open and not first.closed

        await first.close()  # the app gives up on it: Slack sees the socket close
        await fake.wait_for(lambda: not conn.open)
        second = await session.ws_connect(await socket_url(), autoping=False)
        assert (await second.receive_json())["type"] == "hello"
        retry = await fake.deliver(delivery, retry_num=1)
        frame = await second.receive_json()
        assert frame["payload"]["event_id"] == delivery.event_id and frame["retry_attempt"] == 1
        await second.send_json({"envelope_id": frame["envelope_id"]})
        assert await retry.wait_settled(5) == "acked"
        await second.close()


async def test_socket_mode_unacked_envelope_is_retried(
    ws: Workspace, connect_socket: SocketConnector
) -> None:
    """With process_before_response=True a failing listener means no ack; Slack (the fake) retries."""
    fake = ws.fake
    fake.ack_timeout = 0.5
    fake.auto_retry = True
    fake.retry_delays = (0.0,)
    app = AsyncApp(
        client=AsyncWebClient(token=fake.bot_token, base_url=fake.api_url), process_before_response=True
    )
    handled: list[str | None] = []

    @app.event("message")
    async def flaky(body: dict[str, Any], request: AsyncBoltRequest) -> None:
        retry = request.headers.get("x-slack-retry-num")
        handled.append(retry[0] if retry else None)
        if len(handled) == 1:
            raise RuntimeError("storage hiccup before the intake commit")

    await connect_socket(app)
    post = await fake.user_posts(ws.general, ws.alice, "please remember this")
    acked = await post.deliveries[0].wait_acked(5)
    first, second = post.deliveries[0].attempts
    assert first.outcome == "timed_out"
    assert not first.acked
    assert (second.retry_num, second.retry_reason) == (1, "timeout")
    assert acked is second
    assert handled == ["0", "1"]


async def test_socket_mode_unhandled_event_is_never_acked(
    ws: Workspace, connect_socket: SocketConnector
) -> None:
    fake = ws.fake
    fake.ack_timeout = 0.3
    app = AsyncApp(client=AsyncWebClient(token=fake.bot_token, base_url=fake.api_url))

    @app.event("app_mention")
    async def only_mentions() -> None:
        return None

    await connect_socket(app)
    post = await fake.user_posts(ws.general, ws.alice, "no listener handles plain messages")
    assert await post.deliveries[0].attempts[0].wait_settled(5) == "timed_out"


async def test_block_actions_click_is_acked_and_response_url_works(
    ws: Workspace, client: AsyncWebClient, connect_socket: SocketConnector
) -> None:
    fake = ws.fake
    app = AsyncApp(client=client)
    clicks: list[dict[str, Any]] = []

    @app.action("approve")
    async def approve(ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond) -> None:
        await ack()
        clicks.append(body)
        await respond(replace_original=True, text=f"Approved by <@{body['user']['id']}>")
        await respond(text="noted", response_type="ephemeral")

    await connect_socket(app)
    gate = await client.chat_postMessage(channel=ws.general.id, text="Deploy?", blocks=APPROVE_BLOCKS)
    result = await fake.click(ws.general, gate["ts"], "approve", user=ws.bob)
    assert result.acked
    await fake.wait_for(lambda: len(result.responses) == 2)

    body = clicks[0]
    assert body["container"]["message_ts"] == gate["ts"]
    assert body["channel"]["id"] == ws.general.id
    assert body["actions"][0]["value"] == "gate-7"
    assert body["actions"][0]["block_id"] == "gate-actions"
    assert body["trigger_id"] == result.trigger_id
    assert body["response_url"] == result.response_url
    replaced, ephemeral = result.responses
    assert replaced.replace_original
    assert replaced.applied == "replaced"
    assert ephemeral.response_type == "ephemeral"
    assert ephemeral.applied == "ephemeral"
    message = fake.message(ws.general, gate["ts"])
    assert message.text == f"Approved by <@{ws.bob.id}>"
    assert message.blocks is None
    assert [(e.user, e.text) for e in fake.ephemerals] == [(ws.bob.id, "noted")]


async def test_click_not_acked_in_time_is_reported(
    ws: Workspace, client: AsyncWebClient, connect_socket: SocketConnector
) -> None:
    fake = ws.fake
    fake.ack_timeout = 0.2
    app = AsyncApp(client=client, process_before_response=True)

    @app.action("approve")
    async def slow(ack: AsyncAck) -> None:
        await asyncio.sleep(0.6)
        await ack()

    await connect_socket(app)
    gate = await client.chat_postMessage(channel=ws.general.id, text="Deploy?", blocks=APPROVE_BLOCKS)
    result = await fake.click(ws.general, gate["ts"], "approve", user=ws.bob)
    assert not result.acked
    attempt = result.delivery.attempts[0]
    await fake.wait_for(lambda: attempt.acked)
    assert attempt.late_ack
    assert len(result.delivery.attempts) == 1


async def test_each_envelope_goes_to_exactly_one_of_several_connections(
    ws: Workspace, connect_socket: SocketConnector
) -> None:
    fake = ws.fake
    first_app, first_seen = _recording_app(fake)
    second_app, second_seen = _recording_app(fake)
    await connect_socket(first_app)
    await connect_socket(second_app)
    assert len(fake.open_connections) == 2
    posts = [await fake.user_posts(ws.general, ws.alice, f"message {i}") for i in range(8)]
    for post in posts:
        await post.wait_acked()
    await fake.wait_for(lambda: len(first_seen) + len(second_seen) == 8)
    handled = sorted(e for e in [*first_seen, *second_seen])
    assert handled == sorted(("message", p.deliveries[0].event_id or "", "0") for p in posts)
    per_connection = {c.id: c.envelopes_sent for c in fake.connections}
    assert sum(per_connection.values()) == 8


async def test_disconnect_frame_makes_the_client_reconnect(
    ws: Workspace, connect_socket: SocketConnector
) -> None:
    fake = ws.fake
    app, seen = _recording_app(fake)
    await connect_socket(app)
    old = fake.connections[0]
    await fake.disconnect(reason="refresh_requested")
    await fake.wait_for(lambda: not old.open and len(fake.open_connections) == 1, timeout=10)
    assert len(fake.calls_to("apps.connections.open")) == 2
    post = await fake.user_posts(ws.general, ws.alice, "after the refresh")
    await post.wait_acked()
    assert post.deliveries[0].attempts[0].connection_id == fake.open_connections[0].id
    await fake.wait_for(lambda: len(seen) == 1)


async def test_no_connection_then_retry_after_reconnect(
    ws: Workspace, connect_socket: SocketConnector
) -> None:
    """An event sent while the bot is down is only seen through Slack's retry."""
    fake = ws.fake
    post = await fake.user_posts(ws.general, ws.alice, "sent during a deploy")
    assert post.deliveries[0].attempts[0].outcome == "no_connection"
    app, seen = _recording_app(fake)
    await connect_socket(app)
    await fake.deliver(post.deliveries[0])
    await post.wait_acked()
    await fake.wait_for(lambda: len(seen) == 1)
    assert seen == [("message", post.deliveries[0].event_id, "1")]


async def test_dm_mention_order_and_bot_echoes(
    ws: Workspace, client: AsyncWebClient, connect_socket: SocketConnector
) -> None:
    fake = ws.fake
    fake.echo_bot_events = True
    app, seen = _recording_app(fake)
    await connect_socket(app)

    dm = fake.open_dm(ws.alice)
    in_dm = await fake.user_posts(dm, ws.alice, f"<@{fake.bot_user_id}> hi")
    assert [d.event_type for d in in_dm.deliveries] == ["message"]
    assert in_dm.deliveries[0].event is not None
    assert in_dm.deliveries[0].event["channel_type"] == "im"

    mention_first = await fake.user_posts(
        ws.general, ws.alice, f"<@{fake.bot_user_id}> hey", mention_order="app_mention_first"
    )
    assert [d.event_type for d in mention_first.deliveries] == ["app_mention", "message"]

    posted = await client.chat_postMessage(channel=ws.general.id, text="bot says hi")
    echo = await fake.wait_for(
        lambda: next((d for d in fake.deliveries if d.event and d.event.get("bot_id") == fake.bot_id), None)
    )
    await echo.wait_acked()  # bolt's IgnoringSelfEvents acks it without running listeners
    assert echo.event is not None
    assert echo.event["ts"] == posted["ts"]
    await fake.wait_for(lambda: len(seen) == 3)
    assert all(event_id != echo.event_id for _, event_id, _ in seen)

    edited = await fake.user_edits(ws.general, mention_first.ts, "edited text")
    assert edited is not None
    assert edited.event is not None
    assert edited.event["subtype"] == "message_changed"
    assert edited.event["message"]["text"] == "edited text"
    assert edited.event["previous_message"]["text"] == f"<@{fake.bot_user_id}> hey"


# ------------------------------------------------------------------------------------------------ HTTP mode


async def test_http_mode_signed_events_retry_headers_and_bad_input(
    ws: Workspace, serve_http: HttpServer
) -> None:
    fake = ws.fake
    fake.mode = "http"
    app = AsyncApp(
        client=AsyncWebClient(token=fake.bot_token, base_url=fake.api_url), signing_secret=fake.signing_secret
    )
    seen: list[tuple[str, str | None, str | None]] = []

    @app.event("message")
    async def on_message(body: dict[str, Any], request: AsyncBoltRequest) -> None:
        num, reason = request.headers.get("x-slack-retry-num"), request.headers.get("x-slack-retry-reason")
        seen.append((body["event_id"], num[0] if num else None, reason[0] if reason else None))

    fake.request_url = await serve_http(app)
    assert await fake.verify_url()

    post = await fake.user_posts(ws.general, ws.alice, "over http")
    await post.wait_acked()
    attempt = await fake.deliver(post.deliveries[0], retry_num=1)
    assert await attempt.wait_settled(5) == "acked"
    assert attempt.http_status == 200
    await fake.wait_for(lambda: len(seen) == 2)
    event_id = post.deliveries[0].event_id
    assert seen == [(event_id, None, None), (event_id, "1", "http_timeout")]

    payload = post.deliveries[0].payload
    assert (await fake.post_to_app(payload, signature="invalid")).status == 401
    assert (await fake.post_to_app(payload, signature="missing")).status == 401
    assert (await fake.post_to_app(payload, timestamp=int(time.time()) - 600)).status == 401
    assert (await fake.post_to_app(b"{not json")).status == 400
    assert len(seen) == 2


async def test_http_mode_error_answer_is_retried_with_http_error(
    ws: Workspace, serve_http: HttpServer
) -> None:
    fake = ws.fake
    fake.mode = "http"
    fake.auto_retry = True
    fake.retry_delays = (0.0,)
    app = AsyncApp(
        client=AsyncWebClient(token=fake.bot_token, base_url=fake.api_url),
        signing_secret=fake.signing_secret,
        process_before_response=True,
    )
    reasons: list[str | None] = []

    @app.event("message")
    async def flaky(request: AsyncBoltRequest) -> None:
        reason = request.headers.get("x-slack-retry-reason")
        reasons.append(reason[0] if reason else None)
        if len(reasons) == 1:
            raise RuntimeError("fail the first delivery")

    fake.request_url = await serve_http(app)
    post = await fake.user_posts(ws.general, ws.alice, "retry me")
    await post.wait_acked()
    first, second = post.deliveries[0].attempts
    assert (first.outcome, first.http_status) == ("rejected", 500)
    assert (second.retry_num, second.outcome) == (1, "acked")
    assert reasons == [None, "http_error"]


async def test_http_mode_click_is_form_encoded_and_acked(
    ws: Workspace, client: AsyncWebClient, serve_http: HttpServer
) -> None:
    fake = ws.fake
    fake.mode = "http"
    app = AsyncApp(client=client, signing_secret=fake.signing_secret)
    clicked: list[str] = []

    @app.action("deny")
    async def deny(ack: AsyncAck, body: dict[str, Any]) -> None:
        await ack()
        clicked.append(body["user"]["id"])

    fake.request_url = await serve_http(app)
    gate = await client.chat_postMessage(channel=ws.general.id, text="Deploy?", blocks=APPROVE_BLOCKS)
    result = await fake.click(ws.general, gate["ts"], "deny", user=ws.alice)
    assert result.acked
    assert clicked == [ws.alice.id]
    attempt = result.delivery.attempts[0]
    assert attempt.transport == "http"
    assert attempt.http_status == 200


async def test_slash_command_ack_payload(
    ws: Workspace, client: AsyncWebClient, connect_socket: SocketConnector
) -> None:
    fake = ws.fake
    app = AsyncApp(client=client)

    @app.command("/deploy")
    async def deploy(ack: AsyncAck, command: dict[str, Any]) -> None:
        await ack(text=f"queued {command['text']}")

    await connect_socket(app)
    result = await fake.slash_command("/deploy", "api@v2", user=ws.alice, channel=ws.general)
    assert result.acked
    assert result.ack_payload is not None
    assert result.ack_payload["text"] == "queued api@v2"


async def test_hooks_can_drop_and_fakes_clean_up(ws: Workspace, client: AsyncWebClient) -> None:
    fake = ws.fake
    hook = fake.on_request("auth.test", lambda call: DROP, times=2)
    with pytest.raises(Exception):  # noqa: B017 - aiohttp raises ServerDisconnectedError after the sdk's retry
        await client.auth_test()
    assert not hook.active
    assert [c.outcome for c in fake.calls_to("auth.test")] == ["dropped", "dropped"]
    fake.clear_faults()
    assert (await client.auth_test())["ok"]


async def test_auto_retry_gives_up_after_three_retries(ws: Workspace) -> None:
    fake = ws.fake
    fake.auto_retry = True
    fake.retry_delays = (0.0, 0.0, 0.0)
    post = await fake.user_posts(ws.general, ws.alice, "nobody is connected")
    delivery = post.deliveries[0]
    await fake.wait_for(lambda: len(delivery.attempts) == 4 and all(a.settled for a in delivery.attempts))
    await asyncio.sleep(0.05)
    assert len(delivery.attempts) == 4
    assert [(a.retry_num, a.retry_reason, a.outcome) for a in delivery.attempts] == [
        (0, None, "no_connection"),
        (1, "connection_failed", "no_connection"),
        (2, "connection_failed", "no_connection"),
        (3, "connection_failed", "no_connection"),
    ]
    assert not delivery.acked


async def test_dropped_socket_is_seen_as_closed(ws: Workspace, connect_socket: SocketConnector) -> None:
    fake = ws.fake
    app, _seen = _recording_app(fake)
    await connect_socket(app)
    conn = fake.open_connections[0]
    await fake.drop_connections()
    await fake.wait_for(lambda: not conn.open)
    assert conn.close_reason == "dropped"
    # slack-sdk notices and reconnects only after its ping_interval (10 s in bolt's handler)
    post = await fake.user_posts(ws.general, ws.alice, "while the network is down")
    assert post.deliveries[0].attempts[0].outcome == "no_connection"


async def test_posting_to_a_user_id_lands_in_the_dm(ws: Workspace, client: AsyncWebClient) -> None:
    fake = ws.fake
    posted = await client.chat_postMessage(channel=ws.alice.id, text="psst")
    dm = fake.open_dm(ws.alice)
    assert posted["channel"] == dm.id
    assert [m.text for m in fake.messages(dm)] == ["psst"]
    seen = await fake.wait_for_call("chat.postMessage", predicate=lambda c: c.args["channel"] == ws.alice.id)
    assert seen.ok


SOCKET_BOT = """
import asyncio, os
from slack_bolt.async_app import AsyncApp
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_sdk.web.async_client import AsyncWebClient

async def main():
    client = AsyncWebClient(token=os.environ["SLACK_BOT_TOKEN"], base_url=os.environ["SLACK_API_URL"])
    app = AsyncApp(client=client)

    @app.event("message")
    async def pong(event, say):
        await say(text="pong", thread_ts=event["ts"])

    await AsyncSocketModeHandler(app, os.environ["SLACK_APP_TOKEN"]).start_async()

asyncio.run(main())
"""


async def test_bot_in_another_process_over_socket_mode(ws: Workspace) -> None:
    fake = ws.fake
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SOCKET_BOT,
        env={**os.environ, **fake.env},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        conn = await fake.wait_for_connection(timeout=20)
        post = await fake.user_posts(ws.general, ws.alice, "ping")
        reply = await fake.wait_for_message(ws.general, thread_ts=post.ts, contains="pong", timeout=10)
        assert reply.thread_ts == post.ts
        assert post.message_delivery is not None
        assert post.message_delivery.acked
        proc.kill()
        await proc.wait()
        await fake.wait_for(lambda: not conn.open)
        later = await fake.user_posts(ws.general, ws.alice, "anyone there?")
        assert later.deliveries[0].attempts[0].outcome == "no_connection"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
