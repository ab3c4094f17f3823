"""Server-sent events over an httpx streaming response.

Implements the parts of the event-stream format that model APIs use: `data:` lines (several in one event are
joined with newlines), `event:` names, `:` comments (keep-alives), and `id:` / `retry:` fields, which are
accepted and ignored. A blank line dispatches the event. An event still pending when the body ends is
dispatched too (some servers omit the final blank line); the provider decides whether the stream was complete.

Anything else is not an event stream: a line with no known field (for example a bare JSON object or an HTML
error page sent with status 200) raises `SSEFormatError` instead of being skipped, so the caller reports a clear
error rather than waiting for an event that never comes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any

_KNOWN_FIELDS = frozenset({"data", "event", "id", "retry"})
_EXCERPT = 200


class SSEFormatError(Exception):
    """The response body is not a well-formed event stream, or an event's data is not the expected JSON."""


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str
    data: str

    def json(self) -> Any:
        """The data parsed as JSON; `SSEFormatError` when it is not JSON."""
        try:
            return json.loads(self.data)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            raise SSEFormatError(f"invalid JSON in stream event: {excerpt(self.data)!r}") from None


def excerpt(text: str, limit: int = _EXCERPT) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "…"


async def iter_sse(lines: AsyncIterable[str]) -> AsyncIterator[SSEEvent]:
    """Parse decoded lines (as from `httpx.Response.aiter_lines()`, without line terminators) into events."""
    event = ""
    data: list[str] = []
    async for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield SSEEvent(event or "message", "\n".join(data))
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, sep, value = line.partition(":")
        if not sep and name not in _KNOWN_FIELDS:
            raise SSEFormatError(f"malformed SSE line: {excerpt(line)!r}")
        if name not in _KNOWN_FIELDS:
            raise SSEFormatError(
                f"malformed SSE line (unknown field {excerpt(name, 40)!r}): {excerpt(line)!r}"
            )
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    if data:
        yield SSEEvent(event or "message", "\n".join(data))
