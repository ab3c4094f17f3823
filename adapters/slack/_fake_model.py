"""Records of the fake Slack: workspace objects, recorded calls, deliveries (private module).

Everything here is re-exported by :mod:`adapters.slack.testing`; import it from there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

JsonDict = dict[str, Any]
"""A JSON object as parsed by :func:`json.loads`."""

ChannelKind = Literal["public", "private", "im", "mpim"]
DeliveryKind = Literal["events_api", "interactive", "slash_commands"]
Transport = Literal["socket", "http"]
AttemptOutcome = Literal["pending", "acked", "timed_out", "rejected", "no_connection", "connection_failed"]
"""What Slack concluded about one delivery attempt.

``acked``: a Socket Mode ack (or an HTTP 2xx) arrived within the ack window. ``timed_out``: nothing in the
window (a late ack is still recorded on the attempt). ``rejected``: the app answered HTTP non-2xx.
``no_connection``: Socket Mode had no open connection. ``connection_failed``: the HTTP request could not be made.
"""


# --------------------------------------------------------------------------------------------------------------
# workspace


@dataclass
class User:
    """A workspace member (``users.info``)."""

    id: str
    name: str
    display_name: str = ""
    real_name: str = ""
    is_bot: bool = False
    bot_id: str | None = None
    deleted: bool = False
    tz: str = "UTC"
    team_id: str = "T1"

    def to_api(self) -> JsonDict:
        """The user object as ``users.info`` returns it."""
        real = self.real_name or self.name
        profile: JsonDict = {
            "display_name": self.display_name,
            "display_name_normalized": self.display_name,
            "real_name": real,
            "real_name_normalized": real,
            "team": self.team_id,
        }
        if self.bot_id is not None:
            profile["bot_id"] = self.bot_id
        return {
            "id": self.id,
            "team_id": self.team_id,
            "name": self.name,
            "deleted": self.deleted,
            "real_name": real,
            "tz": self.tz,
            "is_bot": self.is_bot,
            "is_app_user": False,
            "profile": profile,
        }


@dataclass
class Channel:
    """A conversation: public or private channel, DM (``im``) or group DM (``mpim``)."""

    id: str
    name: str
    kind: ChannelKind
    members: set[str]
    created: int
    creator: str | None = None
    im_user: str | None = None
    """For a DM: the human on the other side of the bot."""
    archived: bool = False

    @property
    def channel_type(self) -> str:
        """The ``channel_type`` field of message events: ``channel``, ``group``, ``im`` or ``mpim``."""
        return {"public": "channel", "private": "group", "im": "im", "mpim": "mpim"}[self.kind]

    @property
    def is_private(self) -> bool:
        return self.kind != "public"

    def to_api(self, bot_user_id: str, *, include_num_members: bool = False) -> JsonDict:
        """The conversation object as ``conversations.info`` returns it."""
        data: JsonDict = {
            "id": self.id,
            "created": self.created,
            "is_archived": self.archived,
            "is_im": self.kind == "im",
            "is_mpim": self.kind == "mpim",
            "is_private": self.is_private,
        }
        if self.kind == "im":
            data.update({"user": self.im_user, "is_open": True, "is_user_deleted": False})
        else:
            data.update(
                {
                    "name": self.name,
                    "name_normalized": self.name,
                    "is_channel": self.kind == "public",
                    "is_group": self.kind == "private",
                    "is_general": False,
                    "is_shared": False,
                    "is_ext_shared": False,
                    "is_org_shared": False,
                    "is_member": bot_user_id in self.members,
                    "creator": self.creator or "",
                    "topic": {"value": "", "creator": "", "last_set": 0},
                    "purpose": {"value": "", "creator": "", "last_set": 0},
                }
            )
        if include_num_members:
            data["num_members"] = len(self.members)
        return data


@dataclass
class UserGroup:
    """A user group (``usergroups.users.list``); mention syntax ``<!subteam^ID>``."""

    id: str
    handle: str
    name: str
    users: list[str]
    disabled: bool = False


@dataclass(frozen=True)
class Revision:
    """An earlier version of a message, kept when the message is edited."""

    text: str
    blocks: list[JsonDict] | None
    metadata: JsonDict | None
    replaced_at: str
    """The Slack ts of the edit that replaced this version."""
    replaced_by: str | None
    via: str
    """``chat.update``, ``response_url``, ``user_edit`` or ``chat.stopStream``."""


@dataclass
class Message:
    """A message stored in a channel's history (top-level or thread reply).

    Bot posts made with the bot token carry both ``user`` (the bot user id) and ``bot_id``, as on Slack.
    """

    channel: str
    ts: str
    text: str
    user: str | None
    bot_id: str | None = None
    app_id: str | None = None
    team: str = "T1"
    thread_ts: str | None = None
    blocks: list[JsonDict] | None = None
    metadata: JsonDict | None = None
    """``{"event_type": ..., "event_payload": {...}}`` or ``None``."""
    subtype: str | None = None
    client_msg_id: str | None = None
    edited: JsonDict | None = None
    """``{"user": ..., "ts": ...}`` once edited, as Slack renders it."""
    revisions: list[Revision] = field(default_factory=list)
    """Earlier versions, oldest first (empty if never edited)."""
    deleted: bool = False
    streaming: bool = False
    """True between ``chat.startStream`` and ``chat.stopStream`` (or expiry)."""
    stream_chunks: list[JsonDict] = field(default_factory=list)
    """Every chunk received by the stream methods, in order (``markdown_text`` calls become chunks too)."""
    stream_last_activity: float = 0.0
    reactions: dict[str, list[str]] = field(default_factory=dict)
    """Emoji name -> user ids (``reactions.add``)."""

    @property
    def is_bot(self) -> bool:
        """Posted through the Web API with the bot token (or by another bot)."""
        return self.bot_id is not None

    @property
    def is_reply(self) -> bool:
        """A reply inside a thread (not the thread's parent)."""
        return self.thread_ts is not None and self.thread_ts != self.ts

    @property
    def event_type(self) -> str | None:
        """``metadata.event_type`` if metadata is set."""
        return None if self.metadata is None else str(self.metadata.get("event_type"))

    @property
    def event_payload(self) -> JsonDict | None:
        """``metadata.event_payload`` if metadata is set."""
        if self.metadata is None:
            return None
        payload = self.metadata.get("event_payload")
        return payload if isinstance(payload, dict) else None


@dataclass(frozen=True)
class Ephemeral:
    """An ephemeral message (``chat.postEphemeral`` or a ``response_url`` answer); never in history."""

    channel: str
    user: str
    text: str
    blocks: list[JsonDict] | None
    thread_ts: str | None
    ts: str
    via: str


# --------------------------------------------------------------------------------------------------------------
# recorded traffic


CallOutcome = Literal["pending", "ok", "error", "ratelimited", "http_error", "dropped", "hook_response"]


@dataclass
class RecordedCall:
    """One Web API request as the fake received it."""

    seq: int
    method: str
    args: JsonDict
    """Arguments merged from query string and body; ``blocks``/``metadata``/``chunks`` JSON strings are parsed."""
    token: str | None
    http_method: str
    content_type: str
    """``json``, ``form`` (urlencoded or multipart) or ``query`` (no body)."""
    headers: dict[str, str]
    received_at: float
    status: int | None = None
    response: JsonDict | None = None
    outcome: CallOutcome = "pending"
    effect_applied: bool = False
    """True once the method changed the workspace (stored/edited/deleted a message...)."""

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def error(self) -> str | None:
        """The Slack ``error`` string of the response, if any."""
        if self.response is None:
            return None
        err = self.response.get("error")
        return None if err is None else str(err)


@dataclass(frozen=True)
class ResponseUrlCall:
    """A POST the app made to a ``response_url`` the fake handed out."""

    url_id: str
    body: JsonDict
    received_at: float
    status: int
    applied: str
    """What the fake did: ``replaced``, ``deleted``, ``posted``, ``ephemeral`` or ``rejected``."""

    @property
    def replace_original(self) -> bool:
        return truthy(self.body.get("replace_original"))

    @property
    def delete_original(self) -> bool:
        return truthy(self.body.get("delete_original"))

    @property
    def response_type(self) -> str:
        return str(self.body.get("response_type") or "ephemeral")

    @property
    def text(self) -> str | None:
        text = self.body.get("text")
        return None if text is None else str(text)


@dataclass
class SocketConnection:
    """One Socket Mode WebSocket connection opened by an app."""

    id: int
    ticket: str
    opened_at: float
    closed_at: float | None = None
    envelopes_sent: int = 0
    frames_received: list[JsonDict] = field(default_factory=list)
    """Every JSON frame the client sent (acks and anything else)."""
    close_reason: str | None = None
    deaf: bool = False
    """Half-open (``FakeSlack.go_deaf``): the socket stays up but nothing gets through either way: pings go
    unanswered, envelopes sent to it and frames the app sends (acks) are lost."""
    pings_unanswered: int = 0
    envelopes_lost: int = 0
    refused: bool = False
    """Refused at once because the app already held ``max_connections`` (Slack: ten) open connections."""

    @property
    def open(self) -> bool:
        return self.closed_at is None


@dataclass
class DeliveryAttempt:
    """One attempt to hand a :class:`Delivery` to the app (a Socket Mode envelope or an HTTP POST)."""

    retry_num: int
    """0 for the first delivery, 1..3 for Slack's retries."""
    retry_reason: str | None
    transport: Transport
    sent_at: float
    deadline: float
    """``sent_at`` + the ack window; an ack after it counts as a timeout (Slack has already given up)."""
    envelope_id: str | None = None
    connection_id: int | None = None
    acked_at: float | None = None
    ack_payload: JsonDict | None = None
    """Socket Mode: the ``payload`` of the ack frame. HTTP: the response body if it was JSON."""
    http_status: int | None = None
    http_body: str | None = None
    http_headers: dict[str, str] = field(default_factory=dict)
    outcome: AttemptOutcome = "pending"
    _settled: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def acked(self) -> bool:
        """An ack (or HTTP 2xx) arrived at all, even after the window."""
        return self.acked_at is not None

    @property
    def acked_in_time(self) -> bool:
        """Acked within the ack window (default 3 s): what Slack counts as delivered."""
        return self.outcome == "acked"

    @property
    def late_ack(self) -> bool:
        return self.acked and not self.acked_in_time

    @property
    def settled(self) -> bool:
        return self.outcome != "pending"

    async def wait_settled(self, timeout: float | None = None) -> AttemptOutcome:
        """Wait until Slack would have judged this attempt (ack, timeout, error); return the outcome."""
        await asyncio.wait_for(self._settled.wait(), timeout)
        return self.outcome

    def _settle(self, outcome: AttemptOutcome) -> None:
        if self.outcome == "pending":
            self.outcome = outcome
            self._settled.set()


@dataclass
class Delivery:
    """Something the fake sends to the app: an Events API callback, an interactive payload or a command.

    Retries reuse the same ``payload`` (so the same ``event_id``); each retry is a new :class:`DeliveryAttempt`.
    """

    id: int
    kind: DeliveryKind
    payload: JsonDict
    attempts: list[DeliveryAttempt] = field(default_factory=list)

    @property
    def event_id(self) -> str | None:
        value = self.payload.get("event_id")
        return None if value is None else str(value)

    @property
    def event(self) -> JsonDict | None:
        """The inner ``event`` of an Events API callback."""
        event = self.payload.get("event")
        return event if isinstance(event, dict) else None

    @property
    def event_type(self) -> str | None:
        event = self.event
        return None if event is None else str(event.get("type"))

    @property
    def acked(self) -> bool:
        """Some attempt was acked within its window (Slack considers it delivered)."""
        return any(a.acked_in_time for a in self.attempts)

    @property
    def last_attempt(self) -> DeliveryAttempt | None:
        return self.attempts[-1] if self.attempts else None

    async def wait_acked(self, timeout: float = 5.0) -> DeliveryAttempt:
        """Wait until some attempt is acked in time (following retries); return that attempt."""
        deadline = time.monotonic() + timeout
        while True:
            for attempt in self.attempts:
                if attempt.acked_in_time:
                    return attempt
            pending = [a for a in self.attempts if not a.settled]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"delivery {self.id} ({self.kind} {self.event_type or ''}) was not acked")
            if pending:
                waiters = [asyncio.ensure_future(a._settled.wait()) for a in pending]
                try:
                    await asyncio.wait(waiters, timeout=min(remaining, 0.05))
                finally:
                    for waiter in waiters:
                        waiter.cancel()
            else:
                await asyncio.sleep(min(remaining, 0.02))


@dataclass(frozen=True)
class HttpResult:
    """What the app answered to a request the fake POSTed to it."""

    status: int
    body: str
    headers: dict[str, str]


@dataclass
class UserPost:
    """The result of :meth:`FakeSlack.user_posts`: the stored message and the deliveries it caused."""

    message: Message
    deliveries: list[Delivery]

    @property
    def ts(self) -> str:
        return self.message.ts

    @property
    def channel(self) -> str:
        return self.message.channel

    @property
    def message_delivery(self) -> Delivery | None:
        """The ``message`` event delivery (absent when the bot is not in the channel)."""
        return next((d for d in self.deliveries if d.event_type == "message"), None)

    @property
    def mention_delivery(self) -> Delivery | None:
        """The ``app_mention`` event delivery, if the text mentioned the bot."""
        return next((d for d in self.deliveries if d.event_type == "app_mention"), None)

    async def wait_acked(self, timeout: float = 5.0) -> None:
        """Wait until every delivery of this post has been acked in time."""
        for delivery in self.deliveries:
            await delivery.wait_acked(timeout)


@dataclass
class InteractionResult:
    """The result of ``FakeSlack.click`` or ``FakeSlack.slash_command``."""

    delivery: Delivery
    response_url: str
    trigger_id: str
    _responses: Callable[[], list[ResponseUrlCall]] = field(repr=False, default=list)

    @property
    def attempt(self) -> DeliveryAttempt:
        return self.delivery.attempts[0]

    @property
    def acked(self) -> bool:
        """The app acked within the ack window (3 s by default), so the user saw no error."""
        return self.attempt.acked_in_time

    @property
    def ack_payload(self) -> JsonDict | None:
        """Socket Mode: the ack's ``payload``; HTTP: the JSON response body (e.g. a command's reply)."""
        return self.attempt.ack_payload

    @property
    def responses(self) -> list[ResponseUrlCall]:
        """POSTs the app made to this interaction's ``response_url`` so far."""
        return self._responses()

    async def wait_settled(self, timeout: float | None = None) -> bool:
        """Wait until acked or the ack window passed; True if acked in time."""
        await self.attempt.wait_settled(timeout)
        return self.acked


def truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    return bool(value)
