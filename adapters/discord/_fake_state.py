"""The fake Discord's world: entities, message rules, threads, interactions, and the JSON discord.py reads.

All mutations happen on the event loop thread and are synchronous, so a request's effect is atomic with
respect to other requests and test actions. Gateway events are handed to an :class:`EventSink` (the fake
gateway), which assigns sequence numbers and queues frames per session.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from adapters.discord._fake_models import (
    DEFAULT_EVERYONE_PERMISSIONS,
    MAX_CONTENT_LENGTH,
    MAX_CUSTOM_ID_LENGTH,
    MAX_NONCE_LENGTH,
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
    InteractionRecord,
    InteractionResponse,
    JsonDict,
    MessageFlag,
    MessageType,
    MessageVersion,
    Snowflakes,
    already_acknowledged,
    cannot_edit_others,
    collect_custom_ids,
    empty_message,
    invalid_form,
    invalid_webhook_token,
    iso,
    old_message_edit_limit,
    thread_already_created,
    unknown_channel,
    unknown_interaction,
    unknown_message,
    unknown_webhook,
)

EventBuilder = Callable[[int], JsonDict]
"""Builds an event's ``d`` for one session, given that session's intents (content visibility depends on it)."""

_USER_MENTION = re.compile(r"<@!?(\d+)>")
_ROLE_MENTION = re.compile(r"<@&(\d+)>")
_EDITABLE_FLAGS = 1 << 2  # SUPPRESS_EMBEDS is the only flag a message edit may change
_ONE_HOUR = 3600.0


class EventSink(Protocol):
    def dispatch(
        self, event: str, build: EventBuilder, *, intents: int, guild_id: int | None
    ) -> list[asyncio.Future[bool]]: ...


class _NoSink:
    def dispatch(
        self, event: str, build: EventBuilder, *, intents: int, guild_id: int | None
    ) -> list[asyncio.Future[bool]]:
        return []


class World:
    """Everything the fake knows. Owned by :class:`adapters.discord.testing.FakeDiscord`."""

    def __init__(
        self,
        *,
        clock: FakeClock,
        token: str,
        bot_name: str,
        application_id: int | None,
        bot_user_id: int | None,
        nonce_window: float,
        interaction_deadline: float,
        interaction_token_lifetime: float,
        old_message_edit_limit: int,
        message_content_granted: bool,
    ) -> None:
        self.clock = clock
        self.ids = Snowflakes(clock)
        self.token = token
        self.sink: EventSink = _NoSink()
        self.on_change: Callable[[], None] = lambda: None
        self.users: dict[int, FakeUser] = {}
        self.guilds: dict[int, FakeGuild] = {}
        self.channels: dict[int, FakeChannel] = {}
        self.messages: dict[int, FakeMessage] = {}
        self.ephemeral_messages: list[FakeMessage] = []
        self.interactions: dict[int, InteractionRecord] = {}
        self._interactions_by_token: dict[str, InteractionRecord] = {}
        self._nonces: dict[tuple[int, str], tuple[int, float]] = {}
        self._old_edits: dict[int, list[float]] = {}
        self.nonce_window = nonce_window
        self.interaction_deadline = interaction_deadline
        self.interaction_token_lifetime = interaction_token_lifetime
        self.old_message_edit_limit = old_message_edit_limit
        self.message_content_granted = message_content_granted
        self.bot = self.add_user(bot_name, id=bot_user_id, bot=True)
        self.application_id = self.bot.id if application_id is None else self.ids.reserve(application_id)
        self.application_name = bot_name

    # --- setup --------------------------------------------------------------------------------------------

    def _new_id(self, explicit: int | None) -> int:
        if explicit is None:
            return self.ids.next()
        if explicit in self.users or explicit in self.guilds or explicit in self.channels:
            raise ValueError(f"id {explicit} is already taken")
        return self.ids.reserve(explicit)

    def add_user(
        self, username: str, global_name: str | None = None, *, id: int | None = None, bot: bool = False
    ) -> FakeUser:
        user = FakeUser(id=self._new_id(id), username=username, global_name=global_name, bot=bot)
        self.users[user.id] = user
        self.on_change()
        return user

    def add_guild(self, name: str, *, id: int | None = None, owner: FakeUser | None = None) -> FakeGuild:
        guild_id = self._new_id(id)
        now = self.clock.now()
        owner_user = owner or self.bot
        guild = FakeGuild(id=guild_id, name=name, owner_id=owner_user.id, created_at=now)
        guild.roles[guild_id] = FakeRole(
            id=guild_id, guild_id=guild_id, name="@everyone", permissions=DEFAULT_EVERYONE_PERMISSIONS
        )
        guild.members[self.bot.id] = FakeMember(user=self.bot, guild_id=guild_id, joined_at=now)
        if owner_user.id not in guild.members:
            guild.members[owner_user.id] = FakeMember(user=owner_user, guild_id=guild_id, joined_at=now)
        self.guilds[guild_id] = guild
        self.sink.dispatch(
            "GUILD_CREATE",
            lambda intents: self.guild_create_payload(guild, intents),
            intents=0,
            guild_id=guild_id,
        )
        self.on_change()
        return guild

    def add_role(
        self, guild: FakeGuild, name: str, *, permissions: int = 0, id: int | None = None
    ) -> FakeRole:
        role = FakeRole(
            id=self._new_id(id),
            guild_id=guild.id,
            name=name,
            permissions=permissions,
            position=len(guild.roles),
        )
        guild.roles[role.id] = role
        self.sink.dispatch(
            "GUILD_ROLE_CREATE",
            lambda _: {"guild_id": str(guild.id), "role": role.payload()},
            intents=GatewayIntent.GUILDS,
            guild_id=guild.id,
        )
        self.on_change()
        return role

    def add_member(
        self, guild: FakeGuild, user: FakeUser, *, roles: Iterable[FakeRole] = (), nick: str | None = None
    ) -> FakeMember:
        role_ids = [r.id for r in roles]
        for role_id in role_ids:
            if role_id not in guild.roles:
                raise ValueError(f"role {role_id} is not a role of guild {guild.id}")
        existing = guild.members.get(user.id)
        if existing is not None:
            existing.role_ids = role_ids
            existing.nick = nick
            self.sink.dispatch(
                "GUILD_MEMBER_UPDATE",
                lambda _: {"guild_id": str(guild.id), **existing.payload()},
                intents=GatewayIntent.GUILD_MEMBERS,
                guild_id=guild.id,
            )
            self.on_change()
            return existing
        member = FakeMember(
            user=user, guild_id=guild.id, role_ids=role_ids, nick=nick, joined_at=self.clock.now()
        )
        guild.members[user.id] = member
        self.sink.dispatch(
            "GUILD_MEMBER_ADD",
            lambda _: {"guild_id": str(guild.id), **member.payload()},
            intents=GatewayIntent.GUILD_MEMBERS,
            guild_id=guild.id,
        )
        self.on_change()
        return member

    def add_text_channel(
        self, guild: FakeGuild, name: str, *, topic: str | None = None, id: int | None = None
    ) -> FakeChannel:
        channel = FakeChannel(
            id=self._new_id(id),
            type=ChannelType.GUILD_TEXT,
            name=name,
            guild_id=guild.id,
            position=len(guild.channel_ids),
            topic=topic,
            created_at=self.clock.now(),
        )
        self.channels[channel.id] = channel
        guild.channel_ids.append(channel.id)
        self.sink.dispatch(
            "CHANNEL_CREATE", lambda _: channel.payload(), intents=GatewayIntent.GUILDS, guild_id=guild.id
        )
        self.on_change()
        return channel

    def dm_channel(self, user: FakeUser) -> FakeChannel:
        """The DM channel between the bot and ``user`` (created on first use, like Discord)."""
        for channel in self.channels.values():
            if channel.is_dm and channel.recipient is user:
                return channel
        channel = FakeChannel(
            id=self.ids.next(),
            type=ChannelType.DM,
            name="",
            guild_id=None,
            recipient=user,
            created_at=self.clock.now(),
        )
        self.channels[channel.id] = channel
        self.on_change()
        return channel

    # --- lookups ------------------------------------------------------------------------------------------

    def channel(self, channel_id: int) -> FakeChannel:
        try:
            return self.channels[channel_id]
        except KeyError:
            raise unknown_channel() from None

    def message_in(self, channel: FakeChannel, message_id: int) -> FakeMessage:
        msg = self.messages.get(message_id)
        if msg is None or msg.deleted or msg.channel_id != channel.id or msg.ephemeral:
            raise unknown_message()
        return msg

    def guild_of(self, channel: FakeChannel) -> FakeGuild | None:
        return None if channel.guild_id is None else self.guilds[channel.guild_id]

    def member_permissions(self, member: FakeMember) -> int:
        guild = self.guilds[member.guild_id]
        if guild.owner_id == member.user.id:
            return (1 << 41) - 1
        perms = guild.everyone_role.permissions
        for role_id in member.role_ids:
            perms |= guild.roles[role_id].permissions
        if perms & (1 << 3):  # ADMINISTRATOR
            return (1 << 41) - 1
        return perms

    def ensure_member(self, channel: FakeChannel, user: FakeUser) -> None:
        guild = self.guild_of(channel)
        if guild is not None and user.id not in guild.members:
            self.add_member(guild, user)

    # --- content visibility -------------------------------------------------------------------------------

    def content_visible(self, msg: FakeMessage, session_intents: int | None) -> bool:
        """Whether the bot may see ``msg``'s content (MESSAGE_CONTENT rules).

        ``session_intents`` is the receiving gateway session's intents, or None for a REST read. Content is
        always visible in DMs, in the bot's own messages, and in messages that mention the bot.
        """
        if msg.author.id == self.bot.id or msg.guild_id is None or self.bot.id in msg.mention_ids:
            return True
        if not self.message_content_granted:
            return False
        return session_intents is None or bool(session_intents & GatewayIntent.MESSAGE_CONTENT)

    # --- payloads -----------------------------------------------------------------------------------------

    def message_payload(
        self,
        msg: FakeMessage,
        *,
        session_intents: int | None = None,
        gateway: bool = False,
        include_nonce: bool = False,
        resolve_reference: bool = True,
    ) -> JsonDict:
        visible = self.content_visible(msg, session_intents)
        guild = None if msg.guild_id is None else self.guilds.get(msg.guild_id)
        mentions: list[JsonDict] = []
        for user_id in msg.mention_ids:
            user = self.users[user_id]
            payload = user.payload()
            if gateway and guild is not None and user_id in guild.members:
                payload["member"] = guild.members[user_id].payload(with_user=False)
            mentions.append(payload)
        data: JsonDict = {
            "id": str(msg.id),
            "channel_id": str(msg.channel_id),
            "author": msg.author.payload(),
            "content": msg.content if visible else "",
            "timestamp": iso(msg.created_at),
            "edited_timestamp": None if msg.edited_at is None else iso(msg.edited_at),
            "tts": False,
            "mention_everyone": msg.mention_everyone,
            "mentions": mentions,
            "mention_roles": [str(r) for r in msg.mention_role_ids],
            "attachments": list(msg.attachments) if visible else [],
            "embeds": list(msg.embeds) if visible else [],
            "components": list(msg.components) if visible else [],
            "pinned": False,
            "type": int(msg.type),
            "flags": msg.flags,
        }
        if gateway and msg.guild_id is not None:
            data["guild_id"] = str(msg.guild_id)
            if guild is not None and msg.webhook_id is None and msg.author.id in guild.members:
                data["member"] = guild.members[msg.author.id].payload(with_user=False)
        if include_nonce and msg.nonce is not None:
            data["nonce"] = msg.nonce
        if msg.webhook_id is not None:
            data["webhook_id"] = str(msg.webhook_id)
        if msg.application_id is not None:
            data["application_id"] = str(msg.application_id)
        if msg.interaction_metadata is not None:
            data["interaction_metadata"] = msg.interaction_metadata
        if msg.reference is not None:
            data["message_reference"] = dict(msg.reference)
            if resolve_reference and msg.type in (MessageType.REPLY, MessageType.THREAD_STARTER_MESSAGE):
                ref = self.messages.get(int(msg.reference["message_id"]))
                data["referenced_message"] = (
                    None
                    if ref is None or ref.deleted
                    else self.message_payload(
                        ref, session_intents=session_intents, gateway=gateway, resolve_reference=False
                    )
                )
        if msg.thread_id is not None and msg.thread_id in self.channels:
            data["thread"] = self.channels[msg.thread_id].payload()
        return data

    def guild_create_payload(self, guild: FakeGuild, intents: int) -> JsonDict:
        channels = [self.channels[c] for c in guild.channel_ids]
        threads = [
            c for c in self.channels.values() if c.is_thread and c.guild_id == guild.id and not c.archived
        ]
        # Like Discord without GUILD_PRESENCES: the member list holds the bot; the rest comes from chunking.
        members = [guild.members[self.bot.id].payload()]
        return {
            "id": str(guild.id),
            "name": guild.name,
            "icon": None,
            "splash": None,
            "discovery_splash": None,
            "banner": None,
            "description": None,
            "owner_id": str(guild.owner_id),
            "afk_channel_id": None,
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "nsfw_level": 0,
            "premium_tier": 0,
            "premium_subscription_count": 0,
            "premium_progress_bar_enabled": False,
            "preferred_locale": "en-US",
            "system_channel_id": None,
            "system_channel_flags": 0,
            "rules_channel_id": None,
            "public_updates_channel_id": None,
            "vanity_url_code": None,
            "application_id": None,
            "features": [],
            "emojis": [],
            "stickers": [],
            "roles": [r.payload() for r in guild.roles.values()],
            "joined_at": iso(guild.members[self.bot.id].joined_at),
            "large": len(guild.members) > 250,
            "unavailable": False,
            "member_count": len(guild.members),
            "members": members,
            "voice_states": [],
            "presences": [],
            "channels": [c.payload(include_guild_id=False) for c in channels],
            "threads": [t.payload() for t in threads],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
        }

    def guild_payload(self, guild: FakeGuild) -> JsonDict:
        data = self.guild_create_payload(guild, 0)
        for key in ("members", "channels", "threads", "voice_states", "presences", "joined_at", "large"):
            data.pop(key, None)
        return data

    def application_payload(self) -> JsonDict:
        # GATEWAY_MESSAGE_CONTENT_LIMITED (1 << 19) is what an app in fewer than 100 servers has when the
        # "Message Content Intent" toggle is on (verified apps get 1 << 18 instead); neither flag: not enabled.
        flags = (1 << 19) if self.message_content_granted else 0
        return {
            "id": str(self.application_id),
            "name": self.application_name,
            "icon": None,
            "description": "",
            "bot_public": True,
            "bot_require_code_grant": False,
            "verify_key": "0" * 64,
            "flags": flags,
            "owner": self.bot.payload(),
            "team": None,
            "bot": self.bot.payload(),
            "interactions_endpoint_url": None,
            "redirect_uris": [],
            "tags": [],
        }

    # --- messages -----------------------------------------------------------------------------------------

    def _message_intents(self, channel: FakeChannel) -> int:
        return GatewayIntent.DIRECT_MESSAGES if channel.is_dm else GatewayIntent.GUILD_MESSAGES

    def emit_message(self, event: str, msg: FakeMessage) -> list[asyncio.Future[bool]]:
        channel = self.channels[msg.channel_id]
        include_nonce = event == "MESSAGE_CREATE"
        return self.sink.dispatch(
            event,
            lambda intents: self.message_payload(
                msg, session_intents=intents, gateway=True, include_nonce=include_nonce
            ),
            intents=self._message_intents(channel),
            guild_id=msg.guild_id,
        )

    def _parse_mentions(self, content: str, guild: FakeGuild | None) -> tuple[list[int], list[int], bool]:
        users: list[int] = []
        for match in _USER_MENTION.finditer(content):
            user_id = int(match.group(1))
            if user_id in self.users and user_id not in users:
                users.append(user_id)
        roles: list[int] = []
        if guild is not None:
            for match in _ROLE_MENTION.finditer(content):
                role_id = int(match.group(1))
                if role_id in guild.roles and role_id not in roles:
                    roles.append(role_id)
        everyone = guild is not None and ("@everyone" in content or "@here" in content)
        return users, roles, everyone

    @staticmethod
    def _validate_body(
        content: str,
        embeds: list[JsonDict],
        components: list[JsonDict],
        attachments: list[JsonDict],
        *,
        allow_empty: bool = False,
    ) -> None:
        if len(content) > MAX_CONTENT_LENGTH:
            raise invalid_form(
                "content", "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_CONTENT_LENGTH} or fewer in length."
            )
        if not allow_empty and not content and not embeds and not components and not attachments:
            raise empty_message()
        seen: set[str] = set()
        for custom_id in collect_custom_ids(components):
            if not 1 <= len(custom_id) <= MAX_CUSTOM_ID_LENGTH:
                raise invalid_form(
                    "components",
                    "BASE_TYPE_BAD_LENGTH",
                    f"Must be between 1 and {MAX_CUSTOM_ID_LENGTH} in length.",
                )
            if custom_id in seen:
                raise invalid_form(
                    "components", "COMPONENT_CUSTOM_ID_DUPLICATED", "Component custom id cannot be duplicated"
                )
            seen.add(custom_id)

    def create_message(
        self,
        channel: FakeChannel,
        author: FakeUser,
        *,
        content: str = "",
        nonce: str | int | None = None,
        enforce_nonce: bool = False,
        components: list[JsonDict] | None = None,
        embeds: list[JsonDict] | None = None,
        attachments: list[JsonDict] | None = None,
        message_reference: JsonDict | None = None,
        mention_replied_user: bool = True,
        flags: int = 0,
        webhook_id: int | None = None,
        interaction_metadata: JsonDict | None = None,
        ephemeral_for: int | None = None,
        allow_empty: bool = False,
        dispatch: bool = True,
    ) -> tuple[FakeMessage, bool]:
        """Validate and store a message, then emit MESSAGE_CREATE. Returns ``(message, created)``.

        ``created`` is False when ``enforce_nonce`` matched an earlier message by the same author within the
        nonce window: that message is returned and nothing is stored or dispatched.
        """
        now = self.clock.now()
        nonce_str = None if nonce is None else str(nonce)
        if nonce_str is not None and len(nonce_str) > MAX_NONCE_LENGTH:
            raise invalid_form(
                "nonce", "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_NONCE_LENGTH} or fewer in length."
            )
        if nonce_str is not None and enforce_nonce:
            earlier = self._nonces.get((author.id, nonce_str))
            if earlier is not None and now - earlier[1] <= self.nonce_window:
                previous = self.messages[earlier[0]]
                if previous.deleted:
                    raise unknown_message()
                return previous, False
        components = list(components or [])
        embeds = list(embeds or [])
        attachments = list(attachments or [])
        self._validate_body(content, embeds, components, attachments, allow_empty=allow_empty)

        guild = self.guild_of(channel)
        msg_type = MessageType.DEFAULT
        reference: JsonDict | None = None
        mention_ids, mention_roles, everyone = self._parse_mentions(content, guild)
        if message_reference is not None:
            ref_id = int(message_reference["message_id"])
            ref_channel_id = int(message_reference.get("channel_id") or channel.id)
            target = self.messages.get(ref_id)
            exists = (
                target is not None
                and not target.deleted
                and not target.ephemeral
                and target.channel_id == ref_channel_id
            )
            if not exists:
                if message_reference.get("fail_if_not_exists", True):
                    raise invalid_form(
                        "message_reference", "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "Unknown message"
                    )
            else:
                assert target is not None
                msg_type = MessageType.REPLY
                reference = {
                    "type": 0,
                    "message_id": str(target.id),
                    "channel_id": str(target.channel_id),
                }
                if target.guild_id is not None:
                    reference["guild_id"] = str(target.guild_id)
                if mention_replied_user and target.author.id not in mention_ids:
                    mention_ids.append(target.author.id)

        msg = FakeMessage(
            id=self.ids.next(),
            channel_id=channel.id,
            guild_id=channel.guild_id,
            author=author,
            content=content,
            created_at=now,
            type=msg_type,
            flags=flags,
            nonce=nonce_str,
            components=components,
            embeds=embeds,
            attachments=attachments,
            mention_ids=mention_ids,
            mention_role_ids=mention_roles,
            mention_everyone=everyone,
            reference=reference,
            webhook_id=webhook_id,
            application_id=self.application_id if webhook_id is not None else None,
            interaction_metadata=interaction_metadata,
            ephemeral_for=ephemeral_for,
        )
        self.messages[msg.id] = msg
        if msg.ephemeral:
            self.ephemeral_messages.append(msg)
        else:
            channel.messages.append(msg)
            channel.total_message_sent += 1
            if nonce_str is not None:
                self._nonces[(author.id, nonce_str)] = (msg.id, now)
            if dispatch:
                self.emit_message("MESSAGE_CREATE", msg)
        self.on_change()
        return msg, True

    def edit_message(
        self, msg: FakeMessage, body: JsonDict, *, editor: FakeUser | None, enforce_age_limit: bool
    ) -> FakeMessage:
        """Apply a PATCH body (content / components / embeds / flags) and emit MESSAGE_UPDATE."""
        if editor is not None and msg.author.id != editor.id:
            raise cannot_edit_others()
        now = self.clock.now()
        content = msg.content
        if "content" in body:
            content = body["content"] or ""
        components = msg.components if "components" not in body else list(body["components"] or [])
        embeds = msg.embeds if "embeds" not in body else list(body["embeds"] or [])
        if "embed" in body:
            embeds = [] if body["embed"] is None else [body["embed"]]
        attachments = msg.attachments if "attachments" not in body else list(body["attachments"] or [])
        self._validate_body(content, embeds, components, attachments)
        if enforce_age_limit and now - msg.created_at > _ONE_HOUR:
            window = [t for t in self._old_edits.get(msg.channel_id, []) if now - t < _ONE_HOUR]
            if len(window) >= self.old_message_edit_limit:
                self._old_edits[msg.channel_id] = window
                raise old_message_edit_limit()
            window.append(now)
            self._old_edits[msg.channel_id] = window
        msg.edits.append(
            MessageVersion(content=msg.content, components=msg.components, embeds=msg.embeds, replaced_at=now)
        )
        msg.content = content
        msg.components = components
        msg.embeds = embeds
        msg.attachments = attachments
        msg.edited_at = now
        msg.flags &= ~int(MessageFlag.LOADING)
        if "flags" in body and body["flags"] is not None:
            msg.flags = (msg.flags & ~_EDITABLE_FLAGS) | (int(body["flags"]) & _EDITABLE_FLAGS)
        guild = None if msg.guild_id is None else self.guilds.get(msg.guild_id)
        users, roles, everyone = self._parse_mentions(content, guild)
        replied = [u for u in msg.mention_ids if u not in users]
        msg.mention_ids = users + replied if msg.type is MessageType.REPLY else users
        msg.mention_role_ids = roles
        msg.mention_everyone = everyone
        if not msg.ephemeral:
            self.emit_message("MESSAGE_UPDATE", msg)
        self.on_change()
        return msg

    def delete_message(self, msg: FakeMessage) -> list[asyncio.Future[bool]]:
        msg.deleted = True
        futures: list[asyncio.Future[bool]] = []
        if not msg.ephemeral:
            channel = self.channels[msg.channel_id]
            data: JsonDict = {"id": str(msg.id), "channel_id": str(msg.channel_id)}
            if msg.guild_id is not None:
                data["guild_id"] = str(msg.guild_id)
            futures = self.sink.dispatch(
                "MESSAGE_DELETE",
                lambda _: dict(data),
                intents=self._message_intents(channel),
                guild_id=msg.guild_id,
            )
        self.on_change()
        return futures

    def history(
        self,
        channel: FakeChannel,
        *,
        limit: int = 50,
        before: int | None = None,
        after: int | None = None,
        around: int | None = None,
    ) -> list[FakeMessage]:
        """Messages like ``GET /channels/{id}/messages``: at most ``limit``, newest first."""
        if not 1 <= limit <= 100:
            raise invalid_form("limit", "NUMBER_TYPE_MAX", "int value should be between 1 and 100.")
        msgs = channel.visible_messages()
        if around is not None:
            older = [m for m in msgs if m.id < around][-(limit // 2) :] if limit // 2 else []
            newer = [m for m in msgs if m.id >= around][: limit - limit // 2]
            chosen = older + newer
        elif before is not None:
            chosen = [m for m in msgs if m.id < before][-limit:]
        elif after is not None:
            chosen = [m for m in msgs if m.id > after][:limit]
        else:
            chosen = msgs[-limit:]
        return list(reversed(chosen))

    # --- threads ------------------------------------------------------------------------------------------

    def create_thread(
        self,
        channel: FakeChannel,
        message_id: int,
        *,
        name: str,
        owner: FakeUser,
        auto_archive_duration: int = 1440,
    ) -> FakeChannel:
        """Start a public thread on a message: the thread's id is the message's id."""
        if channel.type is not ChannelType.GUILD_TEXT:
            raise DiscordAPIError(400, 50024, "Cannot execute action on this channel type")
        source = self.message_in(channel, message_id)
        if source.thread_id is not None:
            raise thread_already_created()
        if not 1 <= len(name) <= 100:
            raise invalid_form("name", "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")
        now = self.clock.now()
        thread = FakeChannel(
            id=source.id,
            type=ChannelType.PUBLIC_THREAD,
            name=name,
            guild_id=channel.guild_id,
            parent_id=channel.id,
            owner_id=owner.id,
            created_at=now,
            auto_archive_duration=auto_archive_duration,
        )
        self.channels[thread.id] = thread
        source.thread_id = thread.id
        source.flags |= MessageFlag.HAS_THREAD

        def thread_create(_: int) -> JsonDict:
            data = thread.payload()
            data["newly_created"] = True
            if owner.id == self.bot.id:
                data["member"] = {
                    "id": str(thread.id),
                    "user_id": str(owner.id),
                    "join_timestamp": iso(now),
                    "flags": 0,
                }
            return data

        self.sink.dispatch(
            "THREAD_CREATE", thread_create, intents=GatewayIntent.GUILDS, guild_id=thread.guild_id
        )
        # Like Discord, the thread opens with a THREAD_STARTER_MESSAGE that only references the source message.
        starter = FakeMessage(
            id=self.ids.next(),
            channel_id=thread.id,
            guild_id=thread.guild_id,
            author=source.author,
            content="",
            created_at=now,
            type=MessageType.THREAD_STARTER_MESSAGE,
            reference={
                "type": 0,
                "message_id": str(source.id),
                "channel_id": str(channel.id),
                "guild_id": str(channel.guild_id),
            },
        )
        self.messages[starter.id] = starter
        thread.messages.append(starter)
        self.emit_message("MESSAGE_CREATE", starter)
        self.on_change()
        return thread

    # --- interactions -------------------------------------------------------------------------------------

    def create_component_interaction(
        self, msg: FakeMessage, custom_id: str, user: FakeUser, *, values: list[str] | None = None
    ) -> InteractionRecord:
        if msg.deleted:
            raise ValueError(f"message {msg.id} was deleted")
        component = msg.find_component(custom_id)
        if component is None:
            raise ValueError(
                f"message {msg.id} has no component with custom_id {custom_id!r}: {msg.custom_ids()}"
            )
        if component.get("disabled"):
            raise ValueError(f"component {custom_id!r} on message {msg.id} is disabled and cannot be clicked")
        channel = self.channels[msg.channel_id]
        self.ensure_member(channel, user)
        record = InteractionRecord(
            id=self.ids.next(),
            token=f"aW50ZXJhY3Rpb24{secrets.token_urlsafe(48)}",
            application_id=self.application_id,
            custom_id=custom_id,
            component_type=int(component.get("type", 2)),
            user=user,
            guild_id=channel.guild_id,
            channel_id=channel.id,
            message=msg,
            created_at=self.clock.now(),
            deadline=self.interaction_deadline,
            token_lifetime=self.interaction_token_lifetime,
            values=list(values or []),
        )
        self.interactions[record.id] = record
        self._interactions_by_token[record.token] = record
        self.on_change()
        return record

    def interaction_payload(self, record: InteractionRecord) -> JsonDict:
        channel = self.channels[record.channel_id]
        data: JsonDict = {"custom_id": record.custom_id, "component_type": record.component_type}
        if record.component_type != 2:
            data["values"] = list(record.values)
        payload: JsonDict = {
            "id": str(record.id),
            "application_id": str(record.application_id),
            "type": 3,
            "token": record.token,
            "version": 1,
            "data": data,
            "channel_id": str(channel.id),
            "channel": channel.payload(),
            "message": self.message_payload(record.message, gateway=False),
            "locale": "en-US",
            "entitlements": [],
            "attachment_size_limit": 10 * 1024 * 1024,
        }
        if channel.guild_id is not None:
            guild = self.guilds[channel.guild_id]
            member = guild.members[record.user.id]
            bot_member = guild.members[self.bot.id]
            payload.update(
                guild_id=str(guild.id),
                guild={"id": str(guild.id), "locale": "en-US", "features": []},
                guild_locale="en-US",
                member=member.payload(permissions=self.member_permissions(member)),
                app_permissions=str(self.member_permissions(bot_member)),
                authorizing_integration_owners={"0": str(guild.id)},
                context=0,
            )
        else:
            payload.update(
                user=record.user.payload(),
                app_permissions="0",
                authorizing_integration_owners={"1": str(record.user.id)},
                context=1,
            )
        return payload

    def _interaction_metadata(self, record: InteractionRecord) -> JsonDict:
        return {
            "id": str(record.id),
            "type": 3,
            "user": record.user.payload(),
            "authorizing_integration_owners": {"0": str(record.guild_id or record.user.id)},
            "interacted_message_id": str(record.message.id),
        }

    def interaction_callback(self, interaction_id: int, token: str, body: JsonDict) -> JsonDict:
        """Handle ``POST /interactions/{id}/{token}/callback``; returns the ``with_response`` body."""
        record = self.interactions.get(interaction_id)
        if record is None or record.token != token:
            raise unknown_interaction()
        now = self.clock.now()
        start = record.dispatched_at if record.dispatched_at is not None else record.created_at
        delay = now - start
        try:
            response_type = int(body["type"])
        except (KeyError, TypeError, ValueError):
            raise invalid_form("type", "BASE_TYPE_REQUIRED", "This field is required") from None
        data: JsonDict = dict(body.get("data") or {})

        def reject(error: DiscordAPIError) -> DiscordAPIError:
            record.attempts.append(
                InteractionResponse(response_type, data, now, delay, accepted=False, error_code=error.code)
            )
            self.on_change()
            return error

        if record.responded:
            raise reject(already_acknowledged())
        if delay > record.deadline:
            raise reject(unknown_interaction())
        if response_type not in (4, 5, 6, 7, 9):
            raise reject(invalid_form("type", "BASE_TYPE_CHOICES", "Value must be one of {4, 5, 6, 7, 9}."))

        channel = self.channels[record.channel_id]
        resource_message: FakeMessage | None = None
        if response_type in (4, 5):
            flags = int(data.get("flags") or 0) & int(MessageFlag.EPHEMERAL)
            if response_type == 5:
                flags |= MessageFlag.LOADING
            try:
                msg, _ = self.create_message(
                    channel,
                    self.bot,
                    content=str(data.get("content") or ""),
                    components=data.get("components"),
                    embeds=data.get("embeds"),
                    flags=flags,
                    webhook_id=record.application_id,
                    interaction_metadata=self._interaction_metadata(record),
                    ephemeral_for=record.user.id if flags & MessageFlag.EPHEMERAL else None,
                    allow_empty=response_type == 5,
                )
            except DiscordAPIError as error:
                raise reject(error) from None
            record.original = msg
            resource_message = msg
        elif response_type == 7:
            try:
                self.edit_message(record.message, data, editor=None, enforce_age_limit=False)
            except DiscordAPIError as error:
                raise reject(error) from None
            resource_message = record.message
        record.attempts.append(InteractionResponse(response_type, data, now, delay, accepted=True))
        self.on_change()

        interaction: JsonDict = {
            "id": str(record.id),
            "type": 3,
            "response_message_loading": response_type == 5,
            "response_message_ephemeral": bool(record.original is not None and record.original.ephemeral),
        }
        if resource_message is not None:
            interaction["response_message_id"] = str(resource_message.id)
        result: JsonDict = {"interaction": interaction}
        if response_type != 9:
            resource: JsonDict = {"type": response_type}
            if resource_message is not None:
                resource["message"] = self.message_payload(resource_message)
            result["resource"] = resource
        return result

    def interaction_for_webhook(self, application_id: int, token: str) -> InteractionRecord:
        record = self._interactions_by_token.get(token)
        if record is None or application_id != record.application_id:
            raise unknown_webhook()
        if self.clock.now() - record.created_at > record.token_lifetime:
            raise invalid_webhook_token()
        return record

    def webhook_message(self, record: InteractionRecord, message_ref: str) -> FakeMessage:
        """Resolve ``@original`` or a follow-up id for an interaction's webhook routes."""
        if message_ref == "@original":
            response = record.response
            if response is None:
                raise unknown_message()
            msg = record.original if response.type in (4, 5) else record.message
            if msg is None or msg.deleted:
                raise unknown_message()
            return msg
        try:
            wanted = int(message_ref)
        except ValueError:
            raise unknown_message() from None
        for msg in record.followups:
            if msg.id == wanted and not msg.deleted:
                return msg
        if record.original is not None and record.original.id == wanted and not record.original.deleted:
            return record.original
        raise unknown_message()

    def create_followup(self, record: InteractionRecord, body: JsonDict) -> FakeMessage:
        if not record.responded:
            raise unknown_webhook()
        flags = int(body.get("flags") or 0) & int(MessageFlag.EPHEMERAL)
        msg, _ = self.create_message(
            self.channels[record.channel_id],
            self.bot,
            content=str(body.get("content") or ""),
            components=body.get("components"),
            embeds=body.get("embeds"),
            flags=flags,
            webhook_id=record.application_id,
            interaction_metadata=self._interaction_metadata(record),
            ephemeral_for=record.user.id if flags else None,
        )
        record.followups.append(msg)
        self.on_change()
        return msg


def as_int(value: Any) -> int | None:
    """Parse an optional snowflake/int query or JSON value."""
    if value is None or value == "":
        return None
    return int(value)
