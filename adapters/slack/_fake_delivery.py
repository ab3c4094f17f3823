"""How the fake Slack hands things to the app: Socket Mode hub, signed HTTP POSTs, ack window, retries.

Private module; the public surface is ``FakeSlack`` in :mod:`adapters.slack.testing`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from adapters.slack._fake_model import (
    AttemptOutcome,
    Delivery,
    DeliveryAttempt,
    DeliveryKind,
    HttpResult,
    JsonDict,
    SocketConnection,
    Transport,
)
from adapters.slack._fake_payloads import envelope, http_body, sign

SLACK_USER_AGENT = "Slackbot 1.0 (+https://api.slack.com/robots)"
MAX_RETRIES = 3
MAX_SOCKET_CONNECTIONS = 10  # Slack: an app holds at most ten Socket Mode connections at a time


class DeliverySettings(Protocol):
    """The knobs of ``FakeSlack`` the engine reads live (tests may change them at any time)."""

    mode: Transport
    ack_timeout: float
    auto_retry: bool
    retry_delays: tuple[float, ...]
    request_url: str | None
    interactivity_url: str | None
    signing_secret: str
    app_id: str
    max_connections: int


class Deliverer:
    """Sends deliveries over Socket Mode or HTTP, tracks acks against the ack window, retries like Slack."""

    def __init__(
        self,
        settings: DeliverySettings,
        *,
        rng: random.Random,
        notify: Callable[[], None],
        spawn: Callable[[Awaitable[Any]], asyncio.Task[Any]],
        next_id: Callable[[], int],
    ) -> None:
        self._settings = settings
        self._rng = rng
        self._notify = notify
        self._spawn = spawn
        self._next_id = next_id
        self.deliveries: list[Delivery] = []
        self.connections: list[SocketConnection] = []
        self._tickets: set[str] = set()
        self._sockets: dict[int, tuple[web.WebSocketResponse, web.Request]] = {}
        self._by_envelope: dict[str, DeliveryAttempt] = {}
        self._session: aiohttp.ClientSession | None = None
        self.base_url = ""

    # ------------------------------------------------------------------ lifecycle

    def start(self, base_url: str) -> None:
        self.base_url = base_url
        self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        for ws, _request in list(self._sockets.values()):
            with contextlib.suppress(Exception):
                await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"server shutdown")
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------ deliveries

    def new_delivery(self, kind: DeliveryKind, payload: JsonDict) -> Delivery:
        delivery = Delivery(id=self._next_id(), kind=kind, payload=payload)
        self.deliveries.append(delivery)
        return delivery

    async def send(
        self,
        delivery: Delivery,
        retry_num: int,
        retry_reason: str | None,
        connection: SocketConnection | None = None,
    ) -> DeliveryAttempt:
        """Start one attempt (returns once sent; the ack is tracked in the background)."""
        settings = self._settings
        if settings.mode == "http" and self._http_url(delivery) is None:
            raise RuntimeError("HTTP mode: set fake.request_url (the app's Request URL) before delivering")
        now = time.monotonic()
        attempt = DeliveryAttempt(
            retry_num=retry_num,
            retry_reason=retry_reason,
            transport=settings.mode,
            sent_at=now,
            deadline=now + settings.ack_timeout,
        )
        delivery.attempts.append(attempt)
        if settings.mode == "socket":
            await self._socket_send(delivery, attempt, connection)
        else:
            self._spawn(self._http_send(delivery, attempt))
        self._spawn(self._watch(delivery, attempt))
        self._notify()
        return attempt

    def retry_reason(self, outcome: AttemptOutcome) -> str:
        """The ``retry_reason`` Slack gives a retry after an attempt ended with ``outcome``."""
        if outcome == "timed_out":
            return "timeout" if self._settings.mode == "socket" else "http_timeout"
        if outcome == "rejected":
            return "http_error"
        if outcome in ("no_connection", "connection_failed"):
            return "connection_failed"
        return "unknown_error"

    async def _watch(self, delivery: Delivery, attempt: DeliveryAttempt) -> None:
        """Judge the attempt at its deadline; with auto-retry, schedule Slack's next retry."""
        try:
            await asyncio.wait_for(attempt._settled.wait(), max(attempt.deadline - time.monotonic(), 0.0))
        except TimeoutError:
            attempt._settle("timed_out")
            self._notify()
        settings = self._settings
        if attempt.outcome == "acked" or not settings.auto_retry or delivery.kind != "events_api":
            return
        if attempt.retry_num >= MAX_RETRIES or delivery.acked or attempt is not delivery.last_attempt:
            return
        if attempt.outcome == "rejected" and attempt.http_headers.get("x-slack-no-retry") == "1":
            return
        delays = settings.retry_delays or (0.0,)
        await asyncio.sleep(delays[min(attempt.retry_num, len(delays) - 1)])
        if delivery.acked or attempt is not delivery.last_attempt:
            return
        await self.send(delivery, attempt.retry_num + 1, self.retry_reason(attempt.outcome))

    # ------------------------------------------------------------------ Socket Mode

    @property
    def open_connections(self) -> list[SocketConnection]:
        return [c for c in self.connections if c.open]

    @property
    def refused_connections(self) -> list[SocketConnection]:
        return [c for c in self.connections if c.refused]

    @property
    def debug_host(self) -> str:
        return "fake-slack-" + self.base_url.rpartition(":")[2]

    def issue_socket_url(self) -> str:
        """A fresh ``apps.connections.open`` URL (``ws://.../link/?ticket=...``)."""
        ticket = secrets.token_hex(16)
        self._tickets.add(ticket)
        ws_base = self.base_url.replace("http://", "ws://", 1)
        return f"{ws_base}/link/?ticket={ticket}&app_id={self._settings.app_id}"

    async def handle_socket(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            return web.json_response({"ok": False, "error": "invalid_ticket"}, status=401)
        ws = web.WebSocketResponse(autoping=False)  # pings are answered below, unless the link went deaf
        await ws.prepare(request)
        if len(self.open_connections) >= self._settings.max_connections:
            return await self._refuse(ws)
        hello = {
            "type": "hello",
            "num_connections": len(self.open_connections) + 1,
            "debug_info": {"host": self.debug_host, "build_number": 1, "approximate_connection_time": 18060},
            "connection_info": {"app_id": self._settings.app_id},
        }
        conn = SocketConnection(id=self._next_id(), ticket=ticket, opened_at=time.monotonic())
        try:
            await ws.send_str(json.dumps(hello))
            self.connections.append(conn)
            self._sockets[conn.id] = (ws, request)
            self._notify()
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.PING:
                    if conn.deaf:
                        conn.pings_unanswered += 1
                        self._notify()
                    else:
                        await ws.pong(msg.data)
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    if not conn.deaf:
                        self._on_frame(conn, str(msg.data))
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    break
        except ConnectionError:
            pass
        finally:
            conn.closed_at = time.monotonic()
            if conn.close_reason is None:
                conn.close_reason = "closed"
            self._sockets.pop(conn.id, None)
            self._notify()
        return ws

    async def _refuse(self, ws: web.WebSocketResponse) -> web.WebSocketResponse:
        """Slack's answer to one connection too many: the WebSocket opens, but instead of ``hello`` the only
        frame is a ``disconnect`` with reason ``too_many_websockets``, and the socket closes. (Seen in
        slack-sdk/bolt-js reports; ``apps.connections.open`` itself still succeeds.)"""
        now = time.monotonic()
        conn = SocketConnection(
            id=self._next_id(),
            ticket="",
            opened_at=now,
            closed_at=now,
            close_reason="too_many_websockets",
            refused=True,
        )
        self.connections.append(conn)
        frame = {
            "type": "disconnect",
            "reason": "too_many_websockets",
            "debug_info": {"host": self.debug_host},
        }
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.send_str(json.dumps(frame))
            await ws.close(code=aiohttp.WSCloseCode.POLICY_VIOLATION, message=b"too_many_websockets")
        self._notify()
        return ws

    def _on_frame(self, conn: SocketConnection, data: str) -> None:
        try:
            frame = json.loads(data)
        except json.JSONDecodeError:
            frame = None
        if not isinstance(frame, dict):
            frame = {"_unparsed": data}
        conn.frames_received.append(frame)
        attempt = self._by_envelope.get(str(frame.get("envelope_id")))
        if attempt is not None and attempt.acked_at is None:
            attempt.acked_at = time.monotonic()
            payload = frame.get("payload")
            attempt.ack_payload = payload if isinstance(payload, dict) else None
            attempt._settle("acked" if attempt.acked_at <= attempt.deadline else "timed_out")
        self._notify()

    async def _socket_send(
        self, delivery: Delivery, attempt: DeliveryAttempt, connection: SocketConnection | None
    ) -> None:
        candidates = [connection] if connection is not None else self.open_connections
        candidates = [c for c in candidates if c.open and c.id in self._sockets]
        if not candidates:
            attempt._settle("no_connection")
            return
        conn = self._rng.choice(candidates)
        frame = envelope(
            delivery.kind, delivery.payload, retry_num=attempt.retry_num, retry_reason=attempt.retry_reason
        )
        attempt.envelope_id = frame["envelope_id"]
        attempt.connection_id = conn.id
        self._by_envelope[frame["envelope_id"]] = attempt
        if conn.deaf:
            conn.envelopes_lost += 1  # Slack sent it; it never arrives, so it is never acked
            return
        try:
            await self._sockets[conn.id][0].send_str(json.dumps(frame))
        except (ConnectionError, RuntimeError):
            attempt._settle("no_connection")
            return
        conn.envelopes_sent += 1

    async def disconnect(
        self, targets: list[SocketConnection], reason: str, close_after: float | None
    ) -> None:
        frame = {"type": "disconnect", "reason": reason, "debug_info": {"host": self.debug_host}}
        for conn in targets:
            entry = self._sockets.get(conn.id)
            if entry is None:
                continue
            if not conn.deaf:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await entry[0].send_str(json.dumps(frame))
            if close_after is not None:
                self._spawn(self._close_later(conn, close_after, reason))

    async def _close_later(self, conn: SocketConnection, delay: float, reason: str) -> None:
        await asyncio.sleep(delay)
        entry = self._sockets.get(conn.id)
        if entry is not None:
            conn.close_reason = reason
            await entry[0].close(code=aiohttp.WSCloseCode.GOING_AWAY, message=reason.encode())

    async def drop(self, targets: list[SocketConnection]) -> None:
        for conn in targets:
            entry = self._sockets.get(conn.id)
            if entry is None:
                continue
            conn.close_reason = "dropped"
            transport = entry[1].transport
            if transport is not None:
                transport.abort()
            else:
                await entry[0].close()

    # ------------------------------------------------------------------ HTTP

    def sign_headers(self, body: bytes, timestamp: int | None = None) -> dict[str, str]:
        ts = int(time.time()) if timestamp is None else timestamp
        return {
            "X-Slack-Request-Timestamp": str(ts),
            "X-Slack-Signature": sign(self._settings.signing_secret, ts, body),
        }

    async def post(self, url: str, raw: bytes, headers: dict[str, str]) -> HttpResult:
        if self._session is None:
            raise RuntimeError("FakeSlack is not started")
        timeout = aiohttp.ClientTimeout(total=max(30.0, self._settings.ack_timeout * 2))
        async with self._session.post(url, data=raw, headers=headers, timeout=timeout) as resp:
            text = await resp.text()
            return HttpResult(resp.status, text, {k.lower(): v for k, v in resp.headers.items()})

    def _http_url(self, delivery: Delivery) -> str | None:
        settings = self._settings
        if delivery.kind == "events_api":
            return settings.request_url
        return settings.interactivity_url or settings.request_url

    async def _http_send(self, delivery: Delivery, attempt: DeliveryAttempt) -> None:
        url = self._http_url(delivery)
        if url is None:
            attempt._settle("connection_failed")
            self._notify()
            return
        raw, content_type = http_body(delivery.kind, delivery.payload)
        headers = {"Content-Type": content_type, "User-Agent": SLACK_USER_AGENT, **self.sign_headers(raw)}
        if attempt.retry_num > 0:
            headers["X-Slack-Retry-Num"] = str(attempt.retry_num)
            headers["X-Slack-Retry-Reason"] = attempt.retry_reason or "http_timeout"
        try:
            result = await self.post(url, raw, headers)
        except (aiohttp.ClientError, OSError, TimeoutError):
            attempt._settle("connection_failed")
            self._notify()
            return
        attempt.http_status = result.status
        attempt.http_body = result.body
        attempt.http_headers = result.headers
        if 200 <= result.status < 300:
            attempt.acked_at = time.monotonic()
            with contextlib.suppress(json.JSONDecodeError):
                parsed = json.loads(result.body) if result.body else None
                attempt.ack_payload = parsed if isinstance(parsed, dict) else None
            attempt._settle("acked" if attempt.acked_at <= attempt.deadline else "timed_out")
        else:
            attempt._settle("rejected")
        self._notify()
