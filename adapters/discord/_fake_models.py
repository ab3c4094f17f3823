"""Data model of the fake Discord: clock, snowflakes, users, guilds, channels, messages, API errors.

Everything here is plain data plus the JSON shapes discord.py parses (checked against discord.py 2.7's
``state.py``/``message.py``/``guild.py``/``threads.py`` parsers). The behaviour lives in ``_fake_state``.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

JsonDict = dict[str, Any]

DISCORD_EPOCH_MS = 1_420_070_400_000


class GatewayIntent(enum.IntFlag):
    """Gateway intent bits (the ones a chat bot cares about)."""

    GUILDS = 1 << 0
    GUILD_MEMBERS = 1 << 1
    GUILD_PRESENCES = 1 << 8
    GUILD_MESSAGES = 1 << 9
    GUILD_MESSAGE_REACTIONS = 1 << 10
    GUILD_MESSAGE_TYPING = 1 << 11
    DIRECT_MESSAGES = 1 << 12
    DIRECT_MESSAGE_REACTIONS = 1 << 13
    DIRECT_MESSAGE_TYPING = 1 << 14
    MESSAGE_CONTENT = 1 << 15


PRIVILEGED_INTENTS = (
    GatewayIntent.GUILD_MEMBERS | GatewayIntent.GUILD_PRESENCES | GatewayIntent.MESSAGE_CONTENT
)
ALL_INTENT_BITS = (1 << 26) - 1


class ChannelType(enum.IntEnum):
    GUILD_TEXT = 0
    DM = 1
    PUBLIC_THREAD = 11
    PRIVATE_THREAD = 12


class MessageType(enum.IntEnum):
    DEFAULT = 0
    REPLY = 19
    THREAD_STARTER_MESSAGE = 21


class MessageFlag(enum.IntFlag):
    HAS_THREAD = 1 << 5
    EPHEMERAL = 1 << 6
    LOADING = 1 << 7


class InteractionCallbackType(enum.IntEnum):
    PONG = 1
    CHANNEL_MESSAGE_WITH_SOURCE = 4
    DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE = 5
    DEFERRED_UPDATE_MESSAGE = 6
    UPDATE_MESSAGE = 7
    APPLICATION_COMMAND_AUTOCOMPLETE_RESULT = 8
    MODAL = 9


# VIEW_CHANNEL | SEND_MESSAGES | EMBED_LINKS | ATTACH_FILES | READ_MESSAGE_HISTORY | ADD_REACTIONS
# | USE_EXTERNAL_EMOJIS | CREATE_PUBLIC_THREADS | SEND_MESSAGES_IN_THREADS | USE_APPLICATION_COMMANDS
DEFAULT_EVERYONE_PERMISSIONS = (
    (1 << 10)
    | (1 << 11)
    | (1 << 14)
    | (1 << 15)
    | (1 << 16)
    | (1 << 6)
    | (1 << 18)
    | (1 << 35)
    | (1 << 38)
    | (1 << 31)
)
MAX_CONTENT_LENGTH = 2000
MAX_NONCE_LENGTH = 25
MAX_CUSTOM_ID_LENGTH = 100


class FakeClock:
    """Wall-clock time plus an offset the test controls.

    Real time keeps flowing; :meth:`advance` jumps ahead. Message timestamps, snowflakes, the 1-hour edit
    limit, the 3-second interaction deadline, the 15-minute interaction token lifetime and the nonce window
    are all measured on this clock, so a test can age things without sleeping.
    """

    def __init__(self) -> None:
        self._offset = 0.0

    def now(self) -> float:
        """Seconds since the Unix epoch, as the fake sees them."""
        return time.time() + self._offset

    def advance(self, seconds: float) -> None:
        """Move the fake's time forward by ``seconds`` (never backwards)."""
        if seconds < 0:
            raise ValueError("the fake clock only moves forward")
        self._offset += seconds

    @property
    def offset(self) -> float:
        return self._offset


class Snowflakes:
    """Discord-style ids from the fake clock: ``(ms since 2015) << 22``, strictly increasing."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self._last = 0

    def next(self) -> int:
        candidate = (int(self._clock.now() * 1000) - DISCORD_EPOCH_MS) << 22
        if candidate <= self._last:
            candidate = self._last + 1
        self._last = candidate
        return candidate

    def reserve(self, snowflake: int) -> int:
        """Record an explicitly chosen id so later generated ids never collide with it."""
        self._last = max(self._last, snowflake)
        return snowflake


def iso(ts: float) -> str:
    """ISO 8601 timestamp the way Discord writes them."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds")


class DiscordAPIError(Exception):
    """An error response in Discord's shape: ``{"code": ..., "message": ..., "errors": ...}``."""

    def __init__(self, status: int, code: int, message: str, errors: JsonDict | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.errors = errors

    def body(self) -> JsonDict:
        body: JsonDict = {"message": self.message, "code": self.code}
        if self.errors is not None:
            body["errors"] = self.errors
        return body


def invalid_form(field_path: str, code: str, message: str) -> DiscordAPIError:
    """Discord's 50035 "Invalid Form Body" with one nested field error (``"a.b"`` nests ``{"a": {"b": ...}}``)."""
    errors: JsonDict = {"_errors": [{"code": code, "message": message}]}
    for part in reversed(field_path.split(".")):
        errors = {part: errors}
    return DiscordAPIError(400, 50035, "Invalid Form Body", errors)


# Error constructors for the codes the fake returns.
def unknown_channel() -> DiscordAPIError:
    return DiscordAPIError(404, 10003, "Unknown Channel")


def unknown_message() -> DiscordAPIError:
    return DiscordAPIError(404, 10008, "Unknown Message")


def unknown_guild() -> DiscordAPIError:
    return DiscordAPIError(404, 10004, "Unknown Guild")


def unknown_member() -> DiscordAPIError:
    return DiscordAPIError(404, 10007, "Unknown Member")


def unknown_user() -> DiscordAPIError:
    return DiscordAPIError(404, 10013, "Unknown User")


def unknown_webhook() -> DiscordAPIError:
    return DiscordAPIError(404, 10015, "Unknown Webhook")


def unknown_interaction() -> DiscordAPIError:
    return DiscordAPIError(404, 10062, "Unknown interaction")


def already_acknowledged() -> DiscordAPIError:
    return DiscordAPIError(400, 40060, "Interaction has already been acknowledged.")


def invalid_webhook_token() -> DiscordAPIError:
    return DiscordAPIError(401, 50027, "Invalid Webhook Token")


def empty_message() -> DiscordAPIError:
    return DiscordAPIError(400, 50006, "Cannot send an empty message")


def cannot_edit_others() -> DiscordAPIError:
    return DiscordAPIError(403, 50005, "Cannot edit a message authored by another user")


def old_message_edit_limit() -> DiscordAPIError:
    return DiscordAPIError(
        400, 30046, "Maximum number of edits to messages older than 1 hour reached. Try again later"
    )


def thread_already_created() -> DiscordAPIError:
    return DiscordAPIError(400, 160004, "A thread has already been created for this message")


def unauthorized() -> DiscordAPIError:
    return DiscordAPIError(401, 0, "401: Unauthorized")


def not_found() -> DiscordAPIError:
    return DiscordAPIError(404, 0, "404: Not Found")


# --- entities -----------------------------------------------------------------------------------------------


@dataclass(eq=False)
class FakeUser:
    """A Discord user. ``username`` is the unique handle; ``global_name`` the display name (may be None)."""

    id: int
    username: str
    global_name: str | None = None
    bot: bool = False

    @property
    def display_name(self) -> str:
        return self.global_name or self.username

    @property
    def mention(self) -> str:
        return f"<@{self.id}>"

    def payload(self) -> JsonDict:
        return {
            "id": str(self.id),
            "username": self.username,
            "global_name": self.global_name,
            "discriminator": "0",
            "avatar": None,
            "bot": self.bot,
            "system": False,
            "public_flags": 0,
            "banner": None,
            "accent_color": None,
            "avatar_decoration_data": None,
        }


@dataclass(eq=False)
class FakeRole:
    id: int
    guild_id: int
    name: str
    permissions: int = 0
    position: int = 0

    @property
    def mention(self) -> str:
        return f"<@&{self.id}>"

    def payload(self) -> JsonDict:
        return {
            "id": str(self.id),
            "name": self.name,
            "color": 0,
            "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
            "hoist": False,
            "icon": None,
            "unicode_emoji": None,
            "position": self.position,
            "permissions": str(self.permissions),
            "managed": False,
            "mentionable": True,
            "flags": 0,
        }


@dataclass(eq=False)
class FakeMember:
    """A user's membership of a guild, with the ids of its roles (the @everyone role is implied)."""

    user: FakeUser
    guild_id: int
    role_ids: list[int] = field(default_factory=list)
    nick: str | None = None
    joined_at: float = 0.0

    @property
    def display_name(self) -> str:
        return self.nick or self.user.display_name

    def payload(self, *, with_user: bool = True, permissions: int | None = None) -> JsonDict:
        data: JsonDict = {
            "roles": [str(r) for r in self.role_ids],
            "nick": self.nick,
            "avatar": None,
            "banner": None,
            "joined_at": iso(self.joined_at),
            "premium_since": None,
            "deaf": False,
            "mute": False,
            "flags": 0,
            "pending": False,
            "communication_disabled_until": None,
        }
        if with_user:
            data["user"] = self.user.payload()
        if permissions is not None:
            data["permissions"] = str(permissions)
        return data


@dataclass(eq=False)
class FakeChannel:
    """A text channel, a thread (``parent_id`` set, id == starter message id) or a DM (``recipient`` set)."""

    id: int
    type: ChannelType
    name: str
    guild_id: int | None
    parent_id: int | None = None
    position: int = 0
    topic: str | None = None
    owner_id: int | None = None
    recipient: FakeUser | None = None
    created_at: float = 0.0
    archived: bool = False
    locked: bool = False
    auto_archive_duration: int = 1440
    messages: list[FakeMessage] = field(default_factory=list)
    total_message_sent: int = 0

    @property
    def is_thread(self) -> bool:
        return self.type in (ChannelType.PUBLIC_THREAD, ChannelType.PRIVATE_THREAD)

    @property
    def is_dm(self) -> bool:
        return self.type is ChannelType.DM

    @property
    def mention(self) -> str:
        return f"<#{self.id}>"

    def visible_messages(self) -> list[FakeMessage]:
        """Messages in id order (oldest first), deleted ones left out."""
        return [m for m in self.messages if not m.deleted]

    @property
    def last_message_id(self) -> int | None:
        visible = self.visible_messages()
        return visible[-1].id if visible else None

    def payload(self, *, include_guild_id: bool = True) -> JsonDict:
        if self.type is ChannelType.DM:
            assert self.recipient is not None
            return {
                "id": str(self.id),
                "type": int(self.type),
                "last_message_id": _opt_str(self.last_message_id),
                "recipients": [self.recipient.payload()],
                "flags": 0,
            }
        data: JsonDict = {
            "id": str(self.id),
            "type": int(self.type),
            "name": self.name,
            "last_message_id": _opt_str(self.last_message_id),
            "rate_limit_per_user": 0,
            "flags": 0,
        }
        if include_guild_id:
            data["guild_id"] = str(self.guild_id)
        if self.is_thread:
            visible = len(self.visible_messages())
            data.update(
                parent_id=str(self.parent_id),
                owner_id=_opt_str(self.owner_id),
                message_count=visible,
                member_count=1,
                total_message_sent=self.total_message_sent,
                thread_metadata={
                    "archived": self.archived,
                    "auto_archive_duration": self.auto_archive_duration,
                    "archive_timestamp": iso(self.created_at),
                    "locked": self.locked,
                    "create_timestamp": iso(self.created_at),
                },
            )
        else:
            data.update(
                position=self.position,
                parent_id=None,
                topic=self.topic,
                nsfw=False,
                permission_overwrites=[],
                default_auto_archive_duration=1440,
            )
        return data


@dataclass(eq=False)
class FakeGuild:
    id: int
    name: str
    owner_id: int
    created_at: float
    roles: dict[int, FakeRole] = field(default_factory=dict)
    members: dict[int, FakeMember] = field(default_factory=dict)
    channel_ids: list[int] = field(default_factory=list)

    @property
    def everyone_role(self) -> FakeRole:
        return self.roles[self.id]


@dataclass(frozen=True)
class MessageVersion:
    """What a message looked like before one edit, and when that edit happened."""

    content: str
    components: list[JsonDict]
    embeds: list[JsonDict]
    replaced_at: float


@dataclass(eq=False)
class FakeMessage:
    """A stored message. ``edits`` holds earlier versions, oldest first; ``deleted`` messages stay stored."""

    id: int
    channel_id: int
    guild_id: int | None
    author: FakeUser
    content: str
    created_at: float
    type: MessageType = MessageType.DEFAULT
    flags: int = 0
    nonce: str | None = None
    components: list[JsonDict] = field(default_factory=list)
    embeds: list[JsonDict] = field(default_factory=list)
    attachments: list[JsonDict] = field(default_factory=list)
    mention_ids: list[int] = field(default_factory=list)
    mention_role_ids: list[int] = field(default_factory=list)
    mention_everyone: bool = False
    reference: JsonDict | None = None
    edited_at: float | None = None
    edits: list[MessageVersion] = field(default_factory=list)
    deleted: bool = False
    webhook_id: int | None = None
    application_id: int | None = None
    interaction_metadata: JsonDict | None = None
    ephemeral_for: int | None = None
    thread_id: int | None = None

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & MessageFlag.EPHEMERAL)

    @property
    def reply_to(self) -> int | None:
        """The id of the message this one replies to, if any."""
        if self.reference is None or self.type is not MessageType.REPLY:
            return None
        return int(self.reference["message_id"])

    def custom_ids(self) -> list[str]:
        """Every ``custom_id`` in this message's components (buttons, selects, nested layouts)."""
        return collect_custom_ids(self.components)

    def find_component(self, custom_id: str) -> JsonDict | None:
        return _find_component(self.components, custom_id)


def collect_custom_ids(components: list[JsonDict]) -> list[str]:
    """Every ``custom_id`` in a component tree (action rows, buttons, selects, sections), in order."""
    found: list[str] = []
    _collect_custom_ids(components, found)
    return found


def _collect_custom_ids(components: list[JsonDict], found: list[str]) -> None:
    for component in components:
        custom_id = component.get("custom_id")
        if isinstance(custom_id, str):
            found.append(custom_id)
        for key in ("components", "accessory"):
            child = component.get(key)
            if isinstance(child, list):
                _collect_custom_ids(child, found)
            elif isinstance(child, dict):
                _collect_custom_ids([child], found)


def _find_component(components: list[JsonDict], custom_id: str) -> JsonDict | None:
    for component in components:
        if component.get("custom_id") == custom_id:
            return component
        for key in ("components", "accessory"):
            child = component.get(key)
            children = child if isinstance(child, list) else [child] if isinstance(child, dict) else []
            hit = _find_component(children, custom_id)
            if hit is not None:
                return hit
    return None


def _opt_str(value: int | None) -> str | None:
    return None if value is None else str(value)


# --- interactions -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InteractionResponse:
    """One ``POST /interactions/{id}/{token}/callback`` the bot made (accepted or rejected).

    ``delay`` is measured on the fake clock from the moment the INTERACTION_CREATE frame was written to the
    bot's gateway connection to the moment this callback arrived.
    """

    type: int
    data: JsonDict
    received_at: float
    delay: float
    accepted: bool
    error_code: int | None = None

    @property
    def ephemeral(self) -> bool:
        return bool(int(self.data.get("flags") or 0) & MessageFlag.EPHEMERAL)


@dataclass(eq=False)
class InteractionRecord:
    """A component interaction the fake sent (a button click or select), and everything the bot did with it."""

    id: int
    token: str
    application_id: int
    custom_id: str
    component_type: int
    user: FakeUser
    guild_id: int | None
    channel_id: int
    message: FakeMessage
    created_at: float
    deadline: float
    token_lifetime: float
    values: list[str] = field(default_factory=list)
    dispatched_at: float | None = None
    delivered: bool = False
    attempts: list[InteractionResponse] = field(default_factory=list)
    original: FakeMessage | None = None
    followups: list[FakeMessage] = field(default_factory=list)

    @property
    def response(self) -> InteractionResponse | None:
        """The initial response Discord accepted, if any."""
        for attempt in self.attempts:
            if attempt.accepted:
                return attempt
        return None

    @property
    def responded(self) -> bool:
        return self.response is not None

    @property
    def response_type(self) -> int | None:
        response = self.response
        return None if response is None else response.type

    @property
    def answered_in_time(self) -> bool:
        """True when an initial response was accepted within the deadline (3 s on the fake clock)."""
        response = self.response
        return response is not None and response.delay <= self.deadline

    @property
    def ephemeral(self) -> bool:
        """Whether the response message (type 4 or 5) is ephemeral; False for updates (6, 7)."""
        response = self.response
        if response is None or response.type not in (4, 5):
            return False
        return response.ephemeral

    @property
    def response_message(self) -> FakeMessage | None:
        """The message the response shows: the created one for 4/5, the clicked message for 6/7."""
        response = self.response
        if response is None:
            return None
        if response.type in (4, 5):
            return self.original
        if response.type in (6, 7):
            return self.message
        return None

    @property
    def content(self) -> str | None:
        """Current content of :attr:`response_message` (after any edits of ``@original``)."""
        message = self.response_message
        return None if message is None else message.content

    def expired(self, now: float) -> bool:
        """True once the 3-second window has passed without an accepted response."""
        start = self.dispatched_at if self.dispatched_at is not None else self.created_at
        return self.response is None and now - start > self.deadline
