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
Socket Mode (``hello``, envelopes, acks, pings, ``disconnect``, several connections, one random connection per
envelope), the HTTP Events API (signed POSTs, retry headers, form-encoded interactions), Slack's 3-second ack
window and its retries (same ``event_id``, ``retry_attempt`` 1..3), ``message`` + ``app_mention`` for one
post, ``block_actions`` clicks and slash commands with a working ``response_url``, and faults (rate limits,
errors, HTTP 5xx, dropped connections, half-open "deaf" connections, request hooks that can SIGKILL a process
at an exact moment).

Timing fields on records (``sent_at``, ``acked_at``, ``received_at``...) are ``time.monotonic()`` seconds.
Settings such as ``ack_timeout``, ``auto_retry``, ``mode`` or ``request_url`` are plain attributes that a
test may change at any time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import secrets
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar

from aiohttp import web

from adapters.slack._fake_delivery import MAX_SOCKET_CONNECTIONS, SLACK_USER_AGENT, Deliverer
from adapters.slack._fake_faults import (
    DROP,
    DropConnection,
    Fault,
    Faults,
    HookFunc,
    HookResult,
    HookWhen,
    RequestHook,
    Respond,
    kill_process,
)
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
)
from adapters.slack._fake_payloads import (
    app_mention_event,
    block_actions_payload,
    event_callback,
    find_action_element,
    message_changed_event,
    message_deleted_event,
    message_event,
    new_trigger_id,
    sign,
    slash_command_payload,
)
from adapters.slack._fake_responses import ResponseUrls
from adapters.slack._fake_webapi import BotChange, WebApi, parse_api_request
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
    "HookFunc",
    "HookResult",
    "HookWhen",
    "HttpResult",
    "InteractionResult",
    "JsonDict",
    "MentionOrder",
    "Message",
    "RecordedCall",
    "RequestHook",
    "Respond",
    "ResponseUrlCall",
    "Revision",
    "SignatureMode",
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
SignatureMode = Literal["valid", "invalid", "missing"]

_INTERACTIVE_TYPES = frozenset(
    {"block_actions", "view_submission", "view_closed", "shortcut", "message_action", "block_suggestion"}
)


class FakeSlack:
    """A loopback Slack: Web API + Socket Mode + HTTP Events API on ``127.0.0.1``.

    Args:
        mode: how events reach the app: ``"socket"`` (Socket Mode; the app connects) or ``"http"`` (the fake
            POSTs signed requests to ``request_url``).
        request_url: HTTP mode: the app's Events API URL (can be set after start).
        interactivity_url: HTTP mode: where clicks and commands go; defaults to ``request_url``.
        ack_timeout: Slack's ack window (3 s). An ack after it counts as a timeout.
        auto_retry: redeliver unacked Events API deliveries like Slack (``retry_attempt`` 1..3, same
            ``event_id``). Interactions and commands are never retried (as on Slack).
        retry_delays: pause before retry 1, 2 and 3 once an attempt failed (Slack: ~0 s, ~1 min, ~5 min;
            the default scales minutes down to seconds).
        mention_order: order of the ``message`` and ``app_mention`` events for one post (Slack guarantees
            none); ``"random"`` uses ``seed`` (which also picks the connection for each envelope).
        echo_bot_events: also deliver events for the bot's own posts/edits/deletes, as Slack does when the app
            subscribes to ``message.*`` (bolt ignores them by default).
        stream_idle_timeout: a streaming message not appended to for this long stops streaming
            (``message_not_in_streaming_state``), like Slack's server-side expiry. ``None``: never.
        clock: source of message timestamps (``ts``); defaults to ``time.time``.
        max_connections: Socket Mode connections the app may hold at once (Slack: 10). One more is refused the
            way Slack refuses it: the WebSocket opens, gets a single ``disconnect`` frame with reason
            ``too_many_websockets`` instead of ``hello``, and closes (see ``refused_connections``).

    Socket Mode with several connections (several processes of one app): each envelope goes to ONE open
    connection picked at random (``seed`` makes the picks repeatable); with ``auto_retry`` an envelope not
    acknowledged within ``ack_timeout`` is sent again, with ``retry_attempt``/``retry_reason``, to a random
    connection open at that moment.
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
        max_connections: int = MAX_SOCKET_CONNECTIONS,
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
        self.interactivity_url = interactivity_url
        self.ack_timeout = ack_timeout
        self.auto_retry = auto_retry
        self.retry_delays: tuple[float, ...] = tuple(retry_delays)
        self.mention_order: MentionOrder = mention_order
        self.echo_bot_events = echo_bot_events
        self.stream_idle_timeout = stream_idle_timeout
        self.max_connections = max_connections
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
        """The raw workspace state (users, channels, history); prefer the helpers below."""
        self.calls: list[RecordedCall] = []
        """Every Web API request received, in arrival order."""

        self._seq = 0
        self._rng = random.Random(seed)
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._faults = Faults()
        self._deliverer = Deliverer(
            self, rng=self._rng, notify=self._notify, spawn=self._spawn, next_id=self._next_seq
        )
        self._responses = ResponseUrls(self.workspace, self._notify)
        self._webapi = WebApi(
            self.workspace,
            team_name=team_name,
            socket_url=self._deliverer.issue_socket_url,
            on_bot_change=self._on_bot_change,
            stream_idle_timeout=lambda: self.stream_idle_timeout,
        )
        self._runner: web.AppRunner | None = None
        self._base_url: str | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> FakeSlack:
        """Start listening on an ephemeral loopback port."""
        if self._runner is not None:
            return self
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_get("/link/", self._deliverer.handle_socket)
        app.router.add_post("/response/{url_id}", self._responses.handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        await site.start()
        host, port = runner.addresses[0][:2]
        self._runner = runner
        self._port = int(port)
        self._base_url = f"http://{host}:{port}"
        self._deliverer.start(self._base_url)
        self._responses.base_url = self._base_url
        return self

    async def stop(self) -> None:
        """Cancel background work, close every connection and stop the server."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        await self._deliverer.close()
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
        """Web API methods the fake implements (others answer ``unknown_method``, and are recorded)."""
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
        """A channel by id, name or ``#name``; ``KeyError`` if none."""
        return self._channel(ref)

    def user(self, ref: str | User) -> User:
        """A user by id; ``KeyError`` if none."""
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
        """Store a message without delivering any event (history that predates the test, or that arrived
        while the bot was down). ``bot=True`` stores it as posted by this app (e.g. with outbox metadata)."""
        if not bot and user is None:
            raise ValueError("seed_message needs user=... or bot=True")
        message = self.workspace.store(
            self._channel(channel),
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
        result: list[Message] = []
        for message in self.workspace.history[self._channel(channel).id]:
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
        """Live messages posted by this app (in every channel unless ``channel`` is given), oldest first."""
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

    # ------------------------------------------------------------------ recorded traffic

    def calls_to(self, method: str) -> list[RecordedCall]:
        """Recorded calls of one Web API method (e.g. ``"chat.postMessage"``)."""
        return [c for c in self.calls if c.method == method]

    def last_call(self, method: str) -> RecordedCall | None:
        calls = self.calls_to(method)
        return calls[-1] if calls else None

    def clear_calls(self) -> None:
        self.calls.clear()

    @property
    def deliveries(self) -> list[Delivery]:
        """Everything sent to the app (events, interactions, commands), in order."""
        return self._deliverer.deliveries

    def deliveries_of(self, event_type: str) -> list[Delivery]:
        """Events API deliveries whose inner event has this ``type`` (``"message"``, ``"app_mention"``...)."""
        return [d for d in self.deliveries if d.event_type == event_type]

    @property
    def connections(self) -> list[SocketConnection]:
        """Every Socket Mode connection ever opened (see :attr:`open_connections`)."""
        return self._deliverer.connections

    @property
    def open_connections(self) -> list[SocketConnection]:
        return self._deliverer.open_connections

    @property
    def refused_connections(self) -> list[SocketConnection]:
        """Connections refused with ``too_many_websockets`` (the app already held ``max_connections``)."""
        return self._deliverer.refused_connections

    @property
    def response_url_calls(self) -> list[ResponseUrlCall]:
        """Every POST apps made to a ``response_url`` handed out by :meth:`click` / :meth:`slash_command`."""
        return self._responses.calls

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
        ``times=None`` keeps limiting until ``fault.cancel()``.
        """
        return self._add_fault(Fault(method, times, "ratelimited", status, retry_after, False, match))

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
        return self._add_fault(Fault(method, times, error, status, None, after_effect, match))

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

        ``when="before"`` runs before the effect (and before token checks); ``"after_effect"`` runs once the
        method succeeded and changed the workspace, before the response is written. The hook (sync or async)
        may return :data:`DROP` (no response at all), a :class:`Respond`, or ``None`` to carry on.
        ``times=None`` fires on every matching call until ``hook.remove()``.
        """
        registered = RequestHook(method=method, when=when, func=hook, remaining=times, match=match)
        self._faults.hooks.append(registered)
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
        """SIGKILL ``pid`` when a call of ``method`` arrives, wait until it is dead, then drop the connection.

        ``after_effect=True``: after the effect is applied (e.g. the message is stored); ``False``: before.
        ``pid`` may be a callable, read when the hook fires (for processes started or restarted later).
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
        self._faults.clear()

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

        Nothing is delivered if the bot is not a member of the channel or ``deliver=False``. DMs get no
        ``app_mention`` (as on Slack). Posting in a public channel makes the user a member.
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
            deliveries = [self._deliverer.new_delivery("events_api", self._wrap_event(e)) for e in events]
            for delivery in deliveries:
                await self._deliverer.send(delivery, 0, None)
        self._notify()
        return UserPost(message, deliveries)

    async def user_edits(
        self, channel: str | Channel, ts: str, text: str, *, deliver: bool = True
    ) -> Delivery | None:
        """A human edits their message: stored as an edit, delivered as a hidden ``message_changed`` event."""
        ch = self._channel(channel)
        message = self.message(ch, ts)
        self.workspace.edit(message, text=text, blocks=None, metadata=None, by=message.user, via="user_edit")
        return await self._deliver_event(deliver, ch, message_changed_event(self.workspace, ch, message))

    async def user_deletes(self, channel: str | Channel, ts: str, *, deliver: bool = True) -> Delivery | None:
        """A human deletes a message: delivered as a hidden ``message_deleted`` event."""
        ch = self._channel(channel)
        message = self.message(ch, ts)
        message.deleted = True
        return await self._deliver_event(deliver, ch, message_deleted_event(self.workspace, ch, message))

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
        ``connection`` pins a Socket Mode connection (default: a random open one, as Slack does).
        """
        if isinstance(item, Delivery):
            delivery = item
        else:
            kind, payload = self._classify(item)
            delivery = self._deliverer.new_delivery(kind, payload)
        num = len(delivery.attempts) if retry_num is None else retry_num
        reason = (retry_reason or self._deliverer.retry_reason("timed_out")) if num > 0 else None
        return await self._deliverer.send(delivery, num, reason, connection)

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
        stale: bool = False,
    ) -> InteractionResult:
        """A human clicks the element ``action_id`` of a message: deliver ``block_actions``.

        The element must exist in the message blocks (``block_id``, ``text`` and the default ``value`` come
        from it). ``stale=True`` also accepts an element of an earlier version of the message: a click from a
        client that has not yet shown an update (e.g. approval buttons another user's decision removed).
        With ``wait`` (default) returns once the app acked or the ack window passed;
        ``result.acked`` says whether the ack came in time. ``result.response_url`` is a working endpoint.
        """
        ch = self._channel(channel)
        clicker = self._user(user)
        message = self.message(ch, message_ts)
        if message.deleted:
            raise KeyError(f"message {message_ts} in {ch.id} is deleted")
        found = find_action_element(message, action_id, block_id)
        for revision in reversed(message.revisions) if stale and found is None else ():
            found = find_action_element(
                dataclasses.replace(message, blocks=revision.blocks), action_id, block_id
            )
            if found is not None:
                break
        if found is None:
            raise ValueError(f"message {message_ts} has no element with action_id={action_id!r}")
        found_block_id, element = found
        action: JsonDict = {
            "action_id": action_id,
            "block_id": found_block_id,
            "type": element.get("type", "button"),
            "action_ts": f"{time.time():.6f}",
        }
        for key in ("text", "style"):
            if key in element:
                action[key] = element[key]
        chosen = value if value is not None else element.get("value")
        if chosen is not None:
            action["value"] = chosen
        url_id, response_url = self._responses.issue(ch.id, message.ts, clicker.id)
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
        url_id, response_url = self._responses.issue(ch.id, None, caller.id)
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

    # ------------------------------------------------------------------ Socket Mode control

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
        await self._deliverer.disconnect(targets, reason, close_after)

    def go_deaf(self, connection: SocketConnection | None = None) -> SocketConnection:
        """Make a Socket Mode connection half-open: the WebSocket (and its TCP connection) stays up, but from
        now on nothing gets through in either direction. Pings go unanswered, envelopes Slack sends to it are
        lost (so never acked: Slack retries them, on whichever connection is open then), and the app's frames
        (acks) never arrive. The connection still counts as open, and Slack keeps choosing it for deliveries,
        until the app closes it. Default: the only open connection."""
        if connection is None:
            open_now = self.open_connections
            if len(open_now) != 1:
                raise ValueError(f"go_deaf(): {len(open_now)} open connections; name the one to deafen")
            connection = open_now[0]
        if not connection.open:
            raise ValueError(f"go_deaf(): connection {connection.id} is closed")
        connection.deaf = True
        self._notify()
        return connection

    async def drop_connections(self, connection: SocketConnection | None = None) -> None:
        """Abort Socket Mode connections without a close handshake (a network failure)."""
        await self._deliverer.drop([connection] if connection is not None else self.open_connections)

    # ------------------------------------------------------------------ HTTP mode helpers

    def sign(self, body: bytes, timestamp: int | None = None) -> dict[str, str]:
        """``X-Slack-Request-Timestamp`` / ``X-Slack-Signature`` headers for ``body``."""
        return self._deliverer.sign_headers(body, timestamp)

    async def post_to_app(
        self,
        body: bytes | str | JsonDict,
        *,
        url: str | None = None,
        content_type: str = "application/json",
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
        else:
            raw = body.encode() if isinstance(body, str) else body
        sent = {"Content-Type": content_type, "User-Agent": SLACK_USER_AGENT}
        if signature != "missing":
            signed = self.sign(raw, timestamp)
            if signature == "invalid":
                signed["X-Slack-Signature"] = "v0=" + "0" * 64
            sent.update(signed)
        sent.update(headers or {})
        target = url or self.request_url
        if target is None:
            raise RuntimeError("set fake.request_url (the app's URL) or pass url=")
        return await self._deliverer.post(target, raw, sent)

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
        timeout: float = 5.0,
        *,
        description: str | None = None,
    ) -> _T:
        """Wait until ``predicate()`` is truthy and return its value (re-checked on every change of the fake
        and at least every 20 ms, so it may also watch state outside the fake); ``TimeoutError`` otherwise."""
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
        timeout: float = 5.0,
    ) -> Message:
        """The first stored live message that matches (already present or arriving); by default one posted by
        the bot. ``from_bot=None`` matches anyone."""

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

        return await self.wait_for(
            find, timeout, description=f"a message containing {contains!r} in {channel}"
        )

    async def wait_for_call(
        self,
        method: str,
        *,
        count: int = 1,
        predicate: Callable[[RecordedCall], bool] | None = None,
        timeout: float = 5.0,
    ) -> RecordedCall:
        """Wait until ``count`` matching calls of ``method`` were answered (or dropped); return the last one."""

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
        timeout: float = 5.0,
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

    def _channel(self, ref: str | Channel) -> Channel:
        return self.workspace.channel(ref.id if isinstance(ref, Channel) else ref)

    def _user(self, ref: str | User) -> User:
        return self.workspace.user(ref.id if isinstance(ref, User) else ref)

    def _add_fault(self, fault: Fault) -> Fault:
        self._faults.faults.append(fault)
        return fault

    # ------------------------------------------------------------------ Web API endpoint

    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        try:
            args, token, content_type = await parse_api_request(request)
        except ValueError:
            call = self._record(request, method, {}, None, "json")
            return self._finish(call, 200, {"ok": False, "error": "invalid_json"}, "error")
        call = self._record(request, method, args, token, content_type)

        hooked = await self._faults.run_hooks(call, "before")
        if hooked is not None:
            return self._hook_response(request, call, hooked)
        try:
            self._check_auth(method, token)
        except SlackError as exc:
            return self._finish(call, 200, exc.body(), "error")
        fault = self._faults.take_fault(call, after_effect=False)
        if fault is not None:
            return self._fault_response(call, fault)

        try:
            body, applied = await self._webapi.call(method, args)
        except SlackError as exc:
            return self._finish(call, 200, exc.body(), "error")
        call.effect_applied = applied
        self._notify()

        hooked = await self._faults.run_hooks(call, "after_effect")
        if hooked is not None:
            return self._hook_response(request, call, hooked)
        fault = self._faults.take_fault(call, after_effect=True)
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
        headers = {} if fault.retry_after is None else {"Retry-After": str(fault.retry_after)}
        outcome: CallOutcome
        if fault.error == "ratelimited":
            outcome = "ratelimited"
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

    # ------------------------------------------------------------------ events

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
        self._spawn(self._deliver_event(True, ch, event))

    async def _deliver_event(self, deliver: bool, ch: Channel, event: JsonDict) -> Delivery | None:
        self._notify()
        if not deliver or self.bot_user_id not in ch.members:
            return None
        delivery = self._deliverer.new_delivery("events_api", self._wrap_event(event))
        await self._deliverer.send(delivery, 0, None)
        return delivery

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
        if item_type in _INTERACTIVE_TYPES:
            return "interactive", item
        if isinstance(item_type, str):
            return "events_api", self._wrap_event(item)
        raise ValueError("cannot tell what to deliver: give an event, a payload, an envelope or a Delivery")

    async def _interact(
        self,
        kind: DeliveryKind,
        payload: JsonDict,
        url_id: str,
        response_url: str,
        trigger_id: str,
        wait: bool,
    ) -> InteractionResult:
        delivery = self._deliverer.new_delivery(kind, payload)
        attempt = await self._deliverer.send(delivery, 0, None)
        if wait:
            await attempt.wait_settled(self.ack_timeout + 5.0)
        return InteractionResult(
            delivery=delivery,
            response_url=response_url,
            trigger_id=trigger_id,
            _responses=lambda: self._responses.calls_for(url_id),
        )


def _user_id(ref: str | User) -> str:
    return ref.id if isinstance(ref, User) else ref
