"""``response_url`` endpoints handed out with clicks and commands (private module)."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs

from aiohttp import web

from adapters.slack._fake_model import Ephemeral, JsonDict, ResponseUrlCall, truthy
from adapters.slack._fake_workspace import Workspace

MAX_USES = 5
"""Slack accepts up to 5 responses per ``response_url`` (within 30 minutes)."""


@dataclass
class _Target:
    channel: str
    message_ts: str | None
    user: str
    uses: int = 0


class ResponseUrls:
    """Issues ``response_url``s and applies what apps POST to them to the workspace."""

    def __init__(self, workspace: Workspace, notify: Callable[[], None]) -> None:
        self._ws = workspace
        self._notify = notify
        self._targets: dict[str, _Target] = {}
        self.calls: list[ResponseUrlCall] = []
        self.base_url = ""

    def issue(self, channel: str, message_ts: str | None, user: str) -> tuple[str, str]:
        """A new ``(url_id, url)`` for an interaction on ``message_ts`` (or none, for commands)."""
        url_id = secrets.token_hex(12)
        self._targets[url_id] = _Target(channel, message_ts, user)
        return url_id, f"{self.base_url}/response/{url_id}"

    def calls_for(self, url_id: str) -> list[ResponseUrlCall]:
        return [c for c in self.calls if c.url_id == url_id]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        url_id = request.match_info["url_id"]
        body = _parse_body(await request.read())
        target = self._targets.get(url_id)
        if target is None or target.uses >= MAX_USES:
            return self._done(url_id, body, 404, "rejected", "used_url" if target else "invalid_url")
        target.uses += 1
        return self._done(url_id, body, 200, self._apply(target, body), None)

    def _apply(self, target: _Target, body: JsonDict) -> str:
        ws = self._ws
        channel = ws.channels[target.channel]
        text = str(body.get("text") or "")
        raw_blocks = body.get("blocks")
        blocks = raw_blocks if isinstance(raw_blocks, list) else None
        message = ws.find(channel.id, target.message_ts) if target.message_ts else None
        if message is not None and truthy(body.get("delete_original")):
            message.deleted = True
            return "deleted"
        if message is not None and truthy(body.get("replace_original")):
            ws.edit(
                message,
                text=text,
                blocks=blocks or [],
                metadata=None,
                by=None,
                via="response_url",
                mark_edited=False,
            )
            return "replaced"
        thread_ts = str(body["thread_ts"]) if body.get("thread_ts") else None
        if body.get("response_type") == "in_channel":
            ws.store(channel, text=text, user=None, bot=True, thread_ts=thread_ts, blocks=blocks)
            return "posted"
        ws.ephemerals.append(
            Ephemeral(
                channel=channel.id,
                user=target.user,
                text=text,
                blocks=blocks,
                thread_ts=thread_ts,
                ts=ws.clock.next(),
                via="response_url",
            )
        )
        return "ephemeral"

    def _done(
        self, url_id: str, body: JsonDict, status: int, applied: str, error: str | None
    ) -> web.Response:
        self.calls.append(
            ResponseUrlCall(
                url_id=url_id, body=body, received_at=time.monotonic(), status=status, applied=applied
            )
        )
        self._notify()
        if error is not None:
            return web.Response(status=status, text=error)
        return web.json_response({"ok": True})


def _parse_body(raw: bytes) -> JsonDict:
    """JSON (what bolt's ``respond`` sends) or a form with a ``payload`` JSON field."""
    text = raw.decode(errors="replace")
    try:
        body = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        payload = parse_qs(text).get("payload")
        try:
            body = json.loads(payload[0]) if payload else {}
        except json.JSONDecodeError:
            body = {}
    return body if isinstance(body, dict) else {}
