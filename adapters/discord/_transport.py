"""`DiscordTransport`: the bridge's `Transport` over discord.py's REST client.

Everything goes through channel ids (`PartialMessageable`), never through the gateway cache, so delivery works
as soon as the client has logged in, for channels, threads (a thread is a channel) and DMs alike.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import aiohttp
import discord

from adapters.bridge import (
    DeleteRefused,
    EditExpired,
    GateView,
    IncomingMessage,
    MessageGone,
    Place,
    RetryLater,
    TransportError,
)
from adapters.discord._components import approval_view
from adapters.discord._intake import shorten
from adapters.discord._markers import footer_for, has_marker, marker_embed, nonce_for
from adapters.discord._render import approval_content, approval_embed

if TYPE_CHECKING:
    from adapters.discord._intake import Converter

log = logging.getLogger("adapters.discord")

T = TypeVar("T")

PLATFORM = "discord"
DM_WORKSPACE = "@me"
MAX_CHARS = 2000
OLD_MESSAGE_EDIT_LIMIT = 30046  # "Maximum number of edits to messages older than 1 hour reached"
UNKNOWN_MESSAGE = 10008
UNKNOWN_CHANNEL = 10003
THREAD_ALREADY_CREATED = 160004
PERMANENT_PAUSE = 60.0  # how long the bridge waits before retrying a call Discord refuses for good (403/404)
THREAD_NAME_CHARS = 80
DISCORD_EPOCH_MS = 1_420_070_400_000  # 2015-01-01T00:00:00Z, the epoch of Discord's snowflake ids
NO_MENTIONS = discord.AllowedMentions.none()  # model output must never ping @everyone or users


def channel_id_of(place: Place) -> int:
    """The Discord channel a place's messages live in: the thread when there is one (a thread is a channel)."""
    return int(place.thread if place.thread is not None else place.channel)


def message_age(message_id: int, now: float) -> float:
    """Seconds since `message_id` was created, by the millisecond timestamp in its top 42 bits."""
    return now - ((message_id >> 22) + DISCORD_EPOCH_MS) / 1000


def map_error(error: discord.HTTPException, what: str) -> TransportError:
    detail = f"discord {what}: {error.status} {error.code} {error.text}".strip()
    if error.code == OLD_MESSAGE_EDIT_LIMIT:
        return EditExpired(detail)
    if error.code == UNKNOWN_MESSAGE:
        return MessageGone(detail)
    if error.status in (401, 403, 404):
        # Missing access, unknown channel: retrying every second would only count towards Discord's
        # invalid-request limit (10,000 per 10 minutes bans the IP); try again much later.
        return RetryLater(PERMANENT_PAUSE, detail)
    if error.status == 429:  # a 429 discord.py did not handle (no Via header: Cloudflare)
        return RetryLater(PERMANENT_PAUSE, detail)
    return TransportError(detail)


class DiscordTransport:
    platform = PLATFORM
    max_chars = MAX_CHARS

    def __init__(
        self,
        client: discord.Client,
        converter: Converter,
        *,
        edit_interval: float,
        find_scan_limit: int,
        catch_up_limit: int,
        edit_age_limit: float,
        request_timeout: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.converter = converter
        self.edit_interval = edit_interval
        self.find_scan_limit = find_scan_limit
        self.catch_up_limit = catch_up_limit
        self.edit_age_limit = edit_age_limit
        self.request_timeout = request_timeout
        self.clock = clock  # Unix seconds; tests pass the fake Discord's clock
        self.logged_in = False

    # --- plumbing -----------------------------------------------------------------------------------------

    async def _guard(self, what: str, call: Awaitable[T]) -> T:
        if not self.logged_in or self.client.is_closed():
            if asyncio.iscoroutine(call):
                call.close()
            raise TransportError(f"discord {what}: the client is not connected")
        try:
            async with asyncio.timeout(self.request_timeout):
                return await call
        except discord.RateLimited as error:  # longer than max_ratelimit_timeout: let the bridge wait
            raise RetryLater(error.retry_after, f"discord {what}: rate limited") from error
        except discord.HTTPException as error:
            raise map_error(error, what) from error
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            raise TransportError(f"discord {what}: {type(error).__name__}: {error}") from error

    def _channel(self, place: Place) -> discord.PartialMessageable:
        guild_id = None if place.workspace == DM_WORKSPACE else int(place.workspace)
        return self.client.get_partial_messageable(channel_id_of(place), guild_id=guild_id)

    async def _send(
        self, target: Place, what: str, send: Callable[[], Awaitable[discord.Message]]
    ) -> discord.Message:
        """Post into `target`. A thread the bridge answers in (its id is the message it hangs off) may not exist
        yet on Discord, unlike a Slack thread: start it from that message, then post."""
        try:
            return await self._guard(what, send())
        except RetryLater as error:
            cause = error.__cause__
            missing = isinstance(cause, discord.NotFound) and cause.code == UNKNOWN_CHANNEL
            if target.thread is None or not missing:
                raise
        await self._open_thread(target)
        return await self._guard(what, send())

    async def _open_thread(self, target: Place) -> None:
        assert target.thread is not None
        parent = self._channel(target.channel_place)
        starter = await self._guard("fetch thread starter", parent.fetch_message(int(target.thread)))
        name = shorten(starter.clean_content, THREAD_NAME_CHARS) or "Reply"
        try:
            # The route itself, not `starter.create_thread`: that needs the guild in the client's cache, and
            # the REST client that delivers keeps none (the gateway shards do).
            start = self.client.http.start_thread_with_message(
                starter.channel.id, starter.id, name=name, auto_archive_duration=1440
            )
            await self._guard("start thread", start)
        except TransportError as error:
            cause = error.__cause__
            if not (isinstance(cause, discord.HTTPException) and cause.code == THREAD_ALREADY_CREATED):
                raise

    def _check_editable(self, message_id: int, what: str) -> None:
        """Raise `EditExpired` for a message too old to edit, without asking Discord. Discord accepts only an
        undocumented number of edits of messages older than an hour before refusing with 30046; each doomed
        edit would spend that budget and delay the bridge's continuation."""
        age = message_age(message_id, self.clock())
        if age > self.edit_age_limit:
            raise EditExpired(
                f"discord {what}: message {message_id} is {age:.0f}s old (limit {self.edit_age_limit:g}s)"
            )

    def _bot_id(self) -> int:
        user = self.client.user
        if user is None:
            raise TransportError("discord: not logged in")
        return user.id

    # --- Transport ----------------------------------------------------------------------------------------

    async def create(
        self, target: Place, text: str, key: str, *, final: bool = False, requester: str | None = None
    ) -> str:
        message: discord.Message | None = None
        for attempt in range(2):
            try:
                message = await self._post_part(target, text, key, nonce_for(target, key, attempt=attempt))
                break
            except MessageGone:
                # Discord answers 10008 when the nonce belongs to a message deleted shortly before (a moderator
                # removed the earlier post of this part): post it again under a second deterministic nonce.
                if attempt:
                    raise
        assert message is not None
        if message.content != text:
            # enforce_nonce returned this part's earlier post (a retry, or a restart after a crash): show
            # what the bridge asked for now.
            await self._guard("edit", message.edit(content=text, allowed_mentions=NO_MENTIONS))
        return str(message.id)

    async def _post_part(self, target: Place, text: str, key: str, nonce: str) -> discord.Message:
        channel = self._channel(target)
        return await self._send(
            target,
            "create",
            lambda: channel.send(
                text, nonce=nonce, embed=marker_embed(target, key), allowed_mentions=NO_MENTIONS
            ),
        )

    async def edit(self, target: Place, message_id: str, text: str, key: str, *, final: bool) -> None:
        self._check_editable(int(message_id), "edit")
        partial = self._channel(target).get_partial_message(int(message_id))
        await self._guard("edit", partial.edit(content=text, allowed_mentions=NO_MENTIONS))

    async def delete(self, target: Place, message_id: str, key: str) -> None:
        partial = self._channel(target).get_partial_message(int(message_id))
        try:
            await self._guard("delete", partial.delete())
        except MessageGone:
            return  # deleted already (a repeat after a crash)
        except RetryLater as error:
            if isinstance(error.__cause__, discord.Forbidden):
                raise DeleteRefused(str(error)) from error.__cause__
            raise

    async def find(self, target: Place, key: str) -> str | None:
        footer = footer_for(target, key)
        bot_id = self._bot_id()
        for message in await self._recent(target, self.find_scan_limit):
            if message.author.id == bot_id and has_marker(message, footer):
                return str(message.id)
        return None

    async def post_approval(self, target: Place, gate: GateView, key: str) -> str:
        channel = self._channel(target)
        message = await self._send(
            target,
            "post approval",
            lambda: channel.send(
                approval_content(gate),
                embed=approval_embed(gate, footer_for(target, key)),
                view=approval_view(gate.gate_id),
                nonce=nonce_for(target, key),
                allowed_mentions=NO_MENTIONS,
            ),
        )
        return str(message.id)

    async def update_approval(self, target: Place, message_id: str, gate: GateView) -> None:
        channel = self._channel(target)
        content = approval_content(gate)
        # The message id is recorded by now, so the decided message needs no marker.
        embed = approval_embed(gate, f"request {gate.gate_id} · {gate.status}")
        try:
            self._check_editable(int(message_id), "update approval")
            await self._guard(
                "update approval",
                channel.get_partial_message(int(message_id)).edit(
                    content=content, embed=embed, view=None, allowed_mentions=NO_MENTIONS
                ),
            )
        except (EditExpired, MessageGone) as error:
            # An old gate (too old by its id, or Discord answered 30046 anyway) or a deleted one: say the
            # decision in a reply instead. Clicks on the stale buttons are answered "already decided".
            log.info(
                "approval %s: cannot edit message %s (%s); replying instead", gate.gate_id, message_id, error
            )
            reference = discord.MessageReference(
                message_id=int(message_id), channel_id=channel.id, fail_if_not_exists=False
            )
            await self._guard(
                "post approval decision",
                channel.send(
                    content,
                    reference=reference,
                    nonce=nonce_for(target, f"approval-decision:{gate.gate_id}:{gate.status}"),
                    allowed_mentions=NO_MENTIONS,
                ),
            )

    async def history(self, place: Place, after: str | None) -> list[IncomingMessage]:
        if after is None:
            if place.thread is None:
                return []  # never read a channel from its beginning: only what was missed is caught up
            after = place.thread  # a thread found at startup: every message in it is newer than its starter
        channel = self._channel(place)
        last = int(after)

        async def read() -> tuple[list[discord.Message], bool]:
            # Newest first, back to `after`: when more was missed than `catch_up_limit`, the oldest is
            # dropped (and logged), never the newest.
            found: list[discord.Message] = []
            async for message in channel.history(limit=self.catch_up_limit + 1):
                if message.id <= last:
                    return found, True
                found.append(message)
            return found, False

        newest_first, complete = await self._guard("history", read())
        if not complete and len(newest_first) > self.catch_up_limit:
            log.warning(
                "catch-up of %s: more than %d messages were missed; the oldest are skipped",
                place.key,
                self.catch_up_limit,
            )
            newest_first = newest_first[: self.catch_up_limit]
        messages = list(reversed(newest_first))
        bot_id = self._bot_id()
        found: list[IncomingMessage] = []
        for message in messages:
            try:
                incoming = await self.converter.convert(message, place, bot_id)
            except (discord.HTTPException, OSError, TimeoutError):
                raise  # the network: the whole place is tried again on the next catch-up
            except (
                Exception
            ) as exc:  # fields that make no sense: skipping it must not cost the messages after it
                log.error(
                    "discord: catch-up of %s: message %s could not be read and is dropped (%s: %s)",
                    place.key,
                    message.id,
                    type(exc).__name__,
                    exc,
                )
                continue
            if incoming is not None:
                found.append(incoming)
        return found

    async def _recent(self, target: Place, limit: int) -> list[discord.Message]:
        channel = self._channel(target)

        async def read() -> list[discord.Message]:
            return [m async for m in channel.history(limit=limit)]

        return await self._guard("history", read())
