"""Web API methods of the fake Slack (private module).

Each method validates its arguments like Slack does (error codes as Slack names them), changes the
:class:`Workspace` and returns the Slack-shaped JSON body.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from aiohttp import web

from adapters.slack._fake_model import Channel, Ephemeral, JsonDict, Message, truthy
from adapters.slack._fake_workspace import SlackError, Workspace, decode_cursor, ts_key

TokenKind = Literal["bot", "app"]
BotChange = Literal["posted", "changed", "deleted"]

MAX_TEXT = 40_000
MAX_BLOCKS = 50
MAX_STREAM_TEXT = 12_000
STREAM_CHUNK_TYPES = frozenset({"markdown_text", "task_update", "plan_update", "blocks"})

ARG_JSON_FIELDS = frozenset({"blocks", "metadata", "chunks", "attachments"})


async def parse_api_request(request: web.Request) -> tuple[JsonDict, str | None, str]:
    """Merge query string and body (JSON, urlencoded or multipart) into one argument dict.

    Returns ``(args, token, content_type)``; the token comes from ``Authorization: Bearer`` or a ``token``
    argument. Raises ``ValueError`` for a body that is not a JSON object.
    """
    args: dict[str, Any] = dict(request.query)
    content_type = "query"
    if request.can_read_body:
        if request.content_type == "application/json":
            raw = await request.read()
            if raw.strip():
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError as exc:
                    raise ValueError("invalid JSON body") from exc
                if not isinstance(body, dict):
                    raise ValueError("JSON body is not an object")
                args.update(body)
            content_type = "json"
        else:
            form = await request.post()
            args.update((key, value) for key, value in form.items() if isinstance(value, str))
            content_type = "form"
    token: str | None = None
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        token = auth[7:].strip() or None
    body_token = args.pop("token", None)
    if token is None and isinstance(body_token, str) and body_token:
        token = body_token
    return parse_arg_values(args), token, content_type


def parse_arg_values(args: dict[str, Any]) -> JsonDict:
    """Form values arrive as strings: decode the JSON-valued fields (blocks, metadata, chunks)."""
    parsed: JsonDict = {}
    for key, value in args.items():
        if key in ARG_JSON_FIELDS and isinstance(value, str) and value.strip()[:1] in ("[", "{"):
            try:
                parsed[key] = json.loads(value)
            except json.JSONDecodeError:
                parsed[key] = value
        else:
            parsed[key] = value
    return parsed


class WebApi:
    """Dispatches ``method -> handler`` over a :class:`Workspace`."""

    def __init__(
        self,
        workspace: Workspace,
        *,
        team_name: str,
        socket_url: Callable[[], str],
        on_bot_change: Callable[[BotChange, Message], None],
        stream_idle_timeout: Callable[[], float | None],
    ) -> None:
        self.ws = workspace
        self.team_name = team_name
        self._socket_url = socket_url
        self._on_bot_change = on_bot_change
        self._stream_idle_timeout = stream_idle_timeout
        self._methods: dict[str, tuple[TokenKind, Callable[[JsonDict], Awaitable[tuple[JsonDict, bool]]]]] = {
            "api.test": ("bot", self._api_test),
            "auth.test": ("bot", self._auth_test),
            "apps.connections.open": ("app", self._apps_connections_open),
            "chat.postMessage": ("bot", self._chat_post_message),
            "chat.update": ("bot", self._chat_update),
            "chat.delete": ("bot", self._chat_delete),
            "chat.postEphemeral": ("bot", self._chat_post_ephemeral),
            "chat.getPermalink": ("bot", self._chat_get_permalink),
            "chat.startStream": ("bot", self._chat_start_stream),
            "chat.appendStream": ("bot", self._chat_append_stream),
            "chat.stopStream": ("bot", self._chat_stop_stream),
            "conversations.history": ("bot", self._conversations_history),
            "conversations.replies": ("bot", self._conversations_replies),
            "conversations.info": ("bot", self._conversations_info),
            "users.info": ("bot", self._users_info),
            "users.conversations": ("bot", self._users_conversations),
            "usergroups.users.list": ("bot", self._usergroups_users_list),
            "reactions.add": ("bot", self._reactions_add),
            "assistant.threads.setStatus": ("bot", self._assistant_set_status),
        }

    @property
    def methods(self) -> list[str]:
        return sorted(self._methods)

    def token_kind(self, method: str) -> TokenKind | None:
        entry = self._methods.get(method)
        return None if entry is None else entry[0]

    async def call(self, method: str, args: JsonDict) -> tuple[JsonDict, bool]:
        """Run ``method``; returns ``(body, effect_applied)``; raises :class:`SlackError`."""
        entry = self._methods.get(method)
        if entry is None:
            raise SlackError("unknown_method")
        return await entry[1](args)

    # ------------------------------------------------------------------ identity

    async def _api_test(self, args: JsonDict) -> tuple[JsonDict, bool]:
        return {"ok": True, "args": {k: v for k, v in args.items() if isinstance(v, str)}}, False

    async def _auth_test(self, args: JsonDict) -> tuple[JsonDict, bool]:
        ws = self.ws
        return {
            "ok": True,
            "url": f"https://{ws.team_domain}.slack.com/",
            "team": self.team_name,
            "user": ws.bot_name,
            "team_id": ws.team_id,
            "user_id": ws.bot_user_id,
            "bot_id": ws.bot_id,
            "is_enterprise_install": False,
        }, False

    async def _apps_connections_open(self, args: JsonDict) -> tuple[JsonDict, bool]:
        return {"ok": True, "url": self._socket_url()}, False

    # ------------------------------------------------------------------ chat

    async def _chat_post_message(self, args: JsonDict) -> tuple[JsonDict, bool]:
        target = args.get("channel")
        if isinstance(target, str) and target in self.ws.users and target not in self.ws.channels:
            target = self.ws.open_dm(target).id  # posting to a user id lands in the DM with the bot
        channel = self.ws.api_channel(target, need_member=True)
        self._check_writable(channel)
        text, blocks = self._message_content(args, required=True)
        metadata = _metadata(args)
        thread_ts = _opt_str(args, "thread_ts")
        broadcast = thread_ts is not None and truthy(args.get("reply_broadcast"))
        message = self.ws.store(
            channel,
            text=text or "",
            user=None,
            bot=True,
            thread_ts=thread_ts,
            blocks=blocks,
            metadata=metadata,
            subtype="thread_broadcast" if broadcast else None,
        )
        self._on_bot_change("posted", message)
        return {
            "ok": True,
            "channel": channel.id,
            "ts": message.ts,
            "message": self.ws.render(message, include_metadata=True),
        }, True

    async def _chat_update(self, args: JsonDict) -> tuple[JsonDict, bool]:
        channel = self.ws.api_channel(args.get("channel"))
        message = self._own_message(channel, args, "cant_update_message")
        text, blocks = self._message_content(args, required=True)
        self.ws.edit(
            message,
            text=text,
            blocks=blocks,
            metadata=_metadata(args),
            by=self.ws.bot_user_id,
            via="chat.update",
        )
        self._on_bot_change("changed", message)
        return {
            "ok": True,
            "channel": channel.id,
            "ts": message.ts,
            "text": message.text,
            "message": self.ws.render(message, include_metadata=True),
        }, True

    async def _chat_delete(self, args: JsonDict) -> tuple[JsonDict, bool]:
        channel = self.ws.api_channel(args.get("channel"))
        message = self._own_message(channel, args, "cant_delete_message")
        message.deleted = True
        message.streaming = False
        self._on_bot_change("deleted", message)
        return {"ok": True, "channel": channel.id, "ts": message.ts}, True

    async def _chat_post_ephemeral(self, args: JsonDict) -> tuple[JsonDict, bool]:
        channel = self.ws.api_channel(args.get("channel"), need_member=True)
        user = _opt_str(args, "user")
        if user is None:
            raise SlackError("invalid_arguments", "missing required field: user")
        if user not in self.ws.users:
            raise SlackError("user_not_found")
        if channel.kind != "public" and user not in channel.members:
            raise SlackError("user_not_in_channel")
        text, blocks = self._message_content(args, required=True)
        ts = self.ws.clock.next()
        self.ws.ephemerals.append(
            Ephemeral(
                channel=channel.id,
                user=user,
                text=text or "",
                blocks=blocks,
                thread_ts=_opt_str(args, "thread_ts"),
                ts=ts,
                via="chat.postEphemeral",
            )
        )
        return {"ok": True, "message_ts": ts}, True

    async def _chat_get_permalink(self, args: JsonDict) -> tuple[JsonDict, bool]:
        channel = self.ws.api_channel(args.get("channel"))
        ts = _opt_str(args, "message_ts") or ""
        if self.ws.find(channel.id, ts) is None:
            raise SlackError("message_not_found")
        link = f"https://{self.ws.team_domain}.slack.com/archives/{channel.id}/p{ts.replace('.', '')}"
        return {"ok": True, "channel": channel.id, "permalink": link}, False

    # ------------------------------------------------------------------ streaming

    async def _chat_start_stream(self, args: JsonDict) -> tuple[JsonDict, bool]:
        channel = self.ws.api_channel(args.get("channel"), need_member=True)
        self._check_writable(channel)
        thread_ts = _opt_str(args, "thread_ts")
        if thread_ts is None:
            raise SlackError(
                "invalid_arguments", "missing required field: thread_ts (streams are thread replies)"
            )
        if channel.kind != "im":
            missing = [k for k in ("recipient_team_id", "recipient_user_id") if not _opt_str(args, k)]
            if missing:
                raise SlackError(
                    "invalid_arguments",
                    *(f"missing required field: {k} (required when streaming to channels)" for k in missing),
                )
        chunks = self._stream_chunks(args)
        message = self.ws.store(channel, text="", user=None, bot=True, thread_ts=thread_ts, streaming=True)
        _apply_chunks(message, chunks)
        self._on_bot_change("posted", message)
        return {"ok": True, "channel": channel.id, "ts": message.ts}, True

    async def _chat_append_stream(self, args: JsonDict) -> tuple[JsonDict, bool]:
        channel = self.ws.api_channel(args.get("channel"))
        message = self._streaming_message(channel, args)
        chunks = self._stream_chunks(args)
        if not chunks:
            raise SlackError("invalid_arguments", "missing required field: markdown_text")
        _apply_chunks(message, chunks)
        return {"ok": True, "channel": channel.id, "ts": message.ts}, True

    async def _chat_stop_stream(self, args: JsonDict) -> tuple[JsonDict, bool]:
        channel = self.ws.api_channel(args.get("channel"))
        message = self._streaming_message(channel, args)
        chunks = self._stream_chunks(args)
        blocks = _blocks(args)
        metadata = _metadata(args)
        _apply_chunks(message, chunks)
        if blocks is not None:
            message.blocks = blocks or None
        if metadata is not None:
            message.metadata = metadata
        message.streaming = False
        self._on_bot_change("changed", message)
        return {
            "ok": True,
            "channel": channel.id,
            "ts": message.ts,
            "message": self.ws.render(message, include_metadata=True),
        }, True

    # ------------------------------------------------------------------ reading

    async def _conversations_history(self, args: JsonDict) -> tuple[JsonDict, bool]:
        channel = self.ws.api_channel(args.get("channel"))
        page = self.ws.history_page(
            channel.id,
            oldest=_ts_arg(args, "oldest"),
            latest=_ts_arg(args, "latest"),
            inclusive=truthy(args.get("inclusive")),
            limit=_limit(args, default=100, maximum=999),
            cursor=_cursor(args),
        )
        include_metadata = truthy(args.get("include_all_metadata"))
        return {
            "ok": True,
            "messages": [self.ws.render(m, include_metadata=include_metadata) for m in page.messages],
            "has_more": page.has_more,
            "pin_count": 0,
            "channel_actions_ts": None,
            "channel_actions_count": 0,
            "response_metadata": {"next_cursor": page.next_cursor},
        }, False

    async def _conversations_replies(self, args: JsonDict) -> tuple[JsonDict, bool]:
        channel = self.ws.api_channel(args.get("channel"))
        ts = _opt_str(args, "ts")
        if ts is None:
            raise SlackError("invalid_arguments", "missing required field: ts")
        parent = self.ws.find(channel.id, ts)
        if parent is None:
            raise SlackError("thread_not_found")
        if parent.is_reply and parent.thread_ts is not None:
            root = self.ws.find(channel.id, parent.thread_ts)
            parent = root if root is not None else parent
        page = self.ws.replies_page(
            parent,
            oldest=_ts_arg(args, "oldest"),
            latest=_ts_arg(args, "latest"),
            inclusive=truthy(args.get("inclusive")),
            limit=_limit(args, default=1000, maximum=1000),
            cursor=_cursor(args),
        )
        include_metadata = truthy(args.get("include_all_metadata"))
        return {
            "ok": True,
            "messages": [self.ws.render(m, include_metadata=include_metadata) for m in page.messages],
            "has_more": page.has_more,
            "response_metadata": {"next_cursor": page.next_cursor},
        }, False

    async def _conversations_info(self, args: JsonDict) -> tuple[JsonDict, bool]:
        channel = self.ws.api_channel(args.get("channel"))
        data = channel.to_api(
            self.ws.bot_user_id, include_num_members=truthy(args.get("include_num_members"))
        )
        return {"ok": True, "channel": data}, False

    async def _users_conversations(self, args: JsonDict) -> tuple[JsonDict, bool]:
        """The conversations the bot is a member of, of the requested `types`, in id order, paged."""
        kinds = {"public_channel": "public", "private_channel": "private", "im": "im", "mpim": "mpim"}
        requested = str(args.get("types") or "public_channel").split(",")
        if any(t.strip() not in kinds for t in requested):
            raise SlackError("invalid_types")
        wanted = {kinds[t.strip()] for t in requested}
        exclude_archived = truthy(args.get("exclude_archived"))
        found = [
            c
            for c in sorted(self.ws.channels.values(), key=lambda c: c.id)
            if c.kind in wanted and self.ws.bot_user_id in c.members and not (exclude_archived and c.archived)
        ]
        raw_cursor = str(args.get("cursor") or "")
        start = int(raw_cursor[len("offset:") :]) if raw_cursor.startswith("offset:") else 0
        limit = _limit(args, default=100, maximum=1000)
        page = found[start : start + limit]
        more = start + limit < len(found)
        return {
            "ok": True,
            "channels": [c.to_api(self.ws.bot_user_id) for c in page],
            "response_metadata": {"next_cursor": f"offset:{start + limit}" if more else ""},
        }, False

    async def _users_info(self, args: JsonDict) -> tuple[JsonDict, bool]:
        user = self.ws.users.get(str(args.get("user") or ""))
        if user is None:
            raise SlackError("user_not_found")
        return {"ok": True, "user": user.to_api()}, False

    async def _usergroups_users_list(self, args: JsonDict) -> tuple[JsonDict, bool]:
        group = self.ws.usergroups.get(str(args.get("usergroup") or ""))
        if group is None or (group.disabled and not truthy(args.get("include_disabled"))):
            raise SlackError("no_such_subteam")
        return {"ok": True, "users": list(group.users)}, False

    # ------------------------------------------------------------------ misc

    async def _reactions_add(self, args: JsonDict) -> tuple[JsonDict, bool]:
        channel = self.ws.api_channel(args.get("channel"))
        message = self.ws.find(channel.id, str(args.get("timestamp") or ""))
        if message is None:
            raise SlackError("message_not_found")
        name = _opt_str(args, "name")
        if name is None:
            raise SlackError("invalid_name")
        users = message.reactions.setdefault(name, [])
        if self.ws.bot_user_id in users:
            raise SlackError("already_reacted")
        users.append(self.ws.bot_user_id)
        return {"ok": True}, True

    async def _assistant_set_status(self, args: JsonDict) -> tuple[JsonDict, bool]:
        channel = self.ws.api_channel(args.get("channel_id"))
        thread_ts = _opt_str(args, "thread_ts")
        if thread_ts is None or self.ws.find(channel.id, thread_ts) is None:
            raise SlackError("invalid_thread_ts")
        status = {"channel": channel.id, "thread_ts": thread_ts, "status": str(args.get("status") or "")}
        self.ws.statuses.append(status)
        return {"ok": True}, True

    # ------------------------------------------------------------------ helpers

    def _check_writable(self, channel: Channel) -> None:
        if channel.archived:
            raise SlackError("is_archived")

    def _own_message(self, channel: Channel, args: JsonDict, not_own_error: str) -> Message:
        ts = _opt_str(args, "ts")
        if ts is None:
            raise SlackError("message_not_found")
        message = self.ws.find(channel.id, ts)
        if message is None:
            raise SlackError("message_not_found")
        if message.bot_id != self.ws.bot_id:
            raise SlackError(not_own_error)
        return message

    def _streaming_message(self, channel: Channel, args: JsonDict) -> Message:
        message = self._own_message(channel, args, "message_not_found")
        idle = self._stream_idle_timeout()
        if message.streaming and idle is not None and time.monotonic() - message.stream_last_activity > idle:
            message.streaming = False
        if not message.streaming:
            raise SlackError("message_not_in_streaming_state")
        return message

    def _message_content(self, args: JsonDict, *, required: bool) -> tuple[str | None, list[JsonDict] | None]:
        text = _opt_str(args, "text", allow_empty=True)
        markdown = _opt_str(args, "markdown_text", allow_empty=True)
        if markdown is not None:
            if text or args.get("blocks"):
                raise SlackError("markdown_text_conflict")
            text = markdown
        blocks = _blocks(args)
        if required and not text and not blocks and not args.get("attachments"):
            raise SlackError("no_text")
        if text is not None and len(text) > MAX_TEXT:
            raise SlackError("msg_too_long")
        return text, blocks

    def _stream_chunks(self, args: JsonDict) -> list[JsonDict]:
        chunks: list[JsonDict] = []
        markdown = _opt_str(args, "markdown_text", allow_empty=True)
        if markdown:
            chunks.append({"type": "markdown_text", "text": markdown})
        raw = args.get("chunks")
        if raw is not None:
            if not isinstance(raw, list):
                raise SlackError("invalid_chunks")
            for chunk in raw:
                if not isinstance(chunk, dict) or chunk.get("type") not in STREAM_CHUNK_TYPES:
                    raise SlackError("invalid_chunks")
                chunks.append(chunk)
        for chunk in chunks:
            if chunk["type"] == "markdown_text":
                if not isinstance(chunk.get("text"), str):
                    raise SlackError("invalid_chunks")
                if len(chunk["text"]) > MAX_STREAM_TEXT:
                    raise SlackError("msg_too_long")
        return chunks


def _apply_chunks(message: Message, chunks: list[JsonDict]) -> None:
    for chunk in chunks:
        message.stream_chunks.append(chunk)
        if chunk["type"] == "markdown_text":
            message.text += chunk["text"]
    message.stream_last_activity = time.monotonic()


def _opt_str(args: JsonDict, name: str, *, allow_empty: bool = False) -> str | None:
    value = args.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        value = str(value)
    if not value and not allow_empty:
        return None
    return value


def _blocks(args: JsonDict) -> list[JsonDict] | None:
    raw = args.get("blocks")
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) > MAX_BLOCKS:
        raise SlackError("invalid_blocks")
    for block in raw:
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise SlackError("invalid_blocks")
    return raw


def _metadata(args: JsonDict) -> JsonDict | None:
    raw = args.get("metadata")
    if raw is None:
        return None
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("event_type"), str)
        or not isinstance(raw.get("event_payload"), dict)
    ):
        raise SlackError("invalid_metadata_format")
    return {"event_type": raw["event_type"], "event_payload": raw["event_payload"]}


def _ts_arg(args: JsonDict, name: str) -> int | None:
    raw = args.get(name)
    if raw is None or raw == "":
        return None
    try:
        return ts_key(str(raw))
    except ValueError:
        raise SlackError(f"invalid_ts_{name}") from None


def _limit(args: JsonDict, *, default: int, maximum: int) -> int:
    raw = args.get("limit")
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise SlackError("invalid_limit") from None
    if value <= 0:
        return default
    return min(value, maximum)


def _cursor(args: JsonDict) -> int | None:
    raw = args.get("cursor")
    if raw is None or raw == "":
        return None
    return decode_cursor(str(raw))
