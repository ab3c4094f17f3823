"""Which Slack messages are human input, and where they live.

The same rules apply to `message` and `app_mention` events and to messages read back from history on catch-up,
so one post maps to the same identity (`team:channel:ts`) however it arrives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Subtypes that are a person saying something. Everything else (`bot_message`, the hidden `message_changed`,
# `message_deleted`, `message_replied`, joins, topic changes...) is not input.
HUMAN_SUBTYPES = frozenset({"thread_broadcast", "file_share", "me_message"})
_TS = re.compile(r"^\d+(\.\d+)?$")


class MalformedEvent(ValueError):
    """An event that claims to be a message but lacks what every message has (channel, ts, user)."""


@dataclass(frozen=True)
class HumanMessage:
    channel: str
    ts: str
    user: str
    text: str
    thread: str | None  # the thread's parent ts when this is a reply inside a thread
    channel_type: str | None  # "channel" | "group" | "im" | "mpim" (message events only)
    mentions_bot: bool


def mentions(text: str, bot_user_id: str) -> bool:
    return re.search(rf"<@{re.escape(bot_user_id)}(\|[^>]*)?>", text) is not None


def human_message(
    event: Any, *, bot_user_id: str, bot_id: str | None, channel: str | None = None
) -> HumanMessage | None:
    """The human message in a `message`/`app_mention` event or a history item; None if it is not input (bot
    posts, own posts, hidden subtypes). Raises `MalformedEvent` for a message without channel/ts/user."""
    if not isinstance(event, dict):
        raise MalformedEvent(f"event is {type(event).__name__}, not an object")
    subtype = event.get("subtype")
    if subtype is not None and not isinstance(subtype, str):
        raise MalformedEvent(f"message subtype is {type(subtype).__name__}, not a string")
    if event.get("hidden") or (subtype is not None and subtype not in HUMAN_SUBTYPES):
        return None
    if event.get("bot_id") or event.get("bot_profile"):
        return None  # own posts and other bots (bots answering bots loop)
    user = event.get("user")
    if user == bot_user_id or (bot_id is not None and event.get("bot_id") == bot_id):
        return None
    channel = event.get("channel", channel)
    ts = event.get("ts")
    if not isinstance(channel, str) or not channel:
        raise MalformedEvent("message without a channel")
    if not isinstance(ts, str) or not _TS.match(ts):
        raise MalformedEvent(f"message in {channel} without a valid ts")
    if not isinstance(user, str) or not user:
        raise MalformedEvent(f"message {channel}/{ts} without a user")
    text = event.get("text")
    if not isinstance(text, str):
        text = ""
    thread_ts = event.get("thread_ts")
    thread = thread_ts if isinstance(thread_ts, str) and thread_ts and thread_ts != ts else None
    channel_type = event.get("channel_type")
    return HumanMessage(
        channel=channel,
        ts=ts,
        user=user,
        text=text,
        thread=thread,
        channel_type=channel_type if isinstance(channel_type, str) else None,
        mentions_bot=mentions(text, bot_user_id),
    )
