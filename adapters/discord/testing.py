"""A loopback fake Discord (REST + gateway) that drives the real discord.py client.

Use it to test a Discord bot end to end without Discord: the fake is a real aiohttp server on 127.0.0.1 (an
ephemeral port) speaking the REST API under ``/api/v10`` and the gateway protocol (HELLO, IDENTIFY/READY,
GUILD_CREATE, heartbeats, sequence numbers, RESUME, zlib-stream compression). Point discord.py at it with
:func:`adapters.discord._endpoints.override_endpoints` (or the ``DISCORD_API_URL`` / ``DISCORD_GATEWAY_URL``
environment variables the adapter reads), in this process or in a bot subprocess::

    async with FakeDiscord(heartbeat_interval=0.5) as fake:
        guild = fake.add_guild("Ops")
        general = fake.add_text_channel(guild, "general")
        alice = fake.add_user("alice", global_name="Alice")
        previous = override_endpoints(fake.api_url, fake.gateway_url)
        ...  # start discord.Client(intents=..., guild_ready_timeout=0.05) with fake.token
        session = await fake.wait_for_session()
        assert session.message_content_requested
        asked = await fake.user_sends(general, alice, "deploy web-1 please")
        answer = await fake.wait_for_message(general, predicate=lambda m: m.reply_to == asked.id)
        click = await fake.click(answer, "approve:42", alice)
        assert click.answered_in_time and click.response_type == 6

What the fake enforces, like Discord: bot-token auth (401), the 2000-character limit and empty messages
(400, Discord's error shapes), ``nonce`` + ``enforce_nonce`` dedupe per author within ``nonce_window``,
replies (``message_reference``), threads whose id is the starter message id (one per message, 160004),
edits by the author only (50005), error 30046 for bot-token edits of messages older than one hour,
MESSAGE_CONTENT (blank content for non-mentions when the intent was not requested or not granted), the 3-second
interaction deadline (10062), one initial response per interaction (40060), 15-minute interaction tokens
(50027), ephemeral messages (flag 64, never in history nor on the gateway), no replay across a fresh IDENTIFY.

Time-dependent rules use :attr:`FakeDiscord.clock`, which a test can :meth:`~FakeClock.advance`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Self, TypeVar

from aiohttp import web

from adapters.discord._endpoints import Endpoints, override_endpoints
from adapters.discord._fake_gateway import FakeGateway, GatewayConnection, GatewaySession
from adapters.discord._fake_models import (
    ALL_INTENT_BITS,
    ChannelType,
    DiscordAPIError,
    FakeChannel,
    FakeClock,
    FakeGuild,
    FakeMember,
    FakeMessage,
    FakeRole,
    FakeUser,
    GatewayIntent,
    InteractionCallbackType,
    InteractionRecord,
    InteractionResponse,
    MessageFlag,
    MessageType,
    MessageVersion,
)
from adapters.discord._fake_rest import (
    FakeResponse,
    HookWhen,
    RequestHook,
    RequestHookFn,
    RequestRecord,
    RestApi,
)
from adapters.discord._fake_state import World

__all__ = [
    "ChannelType",
    "DiscordAPIError",
    "Endpoints",
    "FakeChannel",
    "FakeClock",
    "FakeDiscord",
    "FakeGuild",
    "FakeMember",
    "FakeMessage",
    "FakeResponse",
    "FakeRole",
    "FakeUser",
    "GatewayConnection",
    "GatewayIntent",
    "GatewaySession",
    "InteractionCallbackType",
    "InteractionRecord",
    "InteractionResponse",
    "MessageFlag",
    "MessageType",
    "MessageVersion",
    "RequestHook",
    "RequestRecord",
    "UnhandledRequestsError",
    "override_endpoints",
]

T = TypeVar("T")
ChannelRef = FakeChannel | int
MessageRef = FakeMessage | int


def _process_state(pid: int) -> str | None:
    """The state letter from /proc/<pid>/stat ("R", "S", "Z", ...), "gone" if it has no entry, or None when
    there is no /proc (not Linux). Reading /proc does not block."""
    if not os.path.isdir("/proc/self"):
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return "gone"
    return fields[0] if fields else "gone"


async def _wait_until_dead(pid: int, limit: float = 2.0) -> None:
    """Wait (up to ``limit`` s) until ``pid`` is a zombie or gone, so no response can reach it. Without /proc
    it returns at once, which is still safe in practice: a SIGKILLed process runs no more user code."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while loop.time() < deadline:
        state = _process_state(pid)
        if state is None or state in ("gone", "Z", "X", "x"):
            return
        await asyncio.sleep(0.002)


class UnhandledRequestsError(AssertionError):
    """The bot called REST routes the fake does not implement (raised by a strict fake on exit)."""


class FakeDiscord:
    """A fake Discord server for one bot application. See the module docstring for an overview.

    Parameters (all optional):

    - ``token``: the bot token the fake accepts (REST ``Authorization: Bot <token>`` and IDENTIFY/RESUME).
    - ``bot_name``, ``bot_user_id``, ``application_id``: the bot user; the application id defaults to the
      bot user's id, as for applications created since 2020.
    - ``heartbeat_interval``: seconds, sent in HELLO (Discord uses 41.25; tests want ~0.5).
    - ``message_content_granted``: whether the MESSAGE_CONTENT privileged intent is enabled for the app. When
      False (or when a session did not request the intent), message content, embeds, attachments and
      components are blank except in DMs, the bot's own messages and messages that mention the bot.
      The application's flags (``GET /oauth2/applications/@me``) show it as Discord does for an app in fewer
      than 100 servers: ``GATEWAY_MESSAGE_CONTENT_LIMITED`` when enabled, neither content flag when not.
      Mutable at runtime via :attr:`message_content_granted`.
    - ``reject_ungranted_privileged_intents``: close an IDENTIFY that requests a privileged intent that is not
      granted with 4014 (discord.py raises ``PrivilegedIntentsRequired``), as Discord does for unverified apps.
    - ``nonce_window``: seconds during which ``enforce_nonce`` dedupes (Discord says "a few minutes").
    - ``interaction_deadline``: seconds to answer an interaction (3.0); later callbacks get 10062.
    - ``interaction_token_lifetime``: seconds interaction follow-ups and ``@original`` edits work (900).
    - ``old_message_edit_limit``: bot-token edits of messages older than one hour that succeed per channel per
      rolling hour before 30046. Discord does not publish the number; 0 (default) rejects all of them.
    - ``resume_timeout``: seconds a dropped session stays resumable.
    - ``gateway_compression``: honour ``compress=zlib-stream``/``zstd-stream`` (default); False sends
      uncompressed text frames, which discord.py also accepts (useful when reading frames in a debugger).
    - ``recommended_shards``: the ``shards`` count ``GET /gateway/bot`` recommends (mutable via
      :attr:`recommended_shards`). Sharding itself is always on: an IDENTIFY with ``shard: [id, count]`` gets
      READY/GUILD_CREATE and events only for guilds with ``(guild_id >> 22) % count == id`` (and DMs only on
      shard 0), as on Discord; a shard id outside ``0..count-1`` is closed with 4010.
    - ``strict``: leaving ``async with`` without an exception raises :class:`UnhandledRequestsError` when the
      bot called a route the fake does not implement.
    """

    def __init__(
        self,
        *,
        token: str = "fake-bot-token",
        bot_name: str = "durable-bot",
        bot_user_id: int | None = None,
        application_id: int | None = None,
        heartbeat_interval: float = 41.25,
        message_content_granted: bool = True,
        reject_ungranted_privileged_intents: bool = False,
        nonce_window: float = 300.0,
        interaction_deadline: float = 3.0,
        interaction_token_lifetime: float = 900.0,
        old_message_edit_limit: int = 0,
        resume_timeout: float = 120.0,
        gateway_compression: bool = True,
        strict: bool = True,
        host: str = "127.0.0.1",
        recommended_shards: int = 1,
    ) -> None:
        self.clock = FakeClock()
        self.strict = strict
        self._host = host
        self._world = World(
            clock=self.clock,
            token=token,
            bot_name=bot_name,
            application_id=application_id,
            bot_user_id=bot_user_id,
            nonce_window=nonce_window,
            interaction_deadline=interaction_deadline,
            interaction_token_lifetime=interaction_token_lifetime,
            old_message_edit_limit=old_message_edit_limit,
            message_content_granted=message_content_granted,
        )
        self._waiters: list[asyncio.Future[None]] = []
        self._gateway = FakeGateway(
            self._world,
            heartbeat_interval=heartbeat_interval,
            compression=gateway_compression,
            resume_timeout=resume_timeout,
            reject_ungranted_privileged_intents=reject_ungranted_privileged_intents,
            granted_privileged_intents=self._granted_privileged_intents,
            notify=self._notify,
        )
        self._world.sink = self._gateway
        self._world.on_change = self._notify
        self._rest = RestApi(self._world, notify=self._notify)
        self._rest.recommended_shards = recommended_shards
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    # --- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> Self:
        """Start serving on an ephemeral port of ``host``. Returns self."""
        if self._runner is not None:
            raise RuntimeError("FakeDiscord is already started")
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/gateway", self._gateway.handle)
        app.router.add_get("/gateway/resume", self._gateway.handle)
        app.router.add_route("*", r"/api/v{version:\d+}/{tail:.*}", self._rest.handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((self._host, 0))
        site = web.SockSite(runner, sock)
        await site.start()
        self._runner = runner
        self._port = int(sock.getsockname()[1])
        self._gateway.gateway_url = f"ws://{self._host}:{self._port}/gateway"
        self._gateway.resume_gateway_url = f"ws://{self._host}:{self._port}/gateway/resume"
        self._rest.gateway_url = self._gateway.gateway_url
        return self

    async def stop(self) -> None:
        """Close every gateway connection (1001) and stop the server. Idempotent."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        await self._gateway.shutdown()
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
        if exc_type is None and self.strict:
            self.assert_no_unhandled_requests()

    # --- addresses and identity -----------------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        """The REST base, like discord.py's ``Route.BASE``: ``http://127.0.0.1:<port>/api/v10``."""
        return f"http://{self._host}:{self._require_port()}/api/v10"

    @property
    def gateway_url(self) -> str:
        """The gateway URL for ``DiscordWebSocket.DEFAULT_GATEWAY``: ``ws://127.0.0.1:<port>/gateway``."""
        return f"ws://{self._host}:{self._require_port()}/gateway"

    @property
    def endpoints(self) -> Endpoints:
        return Endpoints(api_url=self.api_url, gateway_url=self.gateway_url)

    def env(self) -> dict[str, str]:
        """Environment variables for a bot subprocess: ``DISCORD_API_URL``, ``DISCORD_GATEWAY_URL``,
        ``DISCORD_BOT_TOKEN``."""
        return {
            "DISCORD_API_URL": self.api_url,
            "DISCORD_GATEWAY_URL": self.gateway_url,
            "DISCORD_BOT_TOKEN": self.token,
        }

    def _require_port(self) -> int:
        if self._port is None:
            raise RuntimeError(
                "FakeDiscord is not started (use `async with FakeDiscord() as fake` or `await fake.start()`)"
            )
        return self._port

    @property
    def token(self) -> str:
        return self._world.token

    @property
    def bot(self) -> FakeUser:
        """The bot's own user."""
        return self._world.bot

    @property
    def application_id(self) -> int:
        return self._world.application_id

    @property
    def message_content_granted(self) -> bool:
        return self._world.message_content_granted

    @message_content_granted.setter
    def message_content_granted(self, value: bool) -> None:
        self._world.message_content_granted = value

    @property
    def nonce_window(self) -> float:
        """Seconds during which ``enforce_nonce`` returns the earlier message (mutable)."""
        return self._world.nonce_window

    @nonce_window.setter
    def nonce_window(self, value: float) -> None:
        self._world.nonce_window = value

    @property
    def old_message_edit_limit(self) -> int:
        return self._world.old_message_edit_limit

    @old_message_edit_limit.setter
    def old_message_edit_limit(self, value: int) -> None:
        self._world.old_message_edit_limit = value

    @property
    def ack_heartbeats(self) -> bool:
        """Set False to stop answering heartbeats (a zombie connection: discord.py reconnects and resumes)."""
        return self._gateway.ack_heartbeats

    @ack_heartbeats.setter
    def ack_heartbeats(self, value: bool) -> None:
        self._gateway.ack_heartbeats = value

    def _granted_privileged_intents(self) -> int:
        granted = GatewayIntent.GUILD_MEMBERS | GatewayIntent.GUILD_PRESENCES
        if self._world.message_content_granted:
            granted |= GatewayIntent.MESSAGE_CONTENT
        return int(granted)

    # --- world setup ----------------------------------------------------------------------------------------

    def add_user(
        self, username: str, global_name: str | None = None, *, id: int | None = None, bot: bool = False
    ) -> FakeUser:
        return self._world.add_user(username, global_name, id=id, bot=bot)

    def add_guild(self, name: str, *, id: int | None = None, owner: FakeUser | None = None) -> FakeGuild:
        """A guild with an @everyone role (id == guild id) and the bot as a member. Dispatches GUILD_CREATE
        when a bot is already connected."""
        return self._world.add_guild(name, id=id, owner=owner)

    def add_role(
        self, guild: FakeGuild, name: str, *, permissions: int = 0, id: int | None = None
    ) -> FakeRole:
        return self._world.add_role(guild, name, permissions=permissions, id=id)

    def add_member(
        self, guild: FakeGuild, user: FakeUser, *, roles: Iterable[FakeRole] = (), nick: str | None = None
    ) -> FakeMember:
        """Add ``user`` to ``guild`` with ``roles`` (or update an existing member's roles and nick)."""
        return self._world.add_member(guild, user, roles=roles, nick=nick)

    def add_text_channel(
        self, guild: FakeGuild, name: str, *, topic: str | None = None, id: int | None = None
    ) -> FakeChannel:
        return self._world.add_text_channel(guild, name, topic=topic, id=id)

    def dm_channel(self, user: FakeUser) -> FakeChannel:
        """The DM channel between the bot and ``user``."""
        return self._world.dm_channel(user)

    # --- user actions ---------------------------------------------------------------------------------------

    async def user_sends(
        self,
        channel: ChannelRef,
        user: FakeUser,
        content: str,
        *,
        reply_to: MessageRef | None = None,
        mention_author: bool = True,
        components: list[dict[str, object]] | None = None,
    ) -> FakeMessage:
        """``user`` posts ``content`` in a channel, thread or DM: stored, then MESSAGE_CREATE to connected
        sessions (awaited until written). Users who are not members of the guild join it first.

        ``reply_to`` makes it a reply (type 19); ``mention_author`` pings the replied-to author, which puts
        them in ``mentions`` (so a reply to the bot carries content even without MESSAGE_CONTENT).
        """
        ch = self.channel(channel)
        if ch.is_dm and ch.recipient is not user:
            raise ValueError(f"{user.username} is not the recipient of DM channel {ch.id}")
        self._world.ensure_member(ch, user)
        reference = None
        if reply_to is not None:
            target = self.message(reply_to)
            reference = {"message_id": str(target.id), "channel_id": str(target.channel_id)}
        msg, _ = self._world.create_message(
            ch,
            user,
            content=content,
            message_reference=reference,
            mention_replied_user=mention_author,
            components=[dict(c) for c in components] if components else None,
        )
        await self._gateway.flush()
        return msg

    async def user_sends_in_thread(
        self, thread: ChannelRef, user: FakeUser, content: str, *, reply_to: MessageRef | None = None
    ) -> FakeMessage:
        """Like :meth:`user_sends`, checking that ``thread`` is a thread (thread ids are channel ids)."""
        ch = self.channel(thread)
        if not ch.is_thread:
            raise ValueError(f"channel {ch.id} is not a thread")
        return await self.user_sends(ch, user, content, reply_to=reply_to)

    async def user_creates_thread(
        self, channel: ChannelRef, message: MessageRef, name: str, user: FakeUser
    ) -> FakeChannel:
        """``user`` starts a public thread on ``message``: THREAD_CREATE, then the THREAD_STARTER_MESSAGE
        (type 21) MESSAGE_CREATE in the thread. The thread's id equals the message's id."""
        ch = self.channel(channel)
        self._world.ensure_member(ch, user)
        thread = self._world.create_thread(ch, self._message_id(message), name=name, owner=user)
        await self._gateway.flush()
        return thread

    async def user_edits(self, message: MessageRef, content: str) -> FakeMessage:
        """The author edits their message: MESSAGE_UPDATE with the full message."""
        msg = self.message(message)
        self._world.edit_message(msg, {"content": content}, editor=msg.author, enforce_age_limit=False)
        await self._gateway.flush()
        return msg

    def gateway_payload(self, message: MessageRef) -> dict[str, object]:
        """The MESSAGE_CREATE payload of a stored message, as a session with every intent gets it (a starting
        point for `dispatch_raw` with fields changed)."""
        return dict(
            self._world.message_payload(self.message(message), session_intents=ALL_INTENT_BITS, gateway=True)
        )

    async def dispatch_raw(self, event: str, data: object, *, guild_id: int | None = None) -> None:
        """Send a dispatch exactly as given (any shape: tests of what a bot does with hostile payloads) to every
        connected session, and wait until it is written. Nothing is stored in the fake's world."""
        self._gateway.dispatch(event, lambda _intents: data, intents=0, guild_id=guild_id)  # type: ignore[arg-type,return-value]
        await self._gateway.flush()

    async def user_deletes(self, message: MessageRef) -> None:
        """The message disappears from history; MESSAGE_DELETE is dispatched."""
        self._world.delete_message(self.message(message))
        await self._gateway.flush()

    async def click(
        self,
        message: MessageRef,
        custom_id: str,
        user: FakeUser,
        *,
        wait: bool = True,
        timeout: float | None = None,
    ) -> InteractionRecord:
        """``user`` clicks the button ``custom_id`` on ``message``: INTERACTION_CREATE (type 3, component).

        With ``wait`` (default) returns once the bot's initial response was accepted or the deadline passed
        on the fake clock (real-time bound: ``timeout``, default deadline + 2 s). The returned record is live:
        follow-ups and ``@original`` edits that come later show up in it. If no gateway session is connected
        nothing is delivered (``record.delivered`` is False), as when a user clicks while the bot is down.
        Raises ValueError when the message has no such (enabled) component.
        """
        return await self._interact(message, custom_id, user, None, wait=wait, timeout=timeout)

    async def select(
        self,
        message: MessageRef,
        custom_id: str,
        user: FakeUser,
        values: list[str],
        *,
        wait: bool = True,
        timeout: float | None = None,
    ) -> InteractionRecord:
        """Like :meth:`click` for a select menu, choosing ``values``."""
        return await self._interact(message, custom_id, user, values, wait=wait, timeout=timeout)

    async def _interact(
        self,
        message: MessageRef,
        custom_id: str,
        user: FakeUser,
        values: list[str] | None,
        *,
        wait: bool,
        timeout: float | None,
    ) -> InteractionRecord:
        world = self._world
        record = world.create_component_interaction(self.message(message), custom_id, user, values=values)

        def sent() -> None:
            if record.dispatched_at is None:
                record.dispatched_at = self.clock.now()
                record.delivered = True
                self._notify()

        futures = self._gateway.dispatch(
            "INTERACTION_CREATE",
            lambda _: world.interaction_payload(record),
            intents=0,
            guild_id=record.guild_id,
            on_sent=sent,
        )
        if futures:
            await asyncio.wait(futures, timeout=5.0)
        if wait and record.delivered:
            limit = record.deadline + 2.0 if timeout is None else timeout
            await self.wait_for(
                lambda: record.responded or record.expired(self.clock.now()),
                timeout=limit,
                what=f"a response to interaction {record.id} ({custom_id!r})",
            )
        return record

    def add_message(
        self,
        channel: ChannelRef,
        author: FakeUser,
        content: str,
        *,
        components: list[dict[str, object]] | None = None,
        reply_to: MessageRef | None = None,
        age: float = 0.0,
    ) -> FakeMessage:
        """Store a message in history without dispatching anything, as if it was posted before the bot
        connected (by a user, or by the bot's previous run: e.g. an approval message with buttons).
        ``age`` back-dates its timestamp (its id still sorts after earlier messages)."""
        ch = self.channel(channel)
        self._world.ensure_member(ch, author)
        reference = None
        if reply_to is not None:
            target = self.message(reply_to)
            reference = {"message_id": str(target.id), "channel_id": str(target.channel_id)}
        msg, _ = self._world.create_message(
            ch,
            author,
            content=content,
            components=[dict(c) for c in components] if components else None,
            message_reference=reference,
            dispatch=False,
        )
        msg.created_at -= age
        return msg

    def age_message(self, message: MessageRef, seconds: float) -> FakeMessage:
        """Pretend ``message`` was created ``seconds`` earlier (its id is unchanged). For the 1-hour edit rule
        without moving the whole clock. A client that dates messages by their id (the adapter does) still sees
        it as fresh: this models Discord's clock disagreeing with the bot's. To age a message for both, advance
        :attr:`clock` and give the client that clock."""
        msg = self.message(message)
        msg.created_at -= seconds
        return msg

    # --- gateway control ------------------------------------------------------------------------------------

    @property
    def sessions(self) -> list[GatewaySession]:
        """Every gateway session (one per IDENTIFY), oldest first."""
        return list(self._gateway.sessions)

    @property
    def connections(self) -> list[GatewayConnection]:
        """Every websocket connection, oldest first (RESUMEs open new connections on existing sessions)."""
        return list(self._gateway.connections)

    @property
    def recommended_shards(self) -> int:
        """The ``shards`` count ``GET /gateway/bot`` answers."""
        return self._rest.recommended_shards

    @recommended_shards.setter
    def recommended_shards(self, value: int) -> None:
        self._rest.recommended_shards = value

    @staticmethod
    def shard_of(guild: FakeGuild | int, shard_count: int) -> int:
        """Discord's rule for which shard receives a guild's events: ``(guild_id >> 22) % shard_count``."""
        guild_id = guild if isinstance(guild, int) else guild.id
        return (guild_id >> 22) % shard_count

    @property
    def connected_sessions(self) -> list[GatewaySession]:
        return [s for s in self._gateway.sessions if s.connected]

    async def request_reconnect(self) -> int:
        """Send op 7 RECONNECT: discord.py closes and RESUMEs at ``resume_gateway_url``."""
        count = self._gateway.request_reconnect()
        await self._gateway.flush()
        return count

    async def invalidate_sessions(self, *, resumable: bool = False) -> int:
        """Send op 9 INVALID_SESSION. With ``resumable=False`` discord.py re-IDENTIFYs (after a 5 s sleep in its
        default ``before_identify_hook``) and gets a new session: nothing is replayed."""
        count = self._gateway.invalidate_sessions(resumable=resumable)
        await self._gateway.flush()
        return count

    def hold_new_connections(self) -> None:
        """Accept new gateway websockets but withhold HELLO (the client waits) until
        :meth:`release_new_connections`. Lets a test act while a bot is reconnecting, deterministically."""
        self._gateway.hold_new_connections()

    def release_new_connections(self) -> None:
        self._gateway.release_new_connections()

    def go_deaf(self, connection: GatewayConnection | None = None) -> GatewayConnection:
        """Make a gateway connection half-open: the websocket stays up, but from now on the client hears
        nothing on it: no HEARTBEAT_ACK, no dispatch, no op. Its session goes on numbering and logging events
        (a RESUME on a new connection replays them) until the client gives up on the connection. Default: the
        one open connection of a connected session."""
        if connection is None:
            live = [c for c in self._gateway.connections if c.open and c.session is not None]
            if len(live) != 1:
                raise ValueError(
                    f"go_deaf(): {len(live)} identified open connections; name the one to deafen"
                )
            connection = live[0]
        if not connection.open:
            raise ValueError(f"go_deaf(): connection {connection.id} is closed")
        connection.deaf = True
        self._notify()
        return connection

    async def drop_connections(self, code: int = 4000) -> int:
        """Close every gateway websocket with ``code``. 4000 keeps sessions resumable; 4004/4010-4014 end them."""
        count = self._gateway.drop_connections(code)
        await self._gateway.flush()
        return count

    # --- REST hooks and faults ------------------------------------------------------------------------------

    def on_request(
        self,
        method: str,
        route: str,
        hook: RequestHookFn,
        *,
        when: HookWhen = "before",
        times: int | None = None,
        match: Callable[[RequestRecord], bool] | None = None,
    ) -> RequestHook:
        """Run ``hook(record)`` (sync or async) when a matching request arrives.

        ``method`` is an HTTP method or ``"*"``; ``route`` a template like ``/channels/{channel_id}/messages``
        (placeholders match any segment) or a concrete path, without the ``/api/v10`` prefix. ``when="before"``
        runs before the fake acts: returning a :class:`FakeResponse` answers with it and skips the effect.
        ``when="after_effect"`` runs after the fake stored/edited/responded but before the response is sent:
        returning a response replaces the real one (``record.effect`` says whether anything was applied).
        ``times`` limits how often it fires; ``match`` filters on the record (e.g. its JSON body).
        """
        return self._rest.add_hook(RequestHook(method, route, hook, when, times, match))

    def rate_limit(
        self,
        method: str,
        route: str,
        *,
        times: int = 1,
        retry_after: float = 0.05,
        is_global: bool = False,
        match: Callable[[RequestRecord], bool] | None = None,
    ) -> RequestHook:
        """Answer the next ``times`` matching requests with 429 (``retry_after`` in body, ``Retry-After`` and
        ``X-RateLimit-*`` headers); nothing is applied. discord.py sleeps ``retry_after`` and retries."""
        response = FakeResponse.rate_limited(retry_after, is_global=is_global)
        return self.on_request(method, route, lambda _: response, when="before", times=times, match=match)

    def fail(
        self,
        method: str,
        route: str,
        *,
        status: int = 500,
        times: int = 1,
        after_effect: bool = False,
        match: Callable[[RequestRecord], bool] | None = None,
    ) -> RequestHook:
        """Answer the next ``times`` matching requests with ``status`` (5xx by default).

        ``after_effect=True`` applies the request first (the message *is* stored) and then answers the error:
        the dangerous case where a client retries a POST that succeeded. discord.py retries 500/502/504/524
        (sleeping 1 + 2·attempt seconds) and its ``enforce_nonce`` makes the retry return the same message.
        """
        response = FakeResponse.error(status, 0, f"{status}: fake server error")
        when: HookWhen = "after_effect" if after_effect else "before"
        return self.on_request(method, route, lambda _: response, when=when, times=times, match=match)

    def kill_on(
        self,
        method: str,
        route: str,
        pid: int,
        *,
        times: int = 1,
        sig: int = signal.SIGKILL,
        match: Callable[[RequestRecord], bool] | None = None,
    ) -> RequestHook:
        """Send ``sig`` (SIGKILL) to ``pid`` right after the fake applied a matching request (message stored,
        edit saved, interaction answered) and before the response goes out: the client dies not knowing
        whether its request succeeded. Requests that applied nothing (errors, dedupes) do not trigger it.
        ``record.killed_pid`` is set on the request that fired."""

        async def kill(record: RequestRecord) -> None:
            os.kill(pid, sig)
            record.killed_pid = pid
            if sig == signal.SIGKILL:
                await _wait_until_dead(pid)

        def applied(record: RequestRecord) -> bool:
            return record.effect and (match is None or match(record))

        return self.on_request(method, route, kill, when="after_effect", times=times, match=applied)

    # --- inspection -----------------------------------------------------------------------------------------

    @property
    def requests(self) -> list[RequestRecord]:
        """Every REST request in arrival order."""
        return list(self._rest.records)

    @property
    def unhandled_requests(self) -> list[RequestRecord]:
        return list(self._rest.unhandled)

    def assert_no_unhandled_requests(self) -> None:
        if self._rest.unhandled:
            listing = ", ".join(f"{r.method} {r.path}" for r in self._rest.unhandled)
            raise UnhandledRequestsError(f"the bot called routes the fake does not implement: {listing}")

    def calls(self, method: str | None = None, route: str | None = None) -> list[RequestRecord]:
        """Requests filtered by method and by route template or concrete path (see :meth:`on_request`)."""
        if route is None:
            return [r for r in self._rest.records if method is None or r.method == method.upper()]
        probe = RequestHook(method or "*", route, lambda _: None, "before", None)
        return [r for r in self._rest.records if probe.matches(r)]

    def channel(self, channel: ChannelRef) -> FakeChannel:
        if isinstance(channel, FakeChannel):
            return channel
        try:
            return self._world.channels[channel]
        except KeyError:
            raise KeyError(f"no channel {channel}") from None

    def message(self, message: MessageRef) -> FakeMessage:
        """A stored message by id (including ephemeral and deleted ones)."""
        if isinstance(message, FakeMessage):
            return message
        try:
            return self._world.messages[message]
        except KeyError:
            raise KeyError(f"no message {message}") from None

    def messages(self, channel: ChannelRef, *, include_deleted: bool = False) -> list[FakeMessage]:
        """A channel's or thread's messages, oldest first (ephemeral messages are never in a channel)."""
        ch = self.channel(channel)
        return list(ch.messages) if include_deleted else ch.visible_messages()

    def bot_messages(self, channel: ChannelRef) -> list[FakeMessage]:
        return [m for m in self.messages(channel) if m.author is self.bot]

    @property
    def ephemeral_messages(self) -> list[FakeMessage]:
        """Ephemeral interaction messages (``ephemeral_for`` is the user who sees them)."""
        return list(self._world.ephemeral_messages)

    @property
    def interactions(self) -> list[InteractionRecord]:
        return list(self._world.interactions.values())

    def _message_id(self, message: MessageRef) -> int:
        return message.id if isinstance(message, FakeMessage) else message

    # --- waiting --------------------------------------------------------------------------------------------

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_for(
        self,
        predicate: Callable[[], T | None],
        timeout: float = 5.0,
        *,
        what: str | None = None,
    ) -> T:
        """Wait until ``predicate()`` returns something truthy and return it.

        Re-checked on every change the fake sees (requests, messages, gateway frames) and at least every 50 ms
        (for clock-based conditions). Raises ``TimeoutError`` after ``timeout`` real seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            value = predicate()
            if value:
                return value
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what or 'a condition'}")
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait([waiter], timeout=min(remaining, 0.05))
            finally:
                if not waiter.done():
                    waiter.cancel()

    async def wait_for_session(self, timeout: float = 10.0) -> GatewaySession:
        """The newest connected gateway session (after its IDENTIFY or RESUME)."""
        return await self.wait_for(
            lambda: next(reversed(self.connected_sessions), None), timeout=timeout, what="a gateway session"
        )

    async def wait_for_message(
        self,
        channel: ChannelRef,
        *,
        author: FakeUser | None = None,
        predicate: Callable[[FakeMessage], bool] | None = None,
        count: int = 1,
        timeout: float = 5.0,
    ) -> FakeMessage:
        """The ``count``-th visible message in ``channel`` by ``author`` (default: the bot) that matches
        ``predicate``, oldest first."""
        who = author or self.bot
        ch = self.channel(channel)

        def found() -> FakeMessage | None:
            hits = [
                m for m in ch.visible_messages() if m.author is who and (predicate is None or predicate(m))
            ]
            return hits[count - 1] if len(hits) >= count else None

        return await self.wait_for(
            found, timeout=timeout, what=f"message #{count} by {who.username} in {ch.id}"
        )

    async def wait_for_request(
        self,
        method: str,
        route: str,
        *,
        count: int = 1,
        timeout: float = 5.0,
    ) -> RequestRecord:
        """The ``count``-th answered request matching ``method`` and ``route``."""

        def found() -> RequestRecord | None:
            hits = [r for r in self.calls(method, route) if r.status is not None]
            return hits[count - 1] if len(hits) >= count else None

        return await self.wait_for(found, timeout=timeout, what=f"request #{count} {method} {route}")
