"""`DiscordAdapter`: connects one discord.py client to the bridge.

- Intake: every human message (live, or read back from history at startup) becomes `bridge.intake(...)`, in
  the order Discord delivered them, from one owned worker. After every fresh gateway session (a restart, or
  a session Discord did not let us resume) the worker first catches up from history, because the gateway never
  replays what happened while no session was open; only then does it take live messages, so the bridge's
  "last seen" never skips past a missed message.
- Delivery: `DiscordTransport` (nonce + footer marker, paced edits, 2000-character parts).
- Approvals: `ApprovalButton` is registered in `setup_hook` on every start; a click is deferred at once
  (type 6), decided by the bridge, and refused clicks get an ephemeral answer.
- Health: discord.py closes a connection on which no frame (HEARTBEAT_ACK or event) came for
  `heartbeat_timeout` seconds and RESUMEs on a new one (with exponential backoff between failed attempts); a
  RESUME replays what the dead connection missed, a fresh session is followed by a catch-up. The adapter
  watches the frames (debug events) to tell such a stale connection from one the gateway closed, counts both in
  `health()`, and warns once per stale connection.

- Shards: one discord.py client per shard this process runs (`shard_ids` of `shard_count`, default all of
  Discord's recommended count), each with its own gateway session; a separate client that never opens the
  gateway does the REST work (delivery, history, lookups), so a worker that runs no shard connects to nothing
  on the gateway and still delivers. `set_shards` adds and removes shards at runtime without touching the
  others. A shard's fresh session is followed by a catch-up of its own guilds (DMs belong to shard 0). Intake
  stays exactly once because the bridge takes a message id in only once, whichever shard or worker saw it.

Every task the adapter starts (the gateway connections, the intake worker) is owned here and awaited in `stop()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import discord

from adapters.bridge import BridgeLike, ClickOrigin, Place
from adapters.bridge.approvals import Action
from adapters.discord._components import ApprovalButton
from adapters.discord._endpoints import override_endpoints
from adapters.discord._hardening import guard_parsers, install_tolerant_json
from adapters.discord._intake import DM_WORKSPACE, PLATFORM, Converter, is_human
from adapters.discord._options import DiscordConfigError, DiscordSettings
from adapters.discord._render import refusal_text
from adapters.discord._transport import DISCORD_EPOCH_MS, DiscordTransport
from adapters.health import TransportHealth
from harness_core import HarnessClosed

log = logging.getLogger("adapters.discord")

STOP_GRACE = 5.0  # seconds the intake worker gets to finish the message in hand at stop()
RETRY_CAP = 30.0
IDENTIFY_WAIT = 5.0  # discord.py's before_identify_hook sleeps this long before every IDENTIFY but the first


class DiscordStartError(RuntimeError):
    """The adapter could not start (rejected token, missing intent, no gateway session in time)."""


class MessageContentNotEnabled(DiscordStartError):
    """The application may not read message content, so the bot would see blank messages."""

    def __init__(self) -> None:
        super().__init__(
            "the Discord application does not have the MESSAGE_CONTENT privileged intent: enable "
            "'Message Content Intent' on the Bot page of the Discord developer portal (bots in 100 or more "
            "servers need verification for it), or set message_content = false in [adapters.discord] to "
            "answer only mentions, replies to the bot and DMs"
        )


class _Client(discord.Client):
    def __init__(self, adapter: DiscordAdapter, **options: Any) -> None:
        super().__init__(**options)
        self.adapter = adapter
        self.click_handler = adapter  # read by ApprovalButton.callback

    async def setup_hook(self) -> None:
        # Once per login, i.e. on every start of the process: buttons posted by earlier processes stay live.
        self.add_dynamic_items(ApprovalButton)

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        await self.adapter._identify_turn(initial)

    def dispatch(self, event: str, /, *args: Any, **kwargs: Any) -> None:
        # Seen synchronously, in gateway order, before discord.py schedules its handler tasks.
        shard = self.shard_id or 0
        if event == "socket_raw_receive":  # any frame (enable_debug_events): the connection is alive
            self.adapter._frame(shard)
            return  # no handler of ours wants raw frames
        if event == "socket_raw_send":
            return
        if event == "connect":  # a fresh session (READY), not a RESUME: events in between are lost
            self.adapter._fresh_session(shard)
            self.adapter._session_opened(shard)
        elif event == "resumed":
            self.adapter._session_opened(shard)
        elif event == "disconnect":
            self.adapter._disconnected(shard)
        elif event == "message" and args and isinstance(args[0], discord.Message):
            self.adapter._live_message(args[0])
        super().dispatch(event, *args, **kwargs)


@dataclass(eq=False)
class _Shard:
    """One shard this process runs: its own client and gateway session."""

    id: int
    client: _Client
    task: asyncio.Task[None] | None = None
    caught_up: asyncio.Event = field(default_factory=asyncio.Event)
    last_frame: float = field(default_factory=time.perf_counter)  # discord.py's keep-alive clock
    live: bool = False  # a session is open on it (READY or RESUMED, no disconnect since)


class DiscordAdapter:
    name = "discord"

    def __init__(self, settings: DiscordSettings, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock  # Unix seconds, for the age of messages; tests pass the fake Discord's clock
        self.bridge: BridgeLike | None = None
        self.client: _Client | None = None  # REST only (delivery, history, lookups); never opens the gateway
        self.transport: DiscordTransport | None = None
        self.converter: Converter | None = None
        self.catch_ups = 0  # completed catch-ups (one per fresh gateway session of any shard)
        self.caught_up_messages = 0  # messages the latest catch-up fed to the bridge (not seen before)
        self.catch_up_summary: str | None = None  # what the latest catch-up did (the runtime prints it)
        self._queue: deque[discord.Message] = deque()
        self._wake = asyncio.Event()
        self._catch_up_needed: set[int] = set()  # shards whose fresh session was not caught up yet
        self._stopping = False
        self._worker: asyncio.Task[None] | None = None
        self._shards: dict[int, _Shard] = {}
        self._shard_count: int | None = None
        self._shards_lock = asyncio.Lock()
        self._last_identify: float | None = None
        self._identify_lock = asyncio.Lock()
        self._health = TransportHealth("discord")
        self._interval_warned = False

    def __repr__(self) -> str:
        return f"DiscordAdapter(options={self.settings.options!r})"  # never the token

    def health(self) -> TransportHealth:
        """Gateway sessions opened (READY or RESUMED) on any shard, reconnects, stale (deaf) connections
        detected (a copy). `connected`: some shard has a session open."""
        return self._health.copy()

    @property
    def shard_count(self) -> int | None:
        """The shard count in use (from the options or Discord's recommendation), once started."""
        return self._shard_count

    @property
    def shard_ids(self) -> list[int]:
        """The shards this process runs now."""
        return sorted(self._shards)

    def _gateway_tasks(self) -> list[asyncio.Task[None]]:
        return [shard.task for shard in self._shards.values() if shard.task is not None]

    # --- lifecycle ------------------------------------------------------------------------------------------

    def _intents(self) -> discord.Intents:
        intents = discord.Intents.none()
        intents.guilds = True
        intents.guild_messages = True
        intents.dm_messages = True
        intents.message_content = self.settings.options.message_content
        return intents

    def _new_client(self, **extra: Any) -> _Client:
        options = self.settings.options
        client = _Client(
            self,
            intents=self._intents(),
            guild_ready_timeout=options.guild_ready_timeout,
            max_ratelimit_timeout=options.max_ratelimit_timeout,
            heartbeat_timeout=options.heartbeat_timeout,
            enable_debug_events=True,  # socket_raw_receive: when the last frame came (see _disconnected)
            **extra,
        )
        guard_parsers(client)
        return client

    async def start(self, bridge: BridgeLike) -> None:
        if self.client is not None:
            raise RuntimeError("DiscordAdapter.start() was already called")
        options = self.settings.options
        self.bridge = bridge
        override_endpoints(self.settings.api_url, self.settings.gateway_url)
        install_tolerant_json()
        client = self.client = self._new_client()
        self.converter = Converter(client, get_guild=self._get_guild)
        self.transport = DiscordTransport(
            client,
            self.converter,
            edit_interval=options.edit_interval,
            find_scan_limit=options.find_scan_limit,
            catch_up_limit=options.catch_up_limit,
            edit_age_limit=options.edit_age_limit,
            request_timeout=options.request_timeout,
            clock=self.clock,
        )
        try:
            try:
                await client.login(self.settings.token.get_secret_value())
            except discord.LoginFailure:
                raise DiscordStartError("Discord rejected DISCORD_BOT_TOKEN (401 Unauthorized)") from None
            flags = client.application_flags
            if options.message_content and not (
                flags.gateway_message_content or flags.gateway_message_content_limited
            ):
                raise MessageContentNotEnabled()
            count = options.shard_count
            if count is None:
                count, _url, _limits = await client.http.get_bot_gateway()
            ids = list(range(count)) if options.shard_ids is None else options.shard_ids
            if any(shard >= count for shard in ids):
                raise DiscordConfigError(
                    f"adapters.discord.shard_ids: {ids} do not fit the {count} shard(s) Discord recommends; "
                    "set adapters.discord.shard_count to the count the ids were planned for"
                )
        except BaseException:
            await client.close()
            raise
        self._shard_count = count
        self.transport.logged_in = True
        bridge.attach(self.transport)
        self._worker = asyncio.create_task(self._intake_loop(), name="discord-intake")
        try:
            async with self._shards_lock:
                for shard in ids:
                    await self._open_shard(shard, count)
        except BaseException:
            await self.stop()
            raise
        log.info(
            "discord: connected as %s (%s), shard(s) %s of %d",
            client.user,
            client.user.id if client.user else "?",
            ids or "none",
            count,
        )

    async def set_shards(self, ids: Collection[int], count: int) -> None:
        """Run exactly the shards `ids` of `count` from now on: connect the added ones (each returns once its
        session is open and caught up), close the removed ones, leave the others connected. A new `count`
        reconnects every shard (a shard's guilds depend on it). Raises ValueError for ids outside
        0..count-1, `DiscordStartError` when an added shard cannot open a session."""
        wanted = set(ids)
        if count < 1 or any(not 0 <= shard < count for shard in wanted):
            raise ValueError(
                f"set_shards: shard ids {sorted(wanted)} must lie in 0..{count - 1} (count {count})"
            )
        if self.client is None or self._stopping:
            raise RuntimeError("DiscordAdapter.set_shards() needs a started adapter")
        async with self._shards_lock:
            if count != self._shard_count:
                for shard in sorted(self._shards):
                    await self._close_shard(shard)
                self._shard_count = count
            for shard in sorted(set(self._shards) - wanted):
                await self._close_shard(shard)
            for shard in sorted(wanted - set(self._shards)):
                await self._open_shard(shard, count)
        log.info("discord: running shard(s) %s of %d", sorted(wanted) or "none", count)

    async def _open_shard(self, shard_id: int, count: int) -> None:
        client = self._new_client(shard_id=shard_id, shard_count=count)
        shard = self._shards[shard_id] = _Shard(shard_id, client)
        try:
            await client.login(self.settings.token.get_secret_value())
        except BaseException:
            self._shards.pop(shard_id, None)
            await client.close()
            raise
        shard.task = asyncio.create_task(self._run_gateway(shard), name=f"discord-gateway-{shard_id}")
        await self._wait_ready(shard)

    async def _close_shard(self, shard_id: int) -> None:
        shard = self._shards.pop(shard_id, None)
        if shard is None:
            return
        self._catch_up_needed.discard(shard_id)
        shard.live = False
        if not shard.client.is_closed():
            await shard.client.close()
        task = shard.task
        if task is not None:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._health.connected = any(s.live for s in self._shards.values())

    async def _wait_ready(self, shard: _Shard) -> None:
        async def ready() -> None:
            await shard.caught_up.wait()
            await shard.client.wait_until_ready()

        waiter = asyncio.create_task(ready(), name=f"discord-ready-{shard.id}")
        gateway = shard.task
        assert gateway is not None
        try:
            done, _ = await asyncio.wait(
                {waiter, gateway},
                timeout=self.settings.options.ready_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
        if waiter in done and not waiter.cancelled() and waiter.exception() is None:
            return
        error: BaseException | None = None
        if gateway.done() and not gateway.cancelled():
            error = gateway.exception()
        await self._close_shard(shard.id)
        if isinstance(error, discord.PrivilegedIntentsRequired):
            raise MessageContentNotEnabled() from None
        if error is not None:
            raise DiscordStartError(f"the Discord gateway connection failed: {error!r}") from error
        raise DiscordStartError(
            f"no Discord gateway session for shard {shard.id} within {self.settings.options.ready_timeout:g}s"
        )

    async def _run_gateway(self, shard: _Shard) -> None:
        try:
            await shard.client.connect(reconnect=True)
        except Exception as error:
            if not self._stopping and shard.id in self._shards:
                log.error("discord: the gateway connection of shard %d ended: %r", shard.id, error)
            raise

    async def _identify_turn(self, initial: bool) -> None:
        """Before an IDENTIFY on any shard: discord.py's own 5 s wait before a re-IDENTIFY, and at least that
        long between two IDENTIFYs of this process (Discord allows one per 5 s with max_concurrency 1)."""
        if not initial:
            await asyncio.sleep(IDENTIFY_WAIT)
        async with self._identify_lock:
            if self._last_identify is not None:
                wait = self._last_identify + IDENTIFY_WAIT - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
            self._last_identify = time.monotonic()

    async def stop(self) -> None:
        """Stop intake, close every gateway session and the HTTP session, and join every task the adapter
        started."""
        self._stopping = True
        self._wake.set()
        client = self.client
        if self.transport is not None:
            self.transport.logged_in = False
        for shard in list(self._shards.values()):
            if not shard.client.is_closed():
                await shard.client.close()
        if client is not None and not client.is_closed():
            await client.close()
        worker, self._worker = self._worker, None
        if worker is not None:
            try:
                await asyncio.wait_for(asyncio.shield(worker), timeout=STOP_GRACE)
            except TimeoutError:
                worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await worker
        for shard_id in list(self._shards):
            await self._close_shard(shard_id)
        self._health.lost()

    # --- events (called synchronously from the clients' dispatch) ----------------------------------------

    def _get_guild(self, guild_id: int) -> discord.Guild | None:
        """A guild from the cache of whichever shard serves it (None when no shard here does)."""
        for shard in self._shards.values():
            guild = shard.client.get_guild(guild_id)
            if guild is not None:
                return guild
        return None

    def _fresh_session(self, shard_id: int) -> None:
        self._catch_up_needed.add(shard_id)
        self._wake.set()

    def _frame(self, shard_id: int) -> None:
        shard = self._shards.get(shard_id)
        if shard is not None:
            shard.last_frame = time.perf_counter()

    def _session_opened(self, shard_id: int) -> None:
        shard = self._shards.get(shard_id)
        if shard is None:
            return
        self._frame(shard_id)
        shard.live = True
        self._health.opened()
        if self._health.reconnects:
            log.info("discord: gateway session back (connection %d)", self._health.connections_opened)
        client = shard.client
        keep_alive = client.ws._keep_alive if client.ws is not None else None
        timeout = self.settings.options.heartbeat_timeout
        interval = keep_alive.interval if keep_alive is not None else None
        if interval is not None and timeout <= interval + IDENTIFY_WAIT and not self._interval_warned:
            self._interval_warned = True
            log.warning(
                "discord: heartbeat_timeout (%gs) is too short for the gateway's heartbeat interval (%gs) "
                "plus the %gs discord.py waits before a new IDENTIFY: after a session Discord does not "
                "resume, every new one would be taken for dead before it starts",
                timeout,
                interval,
                IDENTIFY_WAIT,
            )

    def _disconnected(self, shard_id: int) -> None:
        """discord.py gave up on a shard's connection (any reason). Stale if nothing came for
        heartbeat_timeout: that is discord.py's own rule (keep-alive thread or receive timeout), so this names
        its decision."""
        shard = self._shards.get(shard_id)
        if shard is None or not shard.live:
            return  # a failed reconnect attempt (that connection was never up), or a shard being closed
        shard.live = False
        silent = time.perf_counter() - shard.last_frame
        timeout = self.settings.options.heartbeat_timeout
        if self._stopping or silent < timeout:
            self._health.lost()
        else:
            reason = f"no frame (heartbeat ACK or event) for {silent:.1f}s, heartbeat_timeout {timeout:g}s"
            self._health.stale(reason)
            log.warning(
                "discord: the gateway connection went silent (%s); reconnecting (stale detection %d)",
                reason,
                self._health.stale_detections,
            )
        self._health.connected = any(s.live for s in self._shards.values())

    def _live_message(self, message: discord.Message) -> None:
        if self._stopping:
            return
        self._queue.append(message)
        self._wake.set()

    # --- the intake worker ------------------------------------------------------------------------------

    async def _intake_loop(self) -> None:
        delay = 1.0
        while not self._stopping:
            try:
                if self._catch_up_needed:
                    shard_id = min(self._catch_up_needed)
                    self._catch_up_needed.discard(shard_id)
                    shard = self._shards.get(shard_id)
                    if shard is None:
                        continue  # closed meanwhile: its guilds are another process's now
                    try:
                        await self._catch_up(shard)
                    except BaseException:
                        if shard_id in self._shards:
                            self._catch_up_needed.add(shard_id)  # try again before any live message
                        raise
                    self.catch_ups += 1
                    shard.caught_up.set()
                elif self._queue:
                    await self._intake_live(self._queue[0])
                    self._queue.popleft()
                else:
                    self._wake.clear()
                    await self._wake.wait()
                delay = 1.0
            except HarnessClosed:
                log.error("discord: the harness is closed; intake stops")
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                # Never skip a message (a later one would move "last seen" past it): retry, in order.
                log.exception("discord: intake failed; retrying in %.0fs", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_CAP)

    async def _intake_live(self, message: discord.Message) -> None:
        assert self.client is not None and self.converter is not None and self.bridge is not None
        user = self.client.user
        if user is None:
            return
        try:
            self.converter.remember(message)
            if not is_human(message, user.id):
                return
            place = await self.converter.place_of(message)
            if place is None:
                return
            incoming = await self.converter.convert(message, place, user.id)
        except (discord.HTTPException, OSError, aiohttp.ClientError, TimeoutError):
            raise  # the network: retried in order
        except Exception as exc:
            # A message whose fields do not make sense fails the same way on every retry: retrying would
            # hold every later message behind it. Dropped, loudly; the bridge never saw it.
            log.error(
                "discord: message %s could not be read and is dropped (%s: %s)",
                message.id,
                type(exc).__name__,
                exc,
            )
            return
        if incoming is not None:
            await self.bridge.intake(incoming)

    async def _catch_up(self, shard: _Shard) -> None:
        """After a fresh session of `shard`, for the guilds it serves (and DMs, on shard 0): known places from
        their last message seen; every other guild channel the bot can read, and active threads under any of
        them, back to the look-back bound (a mention in a channel nobody used with the bot yet, posted while it
        was down, is answered)."""
        assert self.bridge is not None and self.transport is not None
        count = self._shard_count or 1
        places = [p for p in await self.bridge.known_places(PLATFORM) if _shard_of(p, count) == shard.id]
        first_after: str | None = None
        hours = self.settings.options.catch_up_hours
        if hours > 0:
            # The session opened (READY) before its guilds arrived: the channel list needs them.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(shard.client.wait_until_ready(), self.settings.options.ready_timeout)
            places += await self._readable_channels(shard.client, places)
            first_after = await self._look_back_bound(shard.client, hours)
        places += await self._new_threads(places)
        count_in = await self.bridge.catch_up(self.transport, places, first_after=first_after)
        self.caught_up_messages = count_in
        channels = len({(p.workspace, p.channel) for p in places})
        self.catch_up_summary = f"caught up {count_in} message(s) in {channels} channel(s)"
        log.info("discord: %s (%d place(s) with threads)", self.catch_up_summary, len(places))

    async def _look_back_bound(self, client: _Client, hours: float) -> str | None:
        """The id of a (virtual) message at the look-back bound: max(now - hours, first watch of any guild)."""
        assert self.bridge is not None
        since = 0
        for guild in client.guilds:
            since = max(since, await self.bridge.watching_since(PLATFORM, str(guild.id)))
        cutoff_ms = max(int(self.clock() * 1000 - hours * 3_600_000), since, DISCORD_EPOCH_MS)
        return str((cutoff_ms - DISCORD_EPOCH_MS) << 22)

    async def _readable_channels(self, client: _Client, known: list[Place]) -> list[Place]:
        """Text channels of every guild of `client`'s shard the bot can read (view and read history) that are
        not known yet."""
        seen = {(p.workspace, p.channel) for p in known if p.thread is None}
        found: list[Place] = []
        for guild in client.guilds:
            me = guild.me
            for channel in guild.text_channels:
                if me is not None:
                    allowed = channel.permissions_for(me)
                    if not (allowed.view_channel and allowed.read_message_history):
                        continue
                if (str(guild.id), str(channel.id)) not in seen:
                    found.append(Place(PLATFORM, str(guild.id), str(channel.id)))
        return found

    async def _new_threads(self, known: list[Place]) -> list[Place]:
        """Active threads under the channels of `known` that the bridge has not seen yet: started (and maybe
        talked in) while the bot was down."""
        assert self.client is not None
        channels: dict[str, set[str]] = {}
        for place in known:
            if place.workspace != DM_WORKSPACE and place.thread is None:
                channels.setdefault(place.workspace, set()).add(place.channel)
        seen = set(known)
        found: list[Place] = []
        for guild_id, channel_ids in channels.items():
            try:
                guild = self._get_guild(int(guild_id)) or await self.client.fetch_guild(int(guild_id))
                threads = await guild.active_threads()
            except (discord.HTTPException, OSError) as error:
                log.warning("discord: cannot list the active threads of guild %s: %s", guild_id, error)
                continue
            for thread in threads:
                place = Place(PLATFORM, guild_id, str(thread.parent_id), thread=str(thread.id))
                if str(thread.parent_id) in channel_ids and place not in seen:
                    seen.add(place)
                    found.append(place)
        return found

    # --- approval clicks -------------------------------------------------------------------------------

    async def handle_click(self, interaction: discord.Interaction[Any], gate_id: int, action: str) -> None:
        """Commit the click, then acknowledge it (type 6, within Discord's 3 s): a crash before the commit
        leaves the interaction unacknowledged, so the clicker sees it fail and clicks again."""
        user = interaction.user
        groups = [str(role.id) for role in user.roles] if isinstance(user, discord.Member) else []
        bridge = self.bridge
        verb: Action = "approve" if action == "approve" else "withdraw" if action == "withdraw" else "deny"
        decision = None
        if bridge is not None:
            message = interaction.message
            origin = ClickOrigin(
                str(interaction.channel_id or ""), str(message.id) if message is not None else ""
            )
            try:  # one local commit, no platform call: well within the 3 s
                decision = await bridge.decide(
                    gate_id,
                    user_id=str(user.id),
                    user_name=user.display_name,
                    action=verb,
                    user_groups=groups,
                    origin=origin,
                    platform=PLATFORM,
                )
            except Exception:
                log.exception("discord: recording a click on gate %s failed", gate_id)
                await self._respond(interaction)
                await self._tell(interaction, "Your click could not be recorded; please try again.")
                return
        await self._respond(interaction)
        if decision is not None and not decision.accepted:
            await self._tell(
                interaction,
                refusal_text(decision.reason, decision.status, decision.decided_by, decision.decided_at),
            )
        # Accepted: the bridge edits the request message (with the bot token) to show who decided.

    @staticmethod
    async def _respond(interaction: discord.Interaction[Any]) -> None:
        try:
            await interaction.response.defer()
        except discord.HTTPException as error:
            log.warning("discord: could not acknowledge a click: %s", error)

    @staticmethod
    async def _tell(interaction: discord.Interaction[Any], text: str) -> None:
        try:
            await interaction.followup.send(text, ephemeral=True)
        except discord.HTTPException as error:
            log.warning("discord: could not answer a click: %s", error)


def _shard_of(place: Place, shard_count: int) -> int:
    """The shard that receives a place's events: Discord's `(guild_id >> 22) % shard_count`; DMs come to
    shard 0."""
    if place.workspace == DM_WORKSPACE:
        return 0
    try:
        return (int(place.workspace) >> 22) % shard_count
    except ValueError:
        return 0
