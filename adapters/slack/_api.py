"""Calling the Slack Web API: one place that turns slack-sdk and aiohttp failures into the bridge's errors.

- `ratelimited` (HTTP 429 with Retry-After, or the HTTP-200 `ok: false` variant) -> `RetryLater`, after telling
  the platform's rate governor to back off;
- HTTP 5xx, connection failures and Slack's transient errors -> `TransportError` (the bridge retries; a post
  whose response was lost is reconciled by its metadata key before anything is posted again);
- errors that no retry can fix (no access to the channel, revoked token, invalid arguments) -> `SlackCallError`
  with `permanent=True`, which is deliberately not a `TransportError`: the bridge stops retrying that reply
  until something new happens in its conversation instead of hammering Slack every second.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError

from adapters.bridge import RateGovernor, RetryLater, TransportError

log = logging.getLogger("adapters.slack")

PERMANENT_ERRORS = frozenset(
    {
        "account_inactive",
        "channel_not_found",
        "invalid_arguments",
        "invalid_auth",
        "invalid_blocks",
        "invalid_metadata_format",
        "invalid_metadata_schema",
        "is_archived",
        "markdown_text_conflict",
        "missing_scope",
        "msg_too_long",
        "no_permission",
        "no_text",
        "not_allowed_token_type",
        "not_authed",
        "not_in_channel",
        "restricted_action",
        "token_revoked",
        "too_many_attachments",
    }
)


class SlackCallError(TransportError):
    """Slack answered `ok: false` with `error` (a `TransportError`, so the bridge retries it)."""

    def __init__(self, method: str, error: str) -> None:
        super().__init__(f"{method}: {error}")
        self.method = method
        self.error = error


class SlackPermanentError(Exception):
    """Slack refused a call in a way no retry fixes. Not a `TransportError` on purpose (see module doc)."""

    def __init__(self, method: str, error: str) -> None:
        super().__init__(f"{method}: {error}")
        self.method = method
        self.error = error


def _retry_after(exc: SlackApiError) -> float:
    headers = getattr(exc.response, "headers", None) or {}
    raw: Any = None
    for name in ("Retry-After", "retry-after"):
        if name in headers:
            raw = headers[name]
            break
    if isinstance(raw, list):
        raw = raw[0] if raw else None
    try:
        return max(0.0, float(raw)) if raw is not None else 1.0
    except (TypeError, ValueError):
        return 1.0


def error_code(exc: SlackApiError) -> str:
    data = getattr(exc.response, "data", None)
    if isinstance(data, dict):
        return str(data.get("error") or "unknown_error")
    return "unknown_error"


async def call(method: str, request: Awaitable[Any], governor: RateGovernor | None = None) -> dict[str, Any]:
    """Await one slack-sdk call and return the response body, or raise a bridge-shaped error."""
    try:
        response = await request
    except SlackApiError as exc:
        status = getattr(exc.response, "status_code", 200)
        code = error_code(exc)
        if status == 429 or code == "ratelimited":
            seconds = _retry_after(exc)
            if governor is not None:
                governor.back_off(seconds)  # Slack's limits are per method and workspace: slow everything
            raise RetryLater(seconds, f"{method} ratelimited") from None
        if isinstance(status, int) and status >= 500:
            raise TransportError(f"{method}: HTTP {status}") from None
        if code in PERMANENT_ERRORS:
            raise SlackPermanentError(method, code) from None
        raise SlackCallError(method, code) from None
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise TransportError(f"{method}: {type(exc).__name__}: {exc}") from exc
    data = getattr(response, "data", None)
    return data if isinstance(data, dict) else {}
