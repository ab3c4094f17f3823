"""Payloads the fake Slack sends to apps: event callbacks, interactions, commands, signatures (private)."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
import uuid
from urllib.parse import urlencode

from adapters.slack._fake_model import Channel, DeliveryKind, JsonDict, Message, User
from adapters.slack._fake_workspace import Workspace

VERIFICATION_TOKEN = "fake-verification-token"
"""The deprecated ``token`` field Slack still puts in payloads."""


def sign(signing_secret: str, timestamp: int | str, body: bytes) -> str:
    """``X-Slack-Signature`` for ``body``: ``v0=`` + hex HMAC-SHA256 of ``v0:{timestamp}:{body}``."""
    base = b"v0:" + str(timestamp).encode() + b":" + body
    return "v0=" + hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()


def event_callback(
    ws: Workspace, event: JsonDict, *, event_id: str, event_time: int | None = None
) -> JsonDict:
    """Wrap an inner event into the ``event_callback`` envelope of the Events API."""
    return {
        "token": VERIFICATION_TOKEN,
        "team_id": ws.team_id,
        "context_team_id": ws.team_id,
        "context_enterprise_id": None,
        "api_app_id": ws.app_id,
        "event": event,
        "type": "event_callback",
        "event_id": event_id,
        "event_time": int(time.time()) if event_time is None else event_time,
        "authorizations": [
            {
                "enterprise_id": None,
                "team_id": ws.team_id,
                "user_id": ws.bot_user_id,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": False,
        "event_context": "4-" + secrets.token_hex(16),
    }


def message_event(ws: Workspace, channel: Channel, message: Message) -> JsonDict:
    """The ``message`` event Slack sends for a new message (user or bot)."""
    event = ws.render(message, include_metadata=False)
    for key in ("reply_count", "reply_users_count", "reply_users", "latest_reply", "is_locked", "subscribed"):
        event.pop(key, None)
    event.update({"channel": channel.id, "event_ts": message.ts, "channel_type": channel.channel_type})
    return event


def app_mention_event(ws: Workspace, channel: Channel, message: Message) -> JsonDict:
    """The ``app_mention`` event Slack sends (in addition to ``message``) when a post mentions the bot."""
    event: JsonDict = {
        "type": "app_mention",
        "user": message.user,
        "text": message.text,
        "ts": message.ts,
        "team": message.team,
        "channel": channel.id,
        "event_ts": message.ts,
    }
    if message.client_msg_id is not None:
        event["client_msg_id"] = message.client_msg_id
    if message.blocks is not None:
        event["blocks"] = message.blocks
    if message.thread_ts is not None:
        event["thread_ts"] = message.thread_ts
    return event


def message_changed_event(ws: Workspace, channel: Channel, message: Message) -> JsonDict:
    """A hidden ``message_changed`` event: ``message`` is the new version, ``previous_message`` the old."""
    previous = ws.render(message, include_metadata=False)
    if message.revisions:
        last = message.revisions[-1]
        previous["text"] = last.text
        if last.blocks is None:
            previous.pop("blocks", None)
        else:
            previous["blocks"] = last.blocks
        previous.pop("edited", None)
    event_ts = ws.clock.next()
    return {
        "type": "message",
        "subtype": "message_changed",
        "hidden": True,
        "message": ws.render(message, include_metadata=False),
        "previous_message": previous,
        "channel": channel.id,
        "channel_type": channel.channel_type,
        "ts": event_ts,
        "event_ts": event_ts,
    }


def message_deleted_event(ws: Workspace, channel: Channel, message: Message) -> JsonDict:
    event_ts = ws.clock.next()
    return {
        "type": "message",
        "subtype": "message_deleted",
        "hidden": True,
        "deleted_ts": message.ts,
        "previous_message": ws.render(message, include_metadata=False),
        "channel": channel.id,
        "channel_type": channel.channel_type,
        "ts": event_ts,
        "event_ts": event_ts,
    }


def new_trigger_id() -> str:
    return f"{int(time.time())}.{secrets.randbelow(10**12)}.{secrets.token_hex(16)}"


def block_actions_payload(
    ws: Workspace,
    *,
    channel: Channel,
    message: Message,
    user: User,
    action: JsonDict,
    response_url: str,
    trigger_id: str,
) -> JsonDict:
    """A ``block_actions`` payload for a click on a button of a message."""
    container: JsonDict = {
        "type": "message",
        "message_ts": message.ts,
        "channel_id": channel.id,
        "is_ephemeral": False,
    }
    if message.thread_ts is not None:
        container["thread_ts"] = message.thread_ts
    return {
        "type": "block_actions",
        "user": {"id": user.id, "username": user.name, "name": user.name, "team_id": ws.team_id},
        "api_app_id": ws.app_id,
        "token": VERIFICATION_TOKEN,
        "container": container,
        "trigger_id": trigger_id,
        "team": {"id": ws.team_id, "domain": ws.team_domain},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel.id, "name": channel.name},
        "message": ws.render(message, include_metadata=False),
        "state": {"values": {}},
        "response_url": response_url,
        "actions": [action],
    }


def slash_command_payload(
    ws: Workspace,
    *,
    command: str,
    text: str,
    channel: Channel,
    user: User,
    response_url: str,
    trigger_id: str,
) -> JsonDict:
    """The fields of a slash command (form fields over HTTP, the envelope payload in Socket Mode)."""
    return {
        "token": VERIFICATION_TOKEN,
        "team_id": ws.team_id,
        "team_domain": ws.team_domain,
        "channel_id": channel.id,
        "channel_name": channel.name,
        "user_id": user.id,
        "user_name": user.name,
        "command": command,
        "text": text,
        "api_app_id": ws.app_id,
        "is_enterprise_install": "false",
        "response_url": response_url,
        "trigger_id": trigger_id,
    }


def find_action_element(
    message: Message, action_id: str, block_id: str | None
) -> tuple[str, JsonDict] | None:
    """Locate an interactive element by ``action_id`` in the message blocks: ``(block_id, element)``."""
    for block in message.blocks or []:
        if block_id is not None and block.get("block_id") != block_id:
            continue
        elements: list[JsonDict] = []
        if isinstance(block.get("elements"), list):
            elements.extend(e for e in block["elements"] if isinstance(e, dict))
        accessory = block.get("accessory")
        if isinstance(accessory, dict):
            elements.append(accessory)
        for element in elements:
            if element.get("action_id") == action_id:
                return str(block.get("block_id") or ""), element
    return None


def envelope(kind: DeliveryKind, payload: JsonDict, *, retry_num: int, retry_reason: str | None) -> JsonDict:
    """A Socket Mode envelope (a fresh ``envelope_id`` per attempt)."""
    frame: JsonDict = {
        "envelope_id": str(uuid.uuid4()),
        "payload": payload,
        "type": kind,
        "accepts_response_payload": kind != "events_api" and payload.get("type") != "block_actions",
    }
    if kind == "events_api":
        frame["retry_attempt"] = retry_num
        frame["retry_reason"] = retry_reason or ""
    return frame


def http_body(kind: DeliveryKind, payload: JsonDict) -> tuple[bytes, str]:
    """The HTTP request body Slack POSTs for a delivery, and its content type."""
    if kind == "events_api":
        return json.dumps(payload).encode(), "application/json"
    if kind == "interactive":
        return urlencode({"payload": json.dumps(payload)}).encode(), "application/x-www-form-urlencoded"
    return urlencode({k: str(v) for k, v in payload.items()}).encode(), "application/x-www-form-urlencoded"
