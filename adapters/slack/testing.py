"""A loopback fake Slack for testing Slack bots: Web API, Socket Mode, HTTP Events API, buttons, faults.

The fake is a real aiohttp server on ``127.0.0.1`` (ephemeral port), so unmodified slack-sdk / slack-bolt
code talks to it, in this process or in another one (``fake.env`` gives the environment for a bot process)::

    async with FakeSlack() as fake:
        general = fake.add_channel("general")
        alice = fake.add_user("UALICE", name="alice", display_name="Alice")

        client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
        app = AsyncApp(client=client)
        handler = AsyncSocketModeHandler(app, app_token=fake.app_token)
        await handler.connect_async()
        await fake.wait_for_connection()

        post = await fake.user_posts(general, alice, f"<@{fake.bot_user_id}> deploy please")
        await post.wait_acked()                      # message + app_mention, each acked within 3 s
        reply = await fake.wait_for_message(general, thread_ts=post.ts)

        fake.kill_on("chat.postMessage", bot_pid)    # SIGKILL the bot once its next post is stored
        fake.rate_limit("chat.update", times=2, retry_after=1)

What it simulates: workspace state (channels, DMs, users, user groups, history with threads, edits,
metadata, streaming), the Web API methods a bot adapter uses (``fake.supported_methods``), token checks,
Socket Mode (``hello``, envelopes, acks, ``disconnect``, several connections, one random connection per
envelope), the HTTP Events API (signed POSTs, retry headers, form-encoded interactions), Slack's 3-second ack
window and its retries (same ``event_id``, ``retry_attempt`` 1..3), ``message`` + ``app_mention`` for one
post, ``block_actions`` clicks with a working ``response_url``, and faults (rate limits, errors, HTTP 5xx,
dropped connections, request hooks that can SIGKILL a process at an exact moment).

Timing fields on records (``sent_at``, ``acked_at``, ``received_at``...) are ``time.monotonic()`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import secrets
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs

import aiohttp
from aiohttp import web

from adapters.slack._fake_model import (
    AttemptOutcome,
    CallOutcome,
    Channel,
    ChannelKind,
    Delivery,
    DeliveryAttempt,
    DeliveryKind,
    Ephemeral,
    HttpResult,
    InteractionResult,
    JsonDict,
    Message,
    RecordedCall,
    ResponseUrlCall,
    Revision,
    SocketConnection,
    Transport,
    User,
    UserGroup,
    UserPost,
    _truthy,
)
from adapters.slack._fake_payloads import (
    app_mention_event,
    block_actions_payload,
    envelope,
    event_callback,
    find_action_element,
    http_body,
    message_changed_event,
    message_deleted_event,
    message_event,
    new_trigger_id,
    sign,
    slash_command_payload,
)
from adapters.slack._fake_webapi import BotChange, WebApi, parse_arg_values
from adapters.slack._fake_workspace import SlackError, Workspace

__all__ = [
    "DROP",
    "AttemptOutcome",
    "CallOutcome",
    "Channel",
    "ChannelKind",
    "Delivery",
    "DeliveryAttempt",
    "DeliveryKind",
    "DropConnection",
    "Ephemeral",
    "FakeSlack",
    "Fault",
    "HookResult",
    "HttpResult",
    "InteractionResult",
    "JsonDict",
    "Message",
    "RecordedCall",
    "RequestHook",
    "Respond",
    "ResponseUrlCall",
    "Revision",
    "SocketConnection",
    "Transport",
    "User",
    "UserGroup",
    "UserPost",
    "kill_process",
    "sign",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

MentionOrder = Literal["message_first", "app_mention_first", "random"]
HookWhen = Literal["before", "after_effect"]
SignatureMode = Literal["valid", "invalid", "missing"]

SLACK_USER_AGENT = "Slackbot 1.0 (+https://api.slack.com/robots)"
RESPONSE_URL_MAX_USES = 5


# --------------------------------------------------------------------------------------------------------------
# hooks and faults


@dataclass(frozen=True)
class DropConnection:
    """Hook result: close the HTTP connection without any response (the client sees a disconnect)."""


DROP = DropConnection()
"""The :class:`DropConnection` instance to return from a request hook."""


@dataclass(frozen=True)
class Respond:
    """Hook result: answer with this instead (for a ``before`` hook the method's effect is not applied)."""

    body: JsonDict
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


HookResult = DropConnection | Respond | None
HookFunc = Callable[[RecordedCall], "Awaitable[HookResult] | HookResult"]


@dataclass
class RequestHook:
    """A registered request hook (see :meth:`FakeSlack.on_request`)."""

    method: str
    when: HookWhen
    func: HookFunc
    remaining: int | None
    match: Callable[[RecordedCall], bool] | None
    fired: list[RecordedCall] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.remaining is None or self.remaining > 0

    def remove(self) -> None:
        """Disarm the hook."""
        self.remaining = 0


@dataclass
class Fault:
    """An injected failure for the next calls of a method (see :meth:`FakeSlack.rate_limit` / :meth:`fail`)."""

    method: str
    remaining: int | None
    error: str
    status: int
    retry_after: int | None
    after_effect: bool
    match: Callable[[RecordedCall], bool] | None
    hits: list[RecordedCall] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.remaining is None or self.remaining > 0

    def cancel(self) -> None:
        self.remaining = 0


@dataclass
class _ResponseTarget:
    channel: str
    message_ts: str | None
    user: str
    thread_ts: str | None
    uses: int = 0


def _process_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``Z`` zombie...), ``""`` if gone, ``None`` if unknowable."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return ""
    except OSError:
        return None
    return fields[0] if fields else ""


async def kill_process(pid: int, sig: int = signal.SIGKILL, *, timeout: float = 5.0) -> None:  # noqa: ASYNC109
    """Send ``sig`` to ``pid`` and wait until the process is dead (a zombie counts as dead)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _process_state(pid)
        if state is None:
            await asyncio.sleep(0.1)
            return
        if state in ("", "Z", "X", "x"):
            return
        await asyncio.sleep(0.005)


# --------------------------------------------------------------------------------------------------------------
# the fake


class FakeSlack:
    """A loopback Slack: Web API + Socket Mode + HTTP Events API on ``127.0.0.1``.

    Args:
        mode: how events reach the app: ``"socket"`` (Socket Mode; the app connects) or ``"http"`` (the fake
            POSTs signed requests to ``request_url``).
        ack_timeout: Slack's ack window (3 s). An ack after it counts as a timeout.
        auto_retry: redeliver unacked Events API deliveries like Slack (``retry_attempt`` 1..3, same
            ``event_id``). Interactions and commands are never retried (as on Slack).
        retry_delays: pause before retry 1, 2 and 3 once an attempt failed (Slack: ~0 s, ~1 min, ~5 min;
            the default scales minutes down to seconds).
        mention_order: order of the ``message`` and ``app_mention`` events for one post (Slack guarantees
            none); ``"random"`` uses ``seed``.
        echo_bot_events: also deliver events for the bot's own posts/edits/deletes, as Slack does when the app
            subscribes to ``message.*`` (bolt ignores them by default).
        stream_idle_timeout: a streaming message not appended to for this long stops streaming
            (``message_not_in_streaming_state``), like Slack's server-side expiry. ``None``: never.
        clock: source of message timestamps (``ts``); defaults to ``time.time``.
    """

    def __init__(
        self,
        *,
        team_id: str = "T1",
        team_name: str = "Fake Team",
        team_domain: str = "fake-team",
        app_id: str = "A1",
        bot_user_id: str = "UBOT",
        bot_id: str = "BBOT",
        bot_name: str = "bot",
        bot_token: str = "xoxb-fake-bot-token",
        app_token: str = "xapp-fake-app-token",
        signing_secret: str = "fake-signing-secret",
        mode: Transport = "socket",
        request_url: str | None = None,
        interactivity_url: str | None = None,
        ack_timeout: float = 3.0,
        auto_retry: bool = False,
        retry_delays: Sequence[float] = (0.0, 1.0, 5.0),
        mention_order: MentionOrder = "message_first",
        seed: int = 0,
        echo_bot_events: bool = False,
        stream_idle_timeout: float | None = None,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.team_id = team_id
        self.team_name = team_name
        self.app_id = app_id
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.bot_name = bot_name
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.mode: Transport = mode
        self.request_url = request_url
        """HTTP mode: where events are POSTed (the app's Request URL). Settable after start."""
        self.interactivity_url = interactivity_url
        """HTTP mode: where interactions and commands are POSTed; defaults to ``request_url``."""
        self.ack_timeout = ack_timeout
        self.auto_retry = auto_retry
        self.retry_delays = tuple(retry_delays)
        self.mention_order: MentionOrder = mention_order
        self.echo_bot_events = echo_bot_events
        self.stream_idle_timeout = stream_idle_timeout
        self._host = host
        self._port = port

        self.workspace = Workspace(
            team_id=team_id,
            team_domain=team_domain,
            bot_user_id=bot_user_id,
            bot_id=bot_id,
            app_id=app_id,
            bot_name=bot_name,
            clock=clock,
        )
        self._webapi = WebApi(
            self.workspace,
            team_name=team_name,
            socket_url=self._issue_socket_url,
            on_bot_change=self._on_bot_change,
            stream_idle_timeout=lambda: self.stream_idle_timeout,
        )

        self.calls: list[RecordedCall] = []
        """Every Web API request received, in arrival order."""
        self.deliveries: list[Delivery] = []
        """Everything sent to the app (events, interactions, commands), in order."""
        self.connections: list[SocketConnection] = []
        """Every Socket Mode connection ever opened (see ``open_connections``)."""
        self.response_url_calls: list[ResponseUrlCall] = []

        self._rng = random.Random(seed)
        self._seq = 0
        self._faults: list[Fault] = []
        self._hooks: list[RequestHook] = []
        self._tickets: set[str] = set()
        self._sockets: dict[int, tuple[web.WebSocketResponse, web.Request]] = {}
        self._attempts_by_envelope: dict[str, DeliveryAttempt] = {}
        self._response_targets: dict[str, _ResponseTarget] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._base_url: str | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> FakeSlack:
        """Start listening on an ephemeral loopback port."""
        if self._runner is not None:
            return self
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_get("/link/", self._handle_socket)
        app.router.add_post("/response/{url_id}", self._handle_response_url)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        await site.start()
        host, port = runner.addresses[0][:2]
        self._runner = runner
        self._port = int(port)
        self._base_url = f"http://{host}:{port}"
        self._session = aiohttp.ClientSession()
        return self

    async def stop(self) -> None:
        """Close every connection and stop the server."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for ws, _request in list(self._sockets.values()):
            with contextlib.suppress(Exception):
                await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"server shutdown")
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeSlack:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` (after :meth:`start`)."""
        if self._base_url is None:
            raise RuntimeError("FakeSlack is not started; call await fake.start() or use async with")
        return self._base_url

    @property
    def api_url(self) -> str:
        """Web API base URL for ``AsyncWebClient(base_url=...)`` / ``SLACK_API_URL``."""
        return f"{self.base_url}/api/"

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that point a bot process at this fake."""
        return {
            "SLACK_API_URL": self.api_url,
            "SLACK_BOT_TOKEN": self.bot_token,
            "SLACK_APP_TOKEN": self.app_token,
            "SLACK_SIGNING_SECRET": self.signing_secret,
        }

    @property
    def supported_methods(self) -> list[str]:
        return self._webapi.methods

    # ------------------------------------------------------------------ workspace

    def add_user(
        self,
        user_id: str | None = None,
        *,
        name: str | None = None,
        display_name: str | None = None,
        real_name: str | None = None,
        is_bot: bool = False,
        deleted: bool = False,
        tz: str = "UTC",
    ) -> User:
        """Add a member; ``name`` defaults to the lower-cased id, ``display_name`` to ``name``."""
        return self.workspace.add_user(
            user_id,
            name=name,
            display_name=display_name,
            real_name=real_name,
            is_bot=is_bot,
            bot_id=None,
            deleted=deleted,
            tz=tz,
        )

    def add_channel(
        self,
        name: str,
        *,
        channel_id: str | None = None,
        private: bool = False,
        members: Sequence[str | User] = (),
        bot_is_member: bool = True,
    ) -> Channel:
        """Add a public (or private) channel; the bot is a member unless ``bot_is_member=False``."""
        kind: ChannelKind = "private" if private else "public"
        return self.workspace.add_channel(
            name,
            channel_id=channel_id,
            kind=kind,
            members=[_user_id(m) for m in members],
            bot_is_member=bot_is_member,
        )

    def open_dm(self, user: str | User, *, channel_id: str | None = None) -> Channel:
        """The DM channel between ``user`` and the bot (created on first use)."""
        return self.workspace.open_dm(self._user(user).id, channel_id=channel_id)

    def add_group_dm(self, members: Sequence[str | User], *, channel_id: str | None = None) -> Channel:
        """A multi-person DM (``mpim``) with the bot and ``members``."""
        ids = [self._user(m).id for m in members]
        return self.workspace.add_channel(
            "mpdm-" + "--".join(ids), channel_id=channel_id, kind="mpim", members=ids, bot_is_member=True
        )

    def add_usergroup(
        self, handle: str, members: Sequence[str | User], *, group_id: str | None = None
    ) -> UserGroup:
        """A user group (mention syntax ``<!subteam^ID>``); ``usergroups.users.list`` returns ``members``."""
        return self.workspace.add_usergroup(handle, [_user_id(m) for m in members], group_id=group_id)

    def channel(self, ref: str | Channel) -> Channel:
        """A channel by id, name or ``#name``."""
        return self._channel(ref)

    def user(self, ref: str | User) -> User:
        return self._user(ref)

    def seed_message(
        self,
        channel: str | Channel,
        text: str,
        *,
        user: str | User | None = None,
        bot: bool = False,
        thread_ts: str | None = None,
        blocks: list[JsonDict] | None = None,
        metadata: JsonDict | None = None,
    ) -> Message:
        """Store a message without delivering any event (history that predates the test, or arrived while
        the bot was down). ``bot=True`` stores it as posted by this app."""
        if not bot and user is None:
            raise ValueError("seed_message needs user=... or bot=True")
        ch = self._channel(channel)
        message = self.workspace.store(
            ch,
            text=text,
            user=None if user is None else self._user(user).id,
            bot=bot,
            thread_ts=thread_ts,
            blocks=blocks,
            metadata=metadata,
        )
        self._notify()
        return message

    def messages(
        self,
        channel: str | Channel,
        *,
        thread_ts: str | None = None,
        include_replies: bool = True,
        include_deleted: bool = False,
    ) -> list[Message]:
        """Stored messages of a channel, oldest first; with ``thread_ts``: the parent and its replies."""
        ch = self._channel(channel)
        result: list[Message] = []
        for message in self.workspace.history[ch.id]:
            if message.deleted and not include_deleted:
                continue
            if thread_ts is not None:
                if message.ts != thread_ts and message.thread_ts != thread_ts:
                    continue
            elif message.is_reply and not include_replies:
                continue
            result.append(message)
        return result

    def message(self, channel: str | Channel, ts: str) -> Message:
        """The message with ``ts`` (deleted ones included); ``KeyError`` if none."""
        ch = self._channel(channel)
        message = self.workspace.find(ch.id, ts, include_deleted=True)
        if message is None:
            raise KeyError(f"no message {ts} in {ch.id}")
        return message

    def bot_messages(
        self, channel: str | Channel | None = None, *, thread_ts: str | None = None
    ) -> list[Message]:
        """Live messages posted by this app (across channels unless ``channel`` is given), oldest first."""
        channels = [self._channel(channel)] if channel is not None else list(self.workspace.channels.values())
        found = [
            m for ch in channels for m in self.messages(ch, thread_ts=thread_ts) if m.bot_id == self.bot_id
        ]
        return sorted(found, key=lambda m: m.ts)

    @property
    def ephemerals(self) -> list[Ephemeral]:
        """Ephemeral messages (``chat.postEphemeral`` and ephemeral ``response_url`` answers)."""
        return list(self.workspace.ephemerals)

    @property
    def statuses(self) -> list[JsonDict]:
        """``assistant.threads.setStatus`` calls: ``{"channel", "thread_ts", "status"}``."""
        return list(self.workspace.statuses)

    def expire_stream(self, channel: str | Channel, ts: str) -> None:
        """End a stream server-side: further append/stop calls get ``message_not_in_streaming_state``."""
        self.message(channel, ts).streaming = False
        self._notify()

    # ------------------------------------------------------------------ recorded calls

    def calls_to(self, method: str) -> list[RecordedCall]:
        """Recorded calls of one Web API method (e.g. ``"chat.postMessage"``)."""
        return [c for c in self.calls if c.method == method]

    def last_call(self, method: str) -> RecordedCall | None:
        calls = self.calls_to(method)
        return calls[-1] if calls else None

    def clear_calls(self) -> None:
        self.calls.clear()

    # ------------------------------------------------------------------ faults and hooks

    def rate_limit(
        self,
        method: str,
        *,
        times: int | None = 1,
        retry_after: int = 1,
        status: int = 429,
        match: Callable[[RecordedCall], bool] | None = None,
    ) -> Fault:
        """Answer the next ``times`` calls of ``method`` (``"*"``: any) with ``ratelimited`` (effect not applied).

        ``status=429`` (default) is Slack's HTTP 429 with ``Retry-After`` and ``{"ok": false, "error":
        "ratelimited"}``; ``status=200`` is the HTTP-200 ``ok: false`` variant some transports produce.
        """
        return self._add_fault(method, times, "ratelimited", status, retry_after, False, match)

    def fail(
        self,
        method: str,
        error: str = "internal_error",
        *,
        status: int = 200,
        times: int | None = 1,
        after_effect: bool = False,
        match: Callable[[RecordedCall], bool] | None = None,
    ) -> Fault:
        """Fail the next ``times`` calls of ``method`` with ``{"ok": false, "error": error}`` and HTTP ``status``.

        ``after_effect=True`` applies the effect first (the message is stored) and still answers the error: the
        "uncertain outcome" case an outbox has to reconcile.
        """
        return self._add_fault(method, times, error, status, None, after_effect, match)

    def on_request(
        self,
        method: str,
        hook: HookFunc,
        *,
        when: HookWhen = "before",
        times: int | None = 1,
        match: Callable[[RecordedCall], bool] | None = None,
    ) -> RequestHook:
        """Run ``hook(call)`` at the moment a call of ``method`` (``"*"``: any) arrives.

        ``when="before"`` runs before the effect (and before token checks); ``"after_effect"`` runs after the
        method succeeded and changed the workspace, before the response is written. The hook (sync or
        async) may return :data:`DROP` (no response at all), a :class:`Respond`, or ``None`` to carry on.
        """
        registered = RequestHook(method=method, when=when, func=hook, remaining=times, match=match)
        self._hooks.append(registered)
        return registered

    def kill_on(
        self,
        method: str,
        pid: int | Callable[[], int],
        *,
        after_effect: bool = True,
        times: int | None = 1,
        match: Callable[[RecordedCall], bool] | None = None,
        sig: int = signal.SIGKILL,
    ) -> RequestHook:
        """SIGKILL ``pid`` when a call of ``method`` arrives, then drop the connection (no response).

        ``after_effect=True``: after the effect is applied (e.g. the message is stored); ``False``: before.
        ``pid`` may be a callable, read when the hook fires (for processes started later).
        """

        async def _kill(call: RecordedCall) -> HookResult:
            await kill_process(pid() if callable(pid) else pid, sig)
            return DROP

        return self.on_request(
            method, _kill, when="after_effect" if after_effect else "before", times=times, match=match
        )

    def drop_on(
        self,
        method: str,
        *,
        after_effect: bool = True,
        times: int | None = 1,
        match: Callable[[RecordedCall], bool] | None = None,
    ) -> RequestHook:
        """Close the connection instead of answering (after or before the effect): a lost response."""

        def _drop(call: RecordedCall) -> HookResult:
            return DROP

        return self.on_request(
            method, _drop, when="after_effect" if after_effect else "before", times=times, match=match
        )

    def clear_faults(self) -> None:
        """Disarm every fault and hook."""
        for fault in self._faults:
            fault.cancel()
        for hook in self._hooks:
            hook.remove()
        self._faults.clear()
        self._hooks.clear()

    # ------------------------------------------------------------------ user actions

    async def user_posts(
        self,
        channel: str | Channel,
        user: str | User,
        text: str,
        *,
        thread_ts: str | None = None,
        blocks: list[JsonDict] | None = None,
        broadcast: bool = False,
        deliver: bool = True,
        mention_order: MentionOrder | None = None,
    ) -> UserPost:
        """A human posts: store the message, then deliver ``message`` (and ``app_mention`` if the text
        contains ``<@BOT>``, with a different ``event_id``) to the app, without waiting for acks.

        Nothing is delivered if the bot is not a member of the channel or ``deliver=False``.
        """
        ch = self._channel(channel)
        author = self._user(user)
        if ch.kind == "public":
            ch.members.add(author.id)
        message = self.workspace.store(
            ch,
            text=text,
            user=author.id,
            thread_ts=thread_ts,
            blocks=blocks,
            subtype="thread_broadcast" if broadcast and thread_ts else None,
        )
        deliveries: list[Delivery] = []
        if deliver and self.bot_user_id in ch.members:
            events = [message_event(self.workspace, ch, message)]
            if f"<@{self.bot_user_id}>" in text and ch.kind != "im":
                events.append(app_mention_event(self.workspace, ch, message))
                order = mention_order or self.mention_order
                if order == "app_mention_first":
                    events.reverse()
                elif order == "random":
                    self._rng.shuffle(events)
            deliveries = [self._new_delivery("events_api", self._wrap_event(e)) for e in events]
            for delivery in deliveries:
                await self._send_attempt(delivery, 0, None)
        self._notify()
        return UserPost(message, deliveries)

    async def user_edits(
        self, channel: str | Channel, ts: str, text: str, *, deliver: bool = True
    ) -> Delivery | None:
        """A human edits their message: stored as an edit, delivered as a hidden ``message_changed`` event."""
        ch = self._channel(channel)
        message = self.message(ch, ts)
        self.workspace.edit(message, text=text, blocks=None, metadata=None, by=message.user, via="user_edit")
        return await self._deliver_event_if(deliver, ch, message_changed_event(self.workspace, ch, message))

    async def user_deletes(self, channel: str | Channel, ts: str, *, deliver: bool = True) -> Delivery | None:
        """A human deletes a message: delivered as a hidden ``message_deleted`` event."""
        ch = self._channel(channel)
        message = self.message(ch, ts)
        message.deleted = True
        return await self._deliver_event_if(deliver, ch, message_deleted_event(self.workspace, ch, message))

    async def deliver(
        self,
        item: Delivery | JsonDict,
        *,
        retry_num: int | None = None,
        retry_reason: str | None = None,
        connection: SocketConnection | None = None,
    ) -> DeliveryAttempt:
        """Send (or re-send) something to the app and return the attempt (not waiting for the ack).

        ``item`` may be a :class:`Delivery` (redelivered with the same payload and ``event_id``), an
        ``event_callback`` payload, a bare event (``{"type": "message", ...}``; wrapped with a new
        ``event_id``), an interactive payload (``block_actions``, ``view_submission``...) or a Socket Mode
        envelope. ``retry_num`` defaults to the number of earlier attempts (0 for new items): Slack's retries
        carry 1..3 with ``retry_reason`` (default ``"timeout"`` in Socket Mode, ``"http_timeout"`` over HTTP).
        """
        if isinstance(item, Delivery):
            delivery = item
        else:
            kind, payload = self._classify(item)
            delivery = self._new_delivery(kind, payload)
        num = len(delivery.attempts) if retry_num is None else retry_num
        reason = (retry_reason or self._retry_reason("timed_out")) if num > 0 else None
        return await self._send_attempt(delivery, num, reason, connection)

    async def click(
        self,
        channel: str | Channel,
        message_ts: str,
        action_id: str,
        value: str | None = None,
        *,
        user: str | User,
        block_id: str | None = None,
        wait: bool = True,
    ) -> InteractionResult:
        """A human clicks the element ``action_id`` of a message: deliver ``block_actions``.

        The element must exist in the message blocks (``block_id``, ``text`` and the default ``value`` come
        from it). With ``wait`` (default) returns once the app acked or the ack window passed;
        ``result.acked`` says whether the ack came in time. ``result.response_url`` is a working endpoint.
        """
        ch = self._channel(channel)
        clicker = self._user(user)
        message = self.message(ch, message_ts)
        if message.deleted:
            raise KeyError(f"message {message_ts} in {ch.id} is deleted")
        found = find_action_element(message, action_id, block_id)
        if found is None:
            raise ValueError(f"message {message_ts} has no element with action_id={action_id!r}")
        found_block_id, element = found
        action: JsonDict = {
            "action_id": action_id,
            "block_id": found_block_id,
            "type": element.get("type", "button"),
            "action_ts": f"{time.time():.6f}",
        }
        if "text" in element:
            action["text"] = element["text"]
        chosen = value if value is not None else element.get("value")
        if chosen is not None:
            action["value"] = chosen
        if "style" in element:
            action["style"] = element["style"]
        url_id, response_url = self._new_response_url(ch.id, message.ts, clicker.id, message.thread_ts)
        trigger_id = new_trigger_id()
        payload = block_actions_payload(
            self.workspace,
            channel=ch,
            message=message,
            user=clicker,
            action=action,
            response_url=response_url,
            trigger_id=trigger_id,
        )
        return await self._interact("interactive", payload, url_id, response_url, trigger_id, wait)

    async def slash_command(
        self,
        command: str,
        text: str = "",
        *,
        user: str | User,
        channel: str | Channel,
        wait: bool = True,
    ) -> InteractionResult:
        """A human runs a slash command (``"/deploy"``); the ack may carry a response payload."""
        ch = self._channel(channel)
        caller = self._user(user)
        url_id, response_url = self._new_response_url(ch.id, None, caller.id, None)
        trigger_id = new_trigger_id()
        payload = slash_command_payload(
            self.workspace,
            command=command,
            text=text,
            channel=ch,
            user=caller,
            response_url=response_url,
            trigger_id=trigger_id,
        )
        return await self._interact("slash_commands", payload, url_id, response_url, trigger_id, wait)

    # ------------------------------------------------------------------ socket mode control

    @property
    def open_connections(self) -> list[SocketConnection]:
        return [c for c in self.connections if c.open]

    async def disconnect(
        self,
        connection: SocketConnection | None = None,
        *,
        reason: str = "refresh_requested",
        close_after: float | None = 1.0,
    ) -> None:
        """Send a Socket Mode ``disconnect`` frame (``refresh_requested``, ``warning``, ``link_disabled``...)
        to one connection or all, and close it after ``close_after`` seconds unless the client did."""
        targets = [connection] if connection is not None else self.open_connections
        frame = {"type": "disconnect", "reason": reason, "debug_info": {"host": self._debug_host}}
        for conn in targets:
            entry = self._sockets.get(conn.id)
            if entry is None:
                continue
            with contextlib.suppress(ConnectionError, RuntimeError):
                await entry[0].send_str(json.dumps(frame))
            if close_after is not None:
                self._spawn(self._close_later(conn, close_after, reason))

    async def drop_connections(self, connection: SocketConnection | None = None) -> None:
        """Abort Socket Mode connections without a close handshake (a network failure)."""
        targets = [connection] if connection is not None else self.open_connections
        for conn in targets:
            entry = self._sockets.get(conn.id)
            if entry is None:
                continue
            conn.close_reason = "dropped"
            transport = entry[1].transport
            if transport is not None:
                transport.abort()
            else:
                await entry[0].close()

    # ------------------------------------------------------------------ HTTP mode helpers

    def sign(self, body: bytes, timestamp: int | None = None) -> dict[str, str]:
        """``X-Slack-Request-Timestamp`` / ``X-Slack-Signature`` headers for ``body``."""
        ts = int(time.time()) if timestamp is None else timestamp
        return {
            "X-Slack-Request-Timestamp": str(ts),
            "X-Slack-Signature": sign(self.signing_secret, ts, body),
        }

    async def post_to_app(
        self,
        body: bytes | str | JsonDict,
        *,
        url: str | None = None,
        content_type: str | None = None,
        signature: SignatureMode = "valid",
        timestamp: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> HttpResult:
        """POST anything to the app (HTTP mode), e.g. a bad signature or a malformed body; returns its answer.

        ``signature``: ``"valid"``, ``"invalid"`` (wrong HMAC) or ``"missing"``. ``timestamp`` overrides the
        request timestamp (e.g. 10 minutes old to test replay protection).
        """
        if isinstance(body, dict):
            raw = json.dumps(body).encode()
            ctype = content_type or "application/json"
        else:
            raw = body.encode() if isinstance(body, str) else body
            ctype = content_type or "application/json"
        sent_headers = {"Content-Type": ctype, "User-Agent": SLACK_USER_AGENT}
        if signature != "missing":
            signed = self.sign(raw, timestamp)
            if signature == "invalid":
                signed["X-Slack-Signature"] = "v0=" + "0" * 64
            sent_headers.update(signed)
        sent_headers.update(headers or {})
        return await self._post(url or self._require_url("request_url", self.request_url), raw, sent_headers)

    async def verify_url(self, url: str | None = None) -> bool:
        """Send Slack's ``url_verification`` challenge; True if the app echoed it."""
        challenge = secrets.token_urlsafe(24)
        body = {"token": "fake-verification-token", "challenge": challenge, "type": "url_verification"}
        result = await self.post_to_app(body, url=url)
        if result.status != 200:
            return False
        try:
            answer = json.loads(result.body)
        except json.JSONDecodeError:
            return result.body.strip() == challenge
        return isinstance(answer, dict) and answer.get("challenge") == challenge

    # ------------------------------------------------------------------ waiting

    async def wait_for(
        self,
        predicate: Callable[[], _T | None],
        timeout: float = 5.0,  # noqa: ASYNC109
        *,
        description: str | None = None,
    ) -> _T:
        """Wait until ``predicate()`` is truthy and return its value (re-checked on every change of the fake
        and at least every 20 ms); ``TimeoutError`` otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out after {timeout}s waiting for {description or predicate!r}")
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(remaining, 0.02))

    async def wait_for_message(
        self,
        channel: str | Channel | None = None,
        *,
        thread_ts: str | None = None,
        contains: str | None = None,
        from_bot: bool | None = True,
        predicate: Callable[[Message], bool] | None = None,
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> Message:
        """The first stored (live) message that matches; by default one posted by the bot."""

        def find() -> Message | None:
            channels = (
                [self._channel(channel)] if channel is not None else list(self.workspace.channels.values())
            )
            for ch in channels:
                for message in self.messages(ch, thread_ts=thread_ts):
                    if from_bot is not None and message.is_bot != from_bot:
                        continue
                    if contains is not None and contains not in message.text:
                        continue
                    if predicate is not None and not predicate(message):
                        continue
                    return message
            return None

        return await self.wait_for(find, timeout, description=f"message contains={contains!r} in {channel}")

    async def wait_for_call(
        self,
        method: str,
        *,
        count: int = 1,
        predicate: Callable[[RecordedCall], bool] | None = None,
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> RecordedCall:
        """Wait until ``count`` matching calls of ``method`` were answered; return the ``count``-th."""

        def find() -> RecordedCall | None:
            matching = [
                c
                for c in self.calls_to(method)
                if c.outcome != "pending" and (predicate is None or predicate(c))
            ]
            return matching[count - 1] if len(matching) >= count else None

        return await self.wait_for(find, timeout, description=f"{count} call(s) to {method}")

    async def wait_for_connection(
        self,
        count: int = 1,
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> SocketConnection:
        """Wait until ``count`` Socket Mode connections are open; return the newest."""

        def find() -> SocketConnection | None:
            conns = self.open_connections
            return conns[-1] if len(conns) >= count else None

        return await self.wait_for(find, timeout, description=f"{count} open Socket Mode connection(s)")

    # ================================================================== internals

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.error("fake Slack background task failed", exc_info=task.exception())

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    @property
    def _debug_host(self) -> str:
        return f"fake-slack-{self._port}"

    def _channel(self, ref: str | Channel) -> Channel:
        return self.workspace.channel(ref.id if isinstance(ref, Channel) else ref)

    def _user(self, ref: str | User) -> User:
        return self.workspace.user(ref.id if isinstance(ref, User) else ref)

    def _require_url(self, name: str, value: str | None) -> str:
        if value is None:
            raise RuntimeError(f"HTTP mode needs fake.{name} (the app's URL)")
        return value

    def _add_fault(
        self,
        method: str,
        times: int | None,
        error: str,
        status: int,
        retry_after: int | None,
        after_effect: bool,
        match: Callable[[RecordedCall], bool] | None,
    ) -> Fault:
        fault = Fault(method, times, error, status, retry_after, after_effect, match)
        self._faults.append(fault)
        return fault

    def _take_fault(self, call: RecordedCall, *, after_effect: bool) -> Fault | None:
        for fault in self._faults:
            if (
                not fault.active
                or fault.after_effect != after_effect
                or fault.method not in (call.method, "*")
            ):
                continue
            if fault.match is not None and not fault.match(call):
                continue
            if fault.remaining is not None:
                fault.remaining -= 1
            fault.hits.append(call)
            return fault
        return None

    async def _run_hooks(self, call: RecordedCall, when: HookWhen) -> HookResult:
        for hook in self._hooks:
            if not hook.active or hook.when != when or hook.method not in (call.method, "*"):
                continue
            if hook.match is not None and not hook.match(call):
                continue
            if hook.remaining is not None:
                hook.remaining -= 1
            hook.fired.append(call)
            result = hook.func(call)
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                result = await result
            if isinstance(result, (DropConnection, Respond)):
                return result
        return None

    # ------------------------------------------------------------------ Web API endpoint

    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        try:
            args, token, content_type = await _parse_api_request(request)
        except ValueError:
            call = self._record(request, method, {}, None, "json")
            return self._finish(call, 200, {"ok": False, "error": "invalid_json"}, "error")
        call = self._record(request, method, args, token, content_type)

        hooked = await self._run_hooks(call, "before")
        if hooked is not None:
            return self._hook_response(request, call, hooked)

        try:
            self._check_auth(method, token)
        except SlackError as exc:
            return self._finish(call, 200, exc.body(), "error")

        fault = self._take_fault(call, after_effect=False)
        if fault is not None:
            return self._fault_response(call, fault)

        try:
            body, applied = await self._webapi.call(method, args)
        except SlackError as exc:
            return self._finish(call, 200, exc.body(), "error")
        call.effect_applied = applied
        self._notify()

        hooked = await self._run_hooks(call, "after_effect")
        if hooked is not None:
            return self._hook_response(request, call, hooked)

        fault = self._take_fault(call, after_effect=True)
        if fault is not None:
            return self._fault_response(call, fault)
        return self._finish(call, 200, body, "ok")

    def _record(
        self, request: web.Request, method: str, args: JsonDict, token: str | None, content_type: str
    ) -> RecordedCall:
        call = RecordedCall(
            seq=self._next_seq(),
            method=method,
            args=args,
            token=token,
            http_method=request.method,
            content_type=content_type,
            headers={k: v for k, v in request.headers.items() if k.lower() != "authorization"},
            received_at=time.monotonic(),
        )
        self.calls.append(call)
        self._notify()
        return call

    def _check_auth(self, method: str, token: str | None) -> None:
        kind = self._webapi.token_kind(method)
        if kind is None:
            raise SlackError("unknown_method")
        if not token:
            raise SlackError("not_authed")
        if token == self.bot_token:
            if kind != "bot":
                raise SlackError("not_allowed_token_type")
        elif token == self.app_token:
            if kind != "app":
                raise SlackError("not_allowed_token_type")
        else:
            raise SlackError("invalid_auth")

    def _finish(
        self,
        call: RecordedCall,
        status: int,
        body: JsonDict,
        outcome: CallOutcome,
        headers: dict[str, str] | None = None,
    ) -> web.Response:
        call.status = status
        call.response = body
        call.outcome = outcome
        self._notify()
        return web.json_response(body, status=status, headers=headers)

    def _fault_response(self, call: RecordedCall, fault: Fault) -> web.Response:
        headers: dict[str, str] = {}
        if fault.retry_after is not None:
            headers["Retry-After"] = str(fault.retry_after)
        if fault.error == "ratelimited":
            outcome: CallOutcome = "ratelimited"
        else:
            outcome = "error" if fault.status == 200 else "http_error"
        return self._finish(call, fault.status, {"ok": False, "error": fault.error}, outcome, headers)

    def _hook_response(self, request: web.Request, call: RecordedCall, result: HookResult) -> web.Response:
        if isinstance(result, Respond):
            return self._finish(call, result.status, result.body, "hook_response", result.headers)
        call.outcome = "dropped"
        self._notify()
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=200)

    # ------------------------------------------------------------------ bot echo events

    def _on_bot_change(self, change: BotChange, message: Message) -> None:
        if not self.echo_bot_events:
            return
        ch = self.workspace.channels[message.channel]
        if change == "posted":
            event = message_event(self.workspace, ch, message)
        elif change == "changed":
            event = message_changed_event(self.workspace, ch, message)
        else:
            event = message_deleted_event(self.workspace, ch, message)
        self._spawn(self._deliver_event_if(True, ch, event))

    async def _deliver_event_if(self, deliver: bool, ch: Channel, event: JsonDict) -> Delivery | None:
        self._notify()
        if not deliver or self.bot_user_id not in ch.members:
            return None
        delivery = self._new_delivery("events_api", self._wrap_event(event))
        await self._send_attempt(delivery, 0, None)
        return delivery

    # ------------------------------------------------------------------ deliveries

    def _wrap_event(self, event: JsonDict) -> JsonDict:
        event_id = f"Ev{self._next_seq():06d}{secrets.token_hex(2).upper()}"
        return event_callback(self.workspace, event, event_id=event_id)

    def _classify(self, item: JsonDict) -> tuple[DeliveryKind, JsonDict]:
        if "envelope_id" in item and isinstance(item.get("payload"), dict):
            kind = item.get("type")
            if kind not in ("events_api", "interactive", "slash_commands"):
                raise ValueError(f"unsupported envelope type {kind!r}")
            return kind, item["payload"]
        item_type = item.get("type")
        if item_type == "event_callback":
            return "events_api", item
        if "command" in item and "trigger_id" in item:
            return "slash_commands", item
        if item_type in (
            "block_actions",
            "view_submission",
            "view_closed",
            "shortcut",
            "message_action",
            "block_suggestion",
        ):
            return "interactive", item
        if isinstance(item_type, str):
            return "events_api", self._wrap_event(item)
        raise ValueError("cannot tell what to deliver: give an event, a payload, an envelope or a Delivery")

    def _new_delivery(self, kind: DeliveryKind, payload: JsonDict) -> Delivery:
        delivery = Delivery(id=self._next_seq(), kind=kind, payload=payload, _changed=self._notify)
        self.deliveries.append(delivery)
        return delivery

    async def _send_attempt(
        self,
        delivery: Delivery,
        retry_num: int,
        retry_reason: str | None,
        connection: SocketConnection | None = None,
    ) -> DeliveryAttempt:
        now = time.monotonic()
        attempt = DeliveryAttempt(
            retry_num=retry_num,
            retry_reason=retry_reason,
            transport=self.mode,
            sent_at=now,
            deadline=now + self.ack_timeout,
        )
        delivery.attempts.append(attempt)
        if self.mode == "socket":
            await self._socket_send(delivery, attempt, connection)
        else:
            self._spawn(self._http_send(delivery, attempt))
        self._spawn(self._watch(delivery, attempt))
        self._notify()
        return attempt

    async def _socket_send(
        self, delivery: Delivery, attempt: DeliveryAttempt, connection: SocketConnection | None
    ) -> None:
        candidates = [connection] if connection is not None else self.open_connections
        candidates = [c for c in candidates if c.open and c.id in self._sockets]
        if not candidates:
            attempt._settle("no_connection")
            return
        conn = self._rng.choice(candidates)
        frame = envelope(
            delivery.kind, delivery.payload, retry_num=attempt.retry_num, retry_reason=attempt.retry_reason
        )
        attempt.envelope_id = frame["envelope_id"]
        attempt.connection_id = conn.id
        self._attempts_by_envelope[frame["envelope_id"]] = attempt
        try:
            await self._sockets[conn.id][0].send_str(json.dumps(frame))
        except (ConnectionError, RuntimeError):
            attempt._settle("no_connection")
            return
        conn.envelopes_sent += 1

    async def _http_send(self, delivery: Delivery, attempt: DeliveryAttempt) -> None:
        url = (
            self.request_url
            if delivery.kind == "events_api"
            else (self.interactivity_url or self.request_url)
        )
        if url is None:
            attempt._settle("connection_failed")
            self._notify()
            return
        raw, ctype = http_body(delivery.kind, delivery.payload)
        headers = {"Content-Type": ctype, "User-Agent": SLACK_USER_AGENT, **self.sign(raw)}
        if attempt.retry_num > 0:
            headers["X-Slack-Retry-Num"] = str(attempt.retry_num)
            headers["X-Slack-Retry-Reason"] = attempt.retry_reason or "http_timeout"
        try:
            result = await self._post(url, raw, headers)
        except (aiohttp.ClientError, OSError, TimeoutError):
            attempt._settle("connection_failed")
            self._notify()
            return
        attempt.http_status = result.status
        attempt.http_body = result.body
        attempt.http_headers = result.headers
        if 200 <= result.status < 300:
            attempt.acked_at = time.monotonic()
            with contextlib.suppress(json.JSONDecodeError):
                parsed = json.loads(result.body) if result.body else None
                attempt.ack_payload = parsed if isinstance(parsed, dict) else None
            attempt._settle("acked" if attempt.acked_at <= attempt.deadline else "timed_out")
        else:
            attempt._settle("rejected")
        self._notify()

    async def _post(self, url: str, raw: bytes, headers: dict[str, str]) -> HttpResult:
        if self._session is None:
            raise RuntimeError("FakeSlack is not started")
        timeout = aiohttp.ClientTimeout(total=max(30.0, self.ack_timeout * 2))
        async with self._session.post(url, data=raw, headers=headers, timeout=timeout) as resp:
            text = await resp.text()
            return HttpResult(resp.status, text, {k.lower(): v for k, v in resp.headers.items()})

    async def _watch(self, delivery: Delivery, attempt: DeliveryAttempt) -> None:
        try:
            await asyncio.wait_for(attempt._settled.wait(), max(attempt.deadline - time.monotonic(), 0.0))
        except TimeoutError:
            attempt._settle("timed_out")
            self._notify()
        if attempt.outcome == "acked" or not self.auto_retry or delivery.kind != "events_api":
            return
        if attempt.retry_num >= 3 or delivery.acked or attempt is not delivery.last_attempt:
            return
        if attempt.outcome == "rejected" and attempt.http_headers.get("x-slack-no-retry") == "1":
            return
        reason = self._retry_reason(attempt.outcome)
        delays = self.retry_delays or (0.0,)
        await asyncio.sleep(delays[min(attempt.retry_num, len(delays) - 1)])
        if delivery.acked or attempt is not delivery.last_attempt:
            return
        await self._send_attempt(delivery, attempt.retry_num + 1, reason)

    def _retry_reason(self, outcome: AttemptOutcome) -> str:
        if outcome == "timed_out":
            return "timeout" if self.mode == "socket" else "http_timeout"
        if outcome == "rejected":
            return "http_error"
        if outcome in ("no_connection", "connection_failed"):
            return "connection_failed"
        return "unknown_error"

    async def _interact(
        self,
        kind: DeliveryKind,
        payload: JsonDict,
        url_id: str,
        response_url: str,
        trigger_id: str,
        wait: bool,
    ) -> InteractionResult:
        delivery = self._new_delivery(kind, payload)
        attempt = await self._send_attempt(delivery, 0, None)
        if wait:
            await attempt.wait_settled(self.ack_timeout + 5.0)
        return InteractionResult(
            delivery=delivery,
            acked=attempt.acked_in_time,
            response_url=response_url,
            trigger_id=trigger_id,
            _responses=lambda: [c for c in self.response_url_calls if c.url_id == url_id],
        )

    # ------------------------------------------------------------------ Socket Mode endpoint

    def _issue_socket_url(self) -> str:
        ticket = secrets.token_hex(16)
        self._tickets.add(ticket)
        ws_base = self.base_url.replace("http://", "ws://", 1)
        return f"{ws_base}/link/?ticket={ticket}&app_id={self.app_id}"

    async def _handle_socket(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            return web.json_response({"ok": False, "error": "invalid_ticket"}, status=401)
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        conn = SocketConnection(id=self._next_seq(), ticket=ticket, opened_at=time.monotonic())
        self.connections.append(conn)
        self._sockets[conn.id] = (ws, request)
        hello = {
            "type": "hello",
            "num_connections": len(self.open_connections),
            "debug_info": {
                "host": self._debug_host,
                "build_number": 1,
                "approximate_connection_time": 18060,
            },
            "connection_info": {"app_id": self.app_id},
        }
        self._notify()
        try:
            await ws.send_str(json.dumps(hello))
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    self._on_socket_frame(conn, str(msg.data))
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    break
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            conn.closed_at = time.monotonic()
            if conn.close_reason is None:
                conn.close_reason = "closed"
            self._sockets.pop(conn.id, None)
            self._notify()
        return ws

    def _on_socket_frame(self, conn: SocketConnection, data: str) -> None:
        try:
            frame = json.loads(data)
        except json.JSONDecodeError:
            frame = {"_unparsed": data}
        if not isinstance(frame, dict):
            frame = {"_unparsed": data}
        conn.frames_received.append(frame)
        attempt = self._attempts_by_envelope.get(str(frame.get("envelope_id")))
        if attempt is not None and attempt.acked_at is None:
            attempt.acked_at = time.monotonic()
            payload = frame.get("payload")
            attempt.ack_payload = payload if isinstance(payload, dict) else None
            attempt._settle("acked" if attempt.acked_at <= attempt.deadline else "timed_out")
        self._notify()

    async def _close_later(self, conn: SocketConnection, delay: float, reason: str) -> None:
        await asyncio.sleep(delay)
        entry = self._sockets.get(conn.id)
        if entry is not None:
            conn.close_reason = reason
            await entry[0].close(code=aiohttp.WSCloseCode.GOING_AWAY, message=reason.encode())

    # ------------------------------------------------------------------ response_url endpoint

    def _new_response_url(
        self, channel: str, message_ts: str | None, user: str, thread_ts: str | None
    ) -> tuple[str, str]:
        url_id = secrets.token_hex(12)
        self._response_targets[url_id] = _ResponseTarget(channel, message_ts, user, thread_ts)
        return url_id, f"{self.base_url}/response/{url_id}"

    async def _handle_response_url(self, request: web.Request) -> web.StreamResponse:
        url_id = request.match_info["url_id"]
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            form = parse_qs(raw.decode(errors="replace"))
            body = json.loads(form["payload"][0]) if "payload" in form else {}
        if not isinstance(body, dict):
            body = {}
        target = self._response_targets.get(url_id)
        if target is None or target.uses >= RESPONSE_URL_MAX_USES:
            return self._response_url_done(
                url_id, body, 404, "rejected", "used_url" if target else "invalid_url"
            )
        target.uses += 1
        applied = self._apply_response(target, body)
        return self._response_url_done(url_id, body, 200, applied, None)

    def _apply_response(self, target: _ResponseTarget, body: JsonDict) -> str:
        ws = self.workspace
        ch = ws.channels[target.channel]
        text = body.get("text")
        blocks = body.get("blocks")
        message = ws.find(ch.id, target.message_ts) if target.message_ts else None
        if message is not None and _truthy(body.get("delete_original")):
            message.deleted = True
            return "deleted"
        if message is not None and _truthy(body.get("replace_original")):
            ws.edit(
                message,
                text=str(text) if text is not None else "",
                blocks=blocks if isinstance(blocks, list) else [],
                metadata=None,
                by=None,
                via="response_url",
                mark_edited=False,
            )
            return "replaced"
        thread_ts = body.get("thread_ts") or None
        if body.get("response_type") == "in_channel":
            ws.store(
                ch,
                text=str(text or ""),
                user=None,
                bot=True,
                thread_ts=str(thread_ts) if thread_ts else None,
                blocks=blocks if isinstance(blocks, list) else None,
            )
            return "posted"
        ws.ephemerals.append(
            Ephemeral(
                channel=ch.id,
                user=target.user,
                text=str(text or ""),
                blocks=blocks if isinstance(blocks, list) else None,
                thread_ts=str(thread_ts) if thread_ts else None,
                ts=ws.clock.next(),
                via="response_url",
            )
        )
        return "ephemeral"

    def _response_url_done(
        self, url_id: str, body: JsonDict, status: int, applied: str, error: str | None
    ) -> web.Response:
        self.response_url_calls.append(
            ResponseUrlCall(
                url_id=url_id, body=body, received_at=time.monotonic(), status=status, applied=applied
            )
        )
        self._notify()
        if error is not None:
            return web.Response(status=status, text=error)
        return web.json_response({"ok": True})


# --------------------------------------------------------------------------------------------------------------
# request parsing


async def _parse_api_request(request: web.Request) -> tuple[JsonDict, str | None, str]:
    """Merge query string and body (JSON, urlencoded or multipart) into one argument dict."""
    args: dict[str, Any] = dict(request.query)
    content_type = "query"
    if request.can_read_body:
        if request.content_type == "application/json":
            raw = await request.read()
            if raw.strip():
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError as exc:
                    raise ValueError("invalid JSON body") from exc
                if not isinstance(body, dict):
                    raise ValueError("JSON body is not an object")
                args.update(body)
            content_type = "json"
        else:
            form = await request.post()
            for key, value in form.items():
                if isinstance(value, str):
                    args[key] = value
            content_type = "form"
    token: str | None = None
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        token = auth[7:].strip() or None
    body_token = args.pop("token", None)
    if token is None and isinstance(body_token, str) and body_token:
        token = body_token
    return parse_arg_values(args), token, content_type


def _user_id(ref: str | User) -> str:
    return ref.id if isinstance(ref, User) else ref
