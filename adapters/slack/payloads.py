"""What a Slack request or envelope must be before the adapter hands it to bolt: signed (checked on the headers
before the body is read, then over the raw bytes), decodable, and of a shape bolt can read. Every decoded
payload is made valid (a lone surrogate becomes U+FFFD)."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any
from urllib.parse import parse_qsl

from adapters.bridge import PayloadTooDeep, valid_payload

SIGNATURE_WINDOW = 300  # seconds: Slack's replay window for request timestamps
_SIGNATURE_LENGTH = len("v0=") + 64


def signature_headers_acceptable(timestamp: str | None, signature: str | None, now: float) -> bool:
    """Both signature headers present, well formed, and the timestamp inside the replay window: checked
    before the body is read, so an unsigned request costs nothing."""
    if not timestamp or not signature:
        return False
    if not signature.startswith("v0=") or len(signature) != _SIGNATURE_LENGTH:
        return False
    try:
        stamp = int(timestamp)
    except ValueError:
        return False
    return abs(now - stamp) <= SIGNATURE_WINDOW


def signature_valid(
    secret: str, body: bytes, timestamp: str | None, signature: str | None, now: float
) -> bool:
    """Slack's v0 request signature over the raw bytes (HMAC-SHA256 of `v0:{timestamp}:{body}`), with the
    5-minute replay window and a constant-time compare. Works on bytes, so a body that is not UTF-8 is simply
    checked, not a crash."""
    if not signature_headers_acceptable(timestamp, signature, now):
        return False
    assert timestamp is not None and signature is not None
    base = b"v0:" + timestamp.encode() + b":" + body
    expected = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature)


def malformed(body: Any) -> str | None:
    """Why a decoded payload cannot be handled at all, or None. Bolt's own middleware raises on some shapes
    (an `event` that is not an object), which would answer 500 and make Slack retry the same garbage."""
    if not isinstance(body, dict):
        return f"payload is {type(body).__name__}, not an object"
    if body.get("type") == "event_callback" or "event" in body:
        event = body.get("event")
        if not isinstance(event, dict):
            return "event_callback without an event object"
        if not isinstance(event.get("type"), str):
            return "event without a type"
    if body.get("type") == "block_actions":
        actions = body.get("actions")
        if not isinstance(actions, list) or not actions or not all(isinstance(a, dict) for a in actions):
            return "block_actions without a list of action objects"
    return None


def decode_body(raw: bytes, content_type: str | None) -> Any:
    """A signed request's payload, as bolt reads it (JSON, or a form whose `payload` field is JSON), made
    valid: lone surrogates become U+FFFD. Raises ValueError with the reason when it cannot be decoded."""
    text = raw.decode("utf-8")  # UnicodeDecodeError is a ValueError
    try:
        if content_type == "application/json" or text.startswith("{"):
            body: Any = json.loads(text)
        else:
            fields = dict(parse_qsl(text, keep_blank_values=True))
            body = json.loads(fields["payload"]) if "payload" in fields else fields
        return valid_payload(body)
    except RecursionError:
        raise PayloadTooDeep("payload nested too deeply") from None
