"""`SlackTransport`: how the bridge posts, edits, reconciles and reads on Slack.

Delivery, exactly once as far as Slack allows. `chat.postMessage` has no idempotency key, so every message
this bot posts carries the bridge's part key in message metadata
(`{"event_type": "durable_bots_reply", "event_payload": {"key": ...}}`), and `find` looks for it with
`conversations.history` / `conversations.replies` and `include_all_metadata=True`. The client used here has
no retry handlers: slack-sdk's default connection-error handler re-sends a `chat.postMessage` whose response
was lost, which posts twice. A lost response surfaces as a `TransportError`; the bridge then calls `find`
before it posts anything again.

Streaming. Answers inside a thread stream with `chat.startStream` / `appendStream` / `stopStream`; top-level
answers (Slack streams only thread replies) and everything that cannot stream fall back to `chat.update`,
which the bridge paces at `edit_interval`. A stream only grows, so it carries the part of a partial that only
grows: the model's text before the bridge's typing marker (" …"); tool status lines are left out. When the
text is rewritten (the next model turn after a tool round, a split into parts) or the stream expired
server-side, the stream is stopped and the message continues with `chat.update`.

`chat.startStream` takes no metadata, so a streamed message gets its key at `chat.stopStream` (final, or when
it falls back). Until then the bridge knows it by id: it records the id right after `create` returns. The one
gap is a crash (or a lost response) after Slack created the stream and before the id was recorded. `find`
closes it: in that thread, a message of this bot that carries no key, is not recorded for any live reply and is
not streamed by this process is such an orphan; it is adopted for the key and stamped with the key at once
(`chat.stopStream` with metadata, or `chat.update` once the stream has expired), under a lock, so a second
crash or a concurrent lookup finds it by metadata instead. The restarted bridge then edits it with
`chat.update`: no second message.

A thread reply this process did not create (posted before a restart) may be a stream a crash left open, so its
first edit in this process stops any stream on it (with the key) before the `chat.update`. A top-level message
never streamed, so it is updated straight away.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from slack_sdk.web.async_client import AsyncWebClient

from adapters.bridge import (
    DeleteRefused,
    EditExpired,
    GateView,
    IncomingMessage,
    MessageGone,
    Place,
    RateGovernor,
    RetryLater,
    TransportError,
    is_reply_key,
)
from adapters.bridge.bounded import BoundedSet
from adapters.slack._api import SlackCallError, SlackPermanentError, call
from adapters.slack.blocks import approval_blocks, fallback_text
from adapters.slack.config import SlackOptions
from adapters.slack.directory import Directory
from adapters.slack.events import HumanMessage, MalformedEvent, human_message
from adapters.slack.safe_text import slack_text

if TYPE_CHECKING:
    from adapters.bridge import BridgeLike

log = logging.getLogger("adapters.slack")

REPLY_EVENT = "durable_bots_reply"
TYPING = " …"
PLACEHOLDER = "…"
_PAGE = 200
_CREATED_MEMORY = 10_000
# Messages remembered as not streaming. One that left is edited like a message from before this process
# started (the stream check runs first), so the bound costs at most a call, never a wrong edit.
_PLAIN_MEMORY = 10_000
_PATIENCE = 3  # rate limits a catch-up read waits out (Retry-After) before its place is given up


def reply_metadata(key: str) -> dict[str, Any]:
    return {"event_type": REPLY_EVENT, "event_payload": {"key": key}}


def metadata_key(message: dict[str, Any]) -> str | None:
    metadata = message.get("metadata")
    if not isinstance(metadata, dict) or metadata.get("event_type") != REPLY_EVENT:
        return None
    payload = metadata.get("event_payload")
    key = payload.get("key") if isinstance(payload, dict) else None
    return key if isinstance(key, str) else None


def streamable(text: str) -> str | None:
    """The part of a partial answer that only grows: the model's text before the typing marker " …" that the
    bridge puts after it (followed by the end or by tool status lines); "" for the bare placeholder the bridge
    shows before the model's first token. None when the text cannot stream: a final answer, or only tool
    status lines."""
    if text.strip() == PLACEHOLDER:
        return ""
    index = text.find(TYPING)
    while index != -1:
        end = index + len(TYPING)
        if end == len(text) or text[end] == "\n":
            return text[:index] or None
        index = text.find(TYPING, index + 1)
    return None


def ts_order(ts: str) -> Decimal:
    try:
        return Decimal(ts)
    except InvalidOperation:
        return Decimal(0)


@dataclass
class _Stream:
    channel: str
    streamed: str  # text appended so far


class SlackTransport:
    platform = "slack"

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        options: SlackOptions,
        directory: Directory,
        governor: RateGovernor,
        team_id: str,
        bot_user_id: str,
        bot_id: str | None,
        bridge: BridgeLike | None = None,
    ) -> None:
        self.client = client
        self.options = options
        self.directory = directory
        self.governor = governor
        self.team_id = team_id
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.bridge = bridge
        self.max_chars = options.max_chars
        self.edit_interval = options.edit_interval
        self._streams: dict[str, _Stream] = {}  # ts -> a stream this process started and has not stopped
        # ts of messages known not to be streaming (edited with chat.update); bounded: see _PLAIN_MEMORY
        self._plain: BoundedSet[str] = BoundedSet(_PLAIN_MEMORY)
        self._created: dict[str, None] = {}  # ts this process created (ordered; bounded)
        self._adopt_lock = asyncio.Lock()
        self._stream_refused = False
        self._closed = False

    def measure(self, text: str) -> int:
        """A part's length as Slack counts it: escaped (`&<>` grow), which is what `max_chars` limits."""
        return len(slack_text(text))

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("the Slack adapter is stopped")

    def _mine(self, ts: str) -> None:
        self._created[ts] = None
        while len(self._created) > _CREATED_MEMORY:
            self._created.pop(next(iter(self._created)))

    def is_own(self, message: dict[str, Any]) -> bool:
        if self.bot_id is not None and message.get("bot_id") == self.bot_id:
            return True
        return bool(message.get("user") == self.bot_user_id)

    # --- posting ----------------------------------------------------------------------------------------------

    async def create(
        self, target: Place, text: str, key: str, *, final: bool = False, requester: str | None = None
    ) -> str:
        self._check_open()
        text = slack_text(text)  # shown, never interpreted: no broadcast, no mention, no markup from answers
        # Only a reply the model is still writing streams (a final text is one chat.postMessage). Streaming
        # into a channel (not a DM) needs the recipient: the asker.
        if self.options.stream and not self._stream_refused and target.thread is not None and not final:
            start = streamable(text)
            if start is not None and (requester or await self.directory.is_dm(target.channel)):
                ts = await self._start_stream(target, start, requester)
                if ts is not None:
                    return ts
        data = await call(
            "chat.postMessage",
            self.client.chat_postMessage(
                channel=target.channel,
                thread_ts=target.thread,
                markdown_text=text,
                metadata=reply_metadata(key),
                unfurl_links=False,
                unfurl_media=False,
            ),
            self.governor,
        )
        ts = str(data["ts"])
        self._mine(ts)
        self._plain.add(ts)
        return ts

    async def _start_stream(self, target: Place, start: str, recipient: str | None) -> str | None:
        arguments: dict[str, Any] = {"channel": target.channel, "thread_ts": target.thread}
        if start:
            arguments["markdown_text"] = start  # else an empty stream, shown as loading until text comes
        if recipient:
            arguments["recipient_team_id"] = target.workspace
            arguments["recipient_user_id"] = recipient
        try:
            data = await call("chat.startStream", self.client.chat_startStream(**arguments), self.governor)
        except (SlackCallError, SlackPermanentError) as exc:
            # Slack said no (ok: false), so nothing was created: post and update from now on.
            log.warning("chat.startStream refused (%s); answers are posted and updated instead", exc)
            self._stream_refused = True
            return None
        ts = str(data["ts"])
        self._mine(ts)
        self._streams[ts] = _Stream(channel=target.channel, streamed=start)
        return ts

    async def edit(self, target: Place, message_id: str, text: str, key: str, *, final: bool) -> None:
        self._check_open()
        text = slack_text(text)
        stream = self._streams.get(message_id)
        if stream is not None:
            await self._edit_stream(target, message_id, stream, text, key, final=final)
            return
        if message_id not in self._plain:
            # Posted before this process started (or a stream call's outcome is unknown): a stream may still
            # be open on it. Stop it, stamping the key, then replace the text. Only thread replies ever stream
            # (and only with streaming on): stopping anything else would be a wasted, rate-limited call.
            if target.thread is not None and self.options.stream:
                await self._end_stream(target.channel, message_id, key)
            self._plain.add(message_id)
        await self._update(target, message_id, text, key)
        if final:
            self._plain.discard(message_id)

    async def _edit_stream(
        self, target: Place, ts: str, stream: _Stream, text: str, key: str, *, final: bool
    ) -> None:
        if final:
            if text.startswith(stream.streamed):
                delta = text[len(stream.streamed) :]
                stop = self.client.chat_stopStream(
                    channel=stream.channel, ts=ts, markdown_text=delta or None, metadata=reply_metadata(key)
                )
                if await self._stream_call(ts, "chat.stopStream", stop):
                    self._streams.pop(ts, None)
                    return
        else:
            start = streamable(text)
            if start == "":
                return  # back to "…" (between model turns): keep showing what streamed so far
            if start is not None and start.startswith(stream.streamed):
                delta = start[len(stream.streamed) :]
                if not delta:
                    return
                append = self.client.chat_appendStream(channel=stream.channel, ts=ts, markdown_text=delta)
                if await self._stream_call(ts, "chat.appendStream", append):
                    stream.streamed = start
                    return
        # Rewritten (the next model turn, a split), expired or refused: end the stream, go on with chat.update.
        await self._end_stream(stream.channel, ts, key)
        self._streams.pop(ts, None)
        self._plain.add(ts)
        await self._update(target, ts, text, key)
        if final:
            self._plain.discard(ts)

    async def _stream_call(self, ts: str, method: str, request: Awaitable[Any]) -> bool:
        """True if the stream call was applied; False if Slack refused it (e.g. the stream expired)."""
        try:
            await call(method, request, self.governor)
        except RetryLater:
            raise  # not applied: the bridge retries with the newest text
        except (SlackCallError, SlackPermanentError) as exc:
            log.info("%s on %s refused (%s); continuing with chat.update", method, ts, exc)
            return False
        except TransportError:
            # Applied or not? Unknown. Appending again could double text, so stop streaming this message; the
            # next edit stops any stream left on it and replaces the whole text.
            self._streams.pop(ts, None)
            raise
        return True

    async def _end_stream(self, channel: str, ts: str, key: str) -> None:
        """Stop a stream that may be open on `ts`, stamping the key. Not streaming (any more): nothing to do."""
        try:
            await call(
                "chat.stopStream",
                self.client.chat_stopStream(channel=channel, ts=ts, metadata=reply_metadata(key)),
                self.governor,
            )
        except (SlackCallError, SlackPermanentError) as exc:
            log.debug("no stream to stop on %s (%s)", ts, exc)

    async def _update(self, target: Place, ts: str, text: str, key: str) -> None:
        try:
            await call(
                "chat.update",
                self.client.chat_update(
                    channel=target.channel, ts=ts, markdown_text=text, metadata=reply_metadata(key)
                ),
                self.governor,
            )
        except SlackCallError as exc:
            if exc.error in ("message_not_found", "cant_update_message"):
                raise MessageGone(str(exc)) from None
            if exc.error == "edit_window_closed":
                raise EditExpired(str(exc)) from None
            raise

    async def delete(self, target: Place, message_id: str, key: str) -> None:
        self._check_open()
        self._streams.pop(message_id, None)  # a deleted message ends its stream too
        try:
            await call(
                "chat.delete", self.client.chat_delete(channel=target.channel, ts=message_id), self.governor
            )
        except SlackCallError as exc:
            if exc.error == "message_not_found":
                return  # deleted already (a repeat after a crash)
            if exc.error == "cant_delete_message":
                raise DeleteRefused(str(exc)) from None
            raise
        except SlackPermanentError as exc:
            raise DeleteRefused(str(exc)) from None
        self._plain.discard(message_id)

    # --- reconciliation -----------------------------------------------------------------------------------------

    async def find(self, target: Place, key: str) -> str | None:
        self._check_open()
        own = [m for m in await self._recent(target, self.options.reconcile_limit) if self.is_own(m)]
        for message in own:
            if metadata_key(message) == key:
                ts = str(message["ts"])
                if ts not in self._streams:
                    self._plain.add(ts)
                return ts
        if target.thread is None or not is_reply_key(key):
            return None  # only thread replies stream, and only streams start without their key
        return await self._adopt_orphan(target, key)

    async def _adopt_orphan(self, target: Place, key: str) -> str | None:
        async with self._adopt_lock:
            # Re-read under the lock: a concurrent adoption may have stamped a message meanwhile.
            own = [m for m in await self._recent(target, self.options.reconcile_limit) if self.is_own(m)]
            for message in own:
                if metadata_key(message) == key:
                    return str(message["ts"])
            recorded = await self._recorded_ids()
            orphans = sorted(
                (
                    m
                    for m in own
                    if m.get("metadata") is None
                    and str(m.get("ts")) not in recorded
                    and str(m.get("ts")) not in self._created
                    and m.get("subtype") in (None, "thread_broadcast")
                ),
                key=lambda m: ts_order(str(m.get("ts"))),
            )
            if not orphans:
                return None
            orphan = orphans[0]
            ts = str(orphan["ts"])
            log.warning("adopting %s in %s as the lost stream of %s", ts, target.key, key)
            try:
                await call(
                    "chat.stopStream",
                    self.client.chat_stopStream(channel=target.channel, ts=ts, metadata=reply_metadata(key)),
                    self.governor,
                )
            except (SlackCallError, SlackPermanentError):
                text = orphan.get("text") if isinstance(orphan.get("text"), str) else ""
                await call(
                    "chat.update",
                    self.client.chat_update(
                        channel=target.channel, ts=ts, markdown_text=text or "…", metadata=reply_metadata(key)
                    ),
                    self.governor,
                )
            self._plain.add(ts)
            return ts

    async def _recorded_ids(self) -> set[str]:
        return set() if self.bridge is None else await self.bridge.recorded_message_ids()

    async def _recent(
        self, target: Place, limit: int, oldest: str | None = None, *, patience: int = 0
    ) -> list[dict[str, Any]]:
        """Messages of a channel (top level, newest first) or of a thread (replies, oldest first, without the
        parent), with metadata, up to `limit`. `patience`: how many rate limits to wait out per page (catch-up
        has no caller that would retry it; delivery does)."""
        messages: list[dict[str, Any]] = []
        cursor: str | None = None
        while len(messages) < limit:
            data = await self._page(target, min(_PAGE, limit - len(messages)), cursor, oldest, patience)
            if data is None:
                return []
            for message in data.get("messages") or []:
                if isinstance(message, dict) and message.get("ts") != target.thread:
                    messages.append(message)
            cursor = (data.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor or not data.get("has_more", True):
                break
        return messages

    async def _page(
        self, target: Place, limit: int, cursor: str | None, oldest: str | None, patience: int
    ) -> dict[str, Any] | None:
        """One page of `conversations.replies` / `history`; None if the thread is gone."""
        waited = 0
        while True:
            if patience:
                await self.governor.acquire("catch-up", interval=0.0)  # sits out a Retry-After back-off
            try:
                if target.thread is None:
                    return await call(
                        "conversations.history",
                        self.client.conversations_history(
                            channel=target.channel,
                            include_all_metadata=True,
                            limit=limit,
                            cursor=cursor,
                            oldest=oldest,
                        ),
                        self.governor,
                    )
                return await call(
                    "conversations.replies",
                    self.client.conversations_replies(
                        channel=target.channel,
                        ts=target.thread,
                        include_all_metadata=True,
                        limit=limit,
                        cursor=cursor,
                        oldest=oldest,
                    ),
                    self.governor,
                )
            except RetryLater:
                if waited >= patience:
                    raise
                waited += 1  # `call` told the governor to back off; the acquire above waits it out
            except SlackCallError as exc:
                if target.thread is not None and exc.error == "thread_not_found":
                    return None
                raise

    async def member_channels(self) -> list[str]:
        """Ids of every conversation the bot is a member of (channels, private channels, DMs, group DMs), for
        catch-up. A type the token has no scope for is skipped with a warning, not an error."""
        self._check_open()
        found: list[str] = []
        for kind in ("public_channel", "private_channel", "im", "mpim"):
            cursor: str | None = None
            waited = 0
            while True:
                await self.governor.acquire("catch-up", interval=0.0)  # sits out a Retry-After back-off
                try:
                    data = await call(
                        "users.conversations",
                        self.client.users_conversations(
                            types=kind, exclude_archived=True, limit=_PAGE, cursor=cursor
                        ),
                        self.governor,
                    )
                except RetryLater:
                    if waited < _PATIENCE:
                        waited += 1
                        continue
                    log.warning("catch-up cannot list %s conversations: rate limited", kind)
                    break
                except (SlackCallError, SlackPermanentError, TransportError) as exc:
                    log.warning("catch-up cannot list %s conversations: %s", kind, exc)
                    break
                for channel in data.get("channels") or []:
                    if isinstance(channel, dict) and isinstance(channel.get("id"), str):
                        found.append(channel["id"])
                        if kind == "im":
                            self.directory.note_channel_type(channel["id"], "im")
                cursor = (data.get("response_metadata") or {}).get("next_cursor") or None
                if not cursor:
                    break
        return list(dict.fromkeys(found))

    # --- approvals ----------------------------------------------------------------------------------------------

    async def post_approval(self, target: Place, gate: GateView, key: str) -> str:
        self._check_open()
        data = await call(
            "chat.postMessage",
            self.client.chat_postMessage(
                channel=target.channel,
                thread_ts=target.thread,
                text=fallback_text(gate),
                blocks=approval_blocks(gate),
                metadata=reply_metadata(key),
            ),
            self.governor,
        )
        ts = str(data["ts"])
        self._mine(ts)
        self._plain.add(ts)
        return ts

    async def update_approval(self, target: Place, message_id: str, gate: GateView) -> None:
        self._check_open()
        try:
            await call(
                "chat.update",
                self.client.chat_update(
                    channel=target.channel,
                    ts=message_id,
                    text=fallback_text(gate),
                    blocks=approval_blocks(gate),
                ),
                self.governor,
            )
        except SlackCallError as exc:
            if exc.error not in ("message_not_found", "cant_update_message"):
                raise
            log.warning("approval message %s is gone (%s); the decision stands", message_id, exc)

    # --- intake helpers -----------------------------------------------------------------------------------------

    async def incoming(self, message: HumanMessage, *, is_dm: bool | None = None) -> IncomingMessage:
        """The bridge's view of a human message (display name resolved, DM or not)."""
        if is_dm is None:
            if message.channel_type is not None:
                self.directory.note_channel_type(message.channel, message.channel_type)
            is_dm = await self.directory.is_dm(message.channel)
        place = Place(self.platform, self.team_id, message.channel, message.thread)
        return IncomingMessage(
            place=place,
            message_id=message.ts,
            user_id=message.user,
            user_name=await self.directory.name(message.user),
            text=message.text,
            mentions_bot=message.mentions_bot,
            is_dm=is_dm,
        )

    async def history(self, place: Place, after: str | None) -> list[IncomingMessage]:
        """Human messages in `place` newer than `after`, oldest first (startup catch-up).

        For a channel this also returns the replies, newer than `after`, in threads the bridge does not know
        yet: a thread opened while the bot was down (under its answer, or under any message, however old) is
        seen only through its parent's `latest_reply` in channel history. Those messages carry the thread's
        place, so intake forks the thread as it does live. Known threads are caught up by the bridge itself."""
        self._check_open()
        if after is None or place.workspace != self.team_id:
            return []
        limit = self.options.catch_up_limit
        if place.thread is not None:
            found = self._humans(place, await self._recent(place, limit, after, patience=_PATIENCE), after)
        else:
            # No `oldest`: a new thread may hang off a message older than `after`. Newest first, so the same
            # top-level messages come back as with `oldest` whenever more than `limit` are new.
            items = await self._recent(place, limit, patience=_PATIENCE)
            found = self._humans(place, items, after)
            for thread in await self._new_threads(place, items, after):
                try:
                    replies = await self._recent(thread, limit, after, patience=_PATIENCE)
                except (TransportError, SlackPermanentError) as exc:  # one unreadable thread, not the channel
                    log.warning("catch-up of %s failed: %s", thread.key, exc)
                    continue
                found.extend(self._humans(thread, replies, after))
        unique = {m.ts: m for m in found}  # a thread_broadcast is both in the channel and in its thread
        is_dm = await self.directory.is_dm(place.channel)
        ordered = sorted(unique.values(), key=lambda m: ts_order(m.ts))
        return [await self.incoming(m, is_dm=is_dm) for m in ordered]

    def _humans(self, place: Place, items: list[dict[str, Any]], after: str) -> list[HumanMessage]:
        found: list[HumanMessage] = []
        for item in items:
            if ts_order(str(item.get("ts"))) <= ts_order(after):
                continue
            try:
                human = human_message(
                    item, bot_user_id=self.bot_user_id, bot_id=self.bot_id, channel=place.channel
                )
            except MalformedEvent as exc:
                log.warning("skipping a malformed history item in %s: %s", place.key, exc)
                continue
            if human is not None:
                found.append(human)
        return found

    async def _new_threads(self, place: Place, items: list[dict[str, Any]], after: str) -> list[Place]:
        """Threads under `items` (channel history) with replies newer than `after` that the bridge does not
        know, oldest parent first; a thread where only this bot replied is skipped (nothing to take in)."""
        threads: list[Place] = []
        for item in sorted(items, key=lambda m: ts_order(str(m.get("ts")))):
            parent = item.get("ts")
            latest = item.get("latest_reply")
            if not isinstance(parent, str) or item.get("thread_ts") != parent or not item.get("reply_count"):
                continue  # not a thread parent (replies and broadcasts carry their parent's thread_ts)
            if not isinstance(latest, str) or ts_order(latest) <= ts_order(after):
                continue
            users = item.get("reply_users")
            if (
                isinstance(users, list)
                and users
                and all(u == self.bot_user_id for u in users)
                and item.get("reply_users_count") == len(users)
            ):
                continue
            thread = place.in_thread(parent)
            if not await self._known(thread):
                threads.append(thread)
        return threads

    async def _known(self, place: Place) -> bool:
        """The bridge has a conversation for `place` (then it is in the bridge's own catch-up)."""
        if self.bridge is None:
            return False
        doc = await self.bridge.place_doc(place)
        return bool(doc and doc.get("conversation_id") is not None)
