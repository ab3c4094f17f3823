"""Platform-neutral shapes: places, incoming messages, channel policies, and the errors transports raise."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from adapters.bridge.outside import valid_text


@dataclass(frozen=True)
class Place:
    """Where a message lives: (platform, workspace/guild, channel, thread or None)."""

    platform: str
    workspace: str
    channel: str
    thread: str | None = None

    @property
    def key(self) -> str:
        base = f"{self.platform}:{self.workspace}:{self.channel}"
        return base if self.thread is None else f"{base}:{self.thread}"

    @property
    def channel_place(self) -> Place:
        return Place(self.platform, self.workspace, self.channel)

    def in_thread(self, thread: str) -> Place:
        return Place(self.platform, self.workspace, self.channel, thread)

    def message_key(self, message_id: str) -> str:
        """Message ids are unique per channel on both platforms; threads share their channel's ids."""
        return f"{self.platform}:{self.workspace}:{self.channel}:{message_id}"

    def to_json(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "workspace": self.workspace,
            "channel": self.channel,
            "thread": self.thread,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Place:
        return cls(
            str(value["platform"]), str(value["workspace"]), str(value["channel"]), value.get("thread")
        )


@dataclass(frozen=True)
class IncomingMessage:
    """A human message as an adapter saw it (event or history)."""

    place: Place
    message_id: str
    user_id: str
    user_name: str
    text: str
    mentions_bot: bool = False
    is_dm: bool = False
    reply_to: str | None = None  # the message this one replies to (Discord message_reference)

    def __post_init__(self) -> None:
        # Every field came from outside: a lone surrogate in any of them would fail in storage (or be refused
        # as invalid JSON); it becomes U+FFFD here, whatever the adapter forgot.
        place = self.place
        fixed = Place(
            place.platform,
            valid_text(place.workspace),
            valid_text(place.channel),
            None if place.thread is None else valid_text(place.thread),
        )
        if fixed != place:
            object.__setattr__(self, "place", fixed)
        for name in ("message_id", "user_id", "user_name", "text"):
            object.__setattr__(self, name, valid_text(getattr(self, name)))
        if self.reply_to is not None:
            object.__setattr__(self, "reply_to", valid_text(self.reply_to))

    @property
    def request_id(self) -> str:
        return self.place.message_key(self.message_id)


@dataclass(frozen=True)
class ChannelPolicy:
    """Which messages the bot answers in a channel, and how."""

    answer: Literal["mentions", "all", "none"] = "mentions"
    record_unaddressed: bool = True  # keep messages it does not answer as context
    reply_in_thread: bool = False  # answer top-level messages inside their thread


@dataclass
class BridgeConfig:
    default: ChannelPolicy = field(default_factory=ChannelPolicy)
    channels: dict[str, ChannelPolicy] = field(default_factory=dict)  # by channel id
    answer_dms: bool = True

    def policy(self, place: Place) -> ChannelPolicy:
        return self.channels.get(place.channel, self.default)


class TransportError(Exception):
    """A platform call failed."""


class RetryLater(TransportError):
    """Rate limited (or briefly unavailable): try again after `seconds`."""

    def __init__(self, seconds: float, detail: str = "") -> None:
        super().__init__(f"retry after {seconds:.2f}s {detail}".strip())
        self.seconds = seconds


class MessageGone(TransportError):
    """The message to edit no longer exists."""


class EditExpired(TransportError):
    """The platform refuses further edits of this message (e.g. Discord, older than an hour)."""


class DeleteRefused(TransportError):
    """The platform will not delete this message (no permission, or it cannot delete at all): the bridge edits
    it to nothing visible instead."""
