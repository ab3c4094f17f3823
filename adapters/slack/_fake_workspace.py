"""Workspace state of the fake Slack: users, channels, groups, message history (private module)."""

from __future__ import annotations

import base64
import binascii
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from adapters.slack._fake_model import (
    Channel,
    ChannelKind,
    Ephemeral,
    JsonDict,
    Message,
    Revision,
    User,
    UserGroup,
)


class SlackError(Exception):
    """A Slack API error (``{"ok": false, "error": code}``) raised inside the fake."""

    def __init__(self, code: str, *messages: str, needed: str | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.messages = list(messages)
        self.needed = needed

    def body(self) -> JsonDict:
        body: JsonDict = {"ok": False, "error": self.code}
        if self.messages:
            body["response_metadata"] = {"messages": [f"[ERROR] {m}" for m in self.messages]}
        if self.needed is not None:
            body["needed"] = self.needed
        return body


class TsClock:
    """Mints Slack message timestamps: ``"<seconds>.<6-digit micros>"``, strictly increasing."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._last = 0

    def next(self) -> str:
        micros = max(int(self._clock() * 1_000_000), self._last + 1)
        self._last = micros
        return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"

    def now(self) -> float:
        return self._clock()


def ts_key(ts: str) -> int:
    """Order key of a Slack ts (micros); raises ``ValueError`` for anything else."""
    seconds, _, frac = ts.partition(".")
    if not seconds.isdigit() or (frac and not frac.isdigit()):
        raise ValueError(ts)
    return int(seconds) * 1_000_000 + int((frac + "000000")[:6] or "0")


def encode_cursor(ts: str) -> str:
    return base64.b64encode(f"next_ts:{ts.replace('.', '')}".encode()).decode()


def decode_cursor(cursor: str) -> int:
    """The ts key a cursor points at; raises ``SlackError("invalid_cursor")``."""
    try:
        raw = base64.b64decode(cursor.encode(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise SlackError("invalid_cursor") from exc
    prefix, _, digits = raw.partition(":")
    if prefix != "next_ts" or not digits.isdigit():
        raise SlackError("invalid_cursor")
    return int(digits)


@dataclass(frozen=True)
class Page:
    messages: list[Message]
    has_more: bool
    next_cursor: str


class Workspace:
    """Users, channels, user groups and per-channel history, plus the ts clock."""

    def __init__(
        self,
        *,
        team_id: str,
        team_domain: str,
        bot_user_id: str,
        bot_id: str,
        app_id: str,
        bot_name: str,
        clock: Callable[[], float],
    ) -> None:
        self.team_id = team_id
        self.team_domain = team_domain
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.app_id = app_id
        self.bot_name = bot_name
        self.clock = TsClock(clock)
        self.users: dict[str, User] = {}
        self.channels: dict[str, Channel] = {}
        self.usergroups: dict[str, UserGroup] = {}
        self.history: dict[str, list[Message]] = {}
        self.ephemerals: list[Ephemeral] = []
        self.statuses: list[JsonDict] = []
        self._counters: dict[str, int] = {}
        self.add_user(
            bot_user_id, name=bot_name, display_name=bot_name, is_bot=True, bot_id=bot_id, real_name=bot_name
        )

    # ------------------------------------------------------------------ ids

    def new_id(self, prefix: str) -> str:
        n = self._counters.get(prefix, 0) + 1
        self._counters[prefix] = n
        return f"{prefix}{n:07d}"

    # ------------------------------------------------------------------ directory

    def add_user(
        self,
        user_id: str | None = None,
        *,
        name: str | None = None,
        display_name: str | None = None,
        real_name: str | None = None,
        is_bot: bool = False,
        bot_id: str | None = None,
        deleted: bool = False,
        tz: str = "UTC",
    ) -> User:
        uid = user_id or self.new_id("U")
        if uid in self.users:
            raise ValueError(f"user {uid} already exists")
        uname = name or uid.lower()
        user = User(
            id=uid,
            name=uname,
            display_name=uname if display_name is None else display_name,
            real_name=real_name or uname,
            is_bot=is_bot,
            bot_id=bot_id,
            deleted=deleted,
            tz=tz,
            team_id=self.team_id,
        )
        self.users[uid] = user
        return user

    def add_channel(
        self,
        name: str,
        *,
        channel_id: str | None = None,
        kind: ChannelKind = "public",
        members: Iterable[str] = (),
        bot_is_member: bool = True,
        creator: str | None = None,
    ) -> Channel:
        prefix = {"public": "C", "private": "G", "im": "D", "mpim": "G"}[kind]
        cid = channel_id or self.new_id(prefix)
        if cid in self.channels:
            raise ValueError(f"channel {cid} already exists")
        member_set = set(members)
        if bot_is_member:
            member_set.add(self.bot_user_id)
        channel = Channel(
            id=cid,
            name=name,
            kind=kind,
            members=member_set,
            created=int(self.clock.now()),
            creator=creator,
        )
        self.channels[cid] = channel
        self.history[cid] = []
        return channel

    def open_dm(self, user_id: str, *, channel_id: str | None = None) -> Channel:
        for channel in self.channels.values():
            if channel.kind == "im" and channel.im_user == user_id:
                return channel
        channel = self.add_channel(
            f"dm-{user_id}", channel_id=channel_id, kind="im", members=[user_id], creator=user_id
        )
        channel.im_user = user_id
        return channel

    def add_usergroup(
        self, handle: str, members: Iterable[str], *, group_id: str | None = None, name: str | None = None
    ) -> UserGroup:
        gid = group_id or self.new_id("S")
        group = UserGroup(id=gid, handle=handle, name=name or handle, users=list(members))
        self.usergroups[gid] = group
        return group

    def user(self, user_id: str) -> User:
        try:
            return self.users[user_id]
        except KeyError:
            raise KeyError(f"fake Slack has no user {user_id!r}; add it with fake.add_user()") from None

    def channel(self, ref: str) -> Channel:
        """A channel by id, ``#name`` or name."""
        if ref in self.channels:
            return self.channels[ref]
        name = ref.removeprefix("#")
        for channel in self.channels.values():
            if channel.name == name and channel.kind in ("public", "private"):
                return channel
        raise KeyError(f"fake Slack has no channel {ref!r}; add it with fake.add_channel()")

    def api_channel(self, ref: object, *, need_member: bool = False) -> Channel:
        """Resolve a channel argument of an API call the way Slack does (errors as ``SlackError``)."""
        if not isinstance(ref, str) or not ref:
            raise SlackError("channel_not_found")
        try:
            channel = self.channel(ref)
        except KeyError:
            raise SlackError("channel_not_found") from None
        is_member = self.bot_user_id in channel.members
        if channel.is_private and not is_member:
            raise SlackError("channel_not_found")
        if need_member and not is_member:
            raise SlackError("not_in_channel")
        return channel

    # ------------------------------------------------------------------ messages

    def find(self, channel_id: str, ts: str, *, include_deleted: bool = False) -> Message | None:
        for message in reversed(self.history.get(channel_id, [])):
            if message.ts == ts:
                return None if message.deleted and not include_deleted else message
        return None

    def thread_root(self, channel_id: str, thread_ts: str) -> Message:
        """The parent a new reply attaches to (a reply's ts is normalized to its parent, single-level)."""
        parent = self.find(channel_id, thread_ts)
        if parent is None:
            raise SlackError("invalid_thread_ts")
        if parent.is_reply and parent.thread_ts is not None:
            root = self.find(channel_id, parent.thread_ts)
            if root is None:
                raise SlackError("invalid_thread_ts")
            return root
        return parent

    def store(
        self,
        channel: Channel,
        *,
        text: str,
        user: str | None,
        bot: bool = False,
        thread_ts: str | None = None,
        blocks: list[JsonDict] | None = None,
        metadata: JsonDict | None = None,
        subtype: str | None = None,
        streaming: bool = False,
    ) -> Message:
        root: Message | None = None
        if thread_ts is not None:
            root = self.thread_root(channel.id, thread_ts)
        ts = self.clock.next()
        message = Message(
            channel=channel.id,
            ts=ts,
            text=text,
            user=self.bot_user_id if bot else user,
            bot_id=self.bot_id if bot else None,
            app_id=self.app_id if bot else None,
            team=self.team_id,
            thread_ts=root.ts if root is not None else None,
            blocks=blocks,
            metadata=metadata,
            subtype=subtype,
            client_msg_id=None if bot else str(uuid.uuid4()),
            streaming=streaming,
            stream_last_activity=time.monotonic(),
        )
        if root is not None and root.thread_ts is None:
            root.thread_ts = root.ts
        self.history[channel.id].append(message)
        return message

    def edit(
        self,
        message: Message,
        *,
        text: str | None,
        blocks: list[JsonDict] | None,
        metadata: JsonDict | None,
        by: str | None,
        via: str,
        mark_edited: bool = True,
    ) -> None:
        """Replace the provided fields (``None`` keeps the old value; ``[]`` blocks removes them)."""
        edit_ts = self.clock.next()
        message.revisions.append(
            Revision(
                text=message.text,
                blocks=message.blocks,
                metadata=message.metadata,
                replaced_at=edit_ts,
                replaced_by=by,
                via=via,
            )
        )
        if text is not None:
            message.text = text
        if blocks is not None:
            message.blocks = blocks or None
        if metadata is not None:
            message.metadata = metadata
        if mark_edited:
            message.edited = {"user": by, "ts": edit_ts}

    def replies(self, channel_id: str, parent_ts: str) -> list[Message]:
        return [
            m
            for m in self.history.get(channel_id, [])
            if m.thread_ts == parent_ts and m.ts != parent_ts and not m.deleted
        ]

    def render(self, message: Message, *, include_metadata: bool) -> JsonDict:
        """A message as ``conversations.history`` / ``replies`` / ``chat.*`` return it."""
        data: JsonDict = {"type": "message", "text": message.text, "ts": message.ts}
        if message.subtype is not None:
            data["subtype"] = message.subtype
        if message.user is not None:
            data["user"] = message.user
        if message.bot_id is not None:
            data["bot_id"] = message.bot_id
            data["app_id"] = message.app_id
            data["bot_profile"] = {
                "id": message.bot_id,
                "app_id": message.app_id,
                "name": self.bot_name,
                "deleted": False,
                "team_id": self.team_id,
            }
        data["team"] = message.team
        if message.client_msg_id is not None:
            data["client_msg_id"] = message.client_msg_id
        if message.blocks is not None:
            data["blocks"] = message.blocks
        if message.edited is not None:
            data["edited"] = dict(message.edited)
        if message.thread_ts is not None:
            data["thread_ts"] = message.thread_ts
            if message.is_reply:
                parent = self.find(message.channel, message.thread_ts, include_deleted=True)
                if parent is not None and parent.user is not None:
                    data["parent_user_id"] = parent.user
            else:
                replies = self.replies(message.channel, message.ts)
                reply_users = list(dict.fromkeys(r.user for r in replies if r.user is not None))
                data["reply_count"] = len(replies)
                data["reply_users_count"] = len(reply_users)
                data["reply_users"] = reply_users
                data["latest_reply"] = replies[-1].ts if replies else message.ts
                data["is_locked"] = False
                data["subscribed"] = False
        if message.reactions:
            data["reactions"] = [
                {"name": name, "users": list(users), "count": len(users)}
                for name, users in message.reactions.items()
            ]
        if include_metadata and message.metadata is not None:
            data["metadata"] = dict(message.metadata)
        return data

    def history_page(
        self,
        channel_id: str,
        *,
        oldest: int | None,
        latest: int | None,
        inclusive: bool,
        limit: int,
        cursor: int | None,
    ) -> Page:
        """Top-level messages (and thread broadcasts), newest first."""
        selected: list[Message] = []
        for message in reversed(self.history.get(channel_id, [])):
            if message.deleted or (message.is_reply and message.subtype != "thread_broadcast"):
                continue
            key = ts_key(message.ts)
            if cursor is not None and key > cursor:
                continue
            if not _in_range(key, oldest, latest, inclusive):
                continue
            selected.append(message)
        page, more = selected[:limit], len(selected) > limit
        return Page(page, more, encode_cursor(selected[limit].ts) if more else "")

    def replies_page(
        self,
        parent: Message,
        *,
        oldest: int | None,
        latest: int | None,
        inclusive: bool,
        limit: int,
        cursor: int | None,
    ) -> Page:
        """The parent (first page only) followed by its replies, oldest first."""
        candidates = [parent, *self.replies(parent.channel, parent.ts)] if parent.thread_ts else [parent]
        selected: list[Message] = []
        for message in candidates:
            key = ts_key(message.ts)
            if message is parent:
                if cursor is None:
                    selected.append(message)
                continue
            if cursor is not None and key < cursor:
                continue
            if _in_range(key, oldest, latest, inclusive):
                selected.append(message)
        page, more = selected[:limit], len(selected) > limit
        return Page(page, more, encode_cursor(selected[limit].ts) if more else "")


def _in_range(key: int, oldest: int | None, latest: int | None, inclusive: bool) -> bool:
    if oldest is not None and (key < oldest or (key == oldest and not inclusive)):
        return False
    return not (latest is not None and (key > latest or (key == latest and not inclusive)))
