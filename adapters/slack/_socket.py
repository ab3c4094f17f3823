"""slack-sdk's aiohttp Socket Mode client, watched: it counts connections, names why one was replaced, and
backs off when `apps.connections.open` keeps failing.

How a deaf connection is found (slack-sdk 3.x, verified in its code): the client pings every `ping_interval`
and opens the WebSocket with aiohttp's `heartbeat=ping_interval`, so aiohttp closes a connection on which no
pong came within half an interval of its ping. slack-sdk's own monitor also gives up on a session whose last
pong is 4 intervals old. Either way the monitor then calls `connect_to_new_endpoint`, which asks
`apps.connections.open` for a new URL and connects again. That is the one place every replacement goes
through (a `disconnect` frame from Slack too, with `force=True`), so the reason is judged there, once per
connection.

Several workers of one app each open their own connection; Slack sends each event to one of them at random.
Slack holds at most ten per app: the eleventh WebSocket gets a single `disconnect` frame with reason
`too_many_websockets` (no `hello`) and is closed. slack-sdk would answer that frame by reconnecting at once,
forever. Here the refusal is said once, in one line, and the client asks again slowly (the same backoff as a
failing `apps.connections.open`), so a worker beyond the tenth takes no Slack events until a slot frees, then
connects by itself. A connection counts as opened on Slack's `hello`, so refused ones are never counted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Any

from aiohttp import ClientWebSocketResponse, ServerTimeoutError
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.web.async_client import AsyncWebClient

from adapters.health import TransportHealth

log = logging.getLogger("adapters.slack")

BACKOFF_CAP = 60.0  # seconds: the longest wait before asking apps.connections.open again
TOO_MANY = "too_many_websockets"
REFUSED_LINE = "Slack allows at most 10 Socket Mode connections per app; this worker takes no Slack events until one frees"


def backoff_delay(failures: int, interval: float, jitter: float) -> float:
    """Seconds before asking again after `failures` refusals in a row: `interval` doubled per failure, up to
    a quarter more at random (`jitter` in [0, 1)) so many bots do not ask at the same moment, never past
    `BACKOFF_CAP`."""
    return min(BACKOFF_CAP, interval * 2.0 ** (failures - 1) * (1 + jitter / 4))


class WatchedSocketModeClient(SocketModeClient):
    def __init__(
        self,
        *,
        app_token: str,
        web_client: AsyncWebClient,
        ping_interval: float,
        health: TransportHealth,
        logger: logging.Logger,
    ) -> None:
        super().__init__(
            app_token=app_token, web_client=web_client, ping_interval=ping_interval, logger=logger
        )
        self.health = health
        self._judged: ClientWebSocketResponse | None = None  # the session whose end was already counted
        self._failures = 0  # apps.connections.open failures in a row
        self._refusals = 0  # connections refused in a row with too_many_websockets
        self._listeners: set[asyncio.Task[Any]] = set()  # frames being handled (slack-sdk keeps no reference)

    @property
    def refused(self) -> bool:
        """Slack refused this worker's last connection (too many for the app) and none opened since."""
        return self._refusals > 0

    async def enqueue_message(self, message: str) -> None:
        # Judged here, in the receive loop, before it reads the CLOSE that follows a refusal and reconnects:
        # that reconnect must already see the refusal and wait (the frame itself is handled in a later task).
        if TOO_MANY in message and _frame_is_refusal(message):
            self._refusals += 1
            self.health.lost()
            if self._refusals == 1:
                log.warning("Slack: %s", REFUSED_LINE)
        await super().enqueue_message(message)

    def _opened(self) -> None:
        self.health.opened()
        if self._refusals:
            self._refusals = 0
            log.info("Slack: a Socket Mode connection slot freed; this worker takes Slack events again")
        elif self.health.reconnects:
            log.info("Slack: Socket Mode reconnected (connection %d)", self.health.connections_opened)

    async def _after_refusal(self) -> None:
        """Not slack-sdk's `disconnect` handling (an immediate forced reconnect): close the refused socket if
        Slack has not yet, then reconnect through the ordinary, locked path, which waits first (see
        `issue_new_wss_url`)."""
        session = self.current_session
        if session is not None and not session.closed:
            await session.close()
        if not self.closed:
            await self.connect_to_new_endpoint()

    async def run_message_listeners(self, message: dict[str, Any], raw_message: str) -> None:
        # slack-sdk runs every frame in a task of its own and never cancels it: a `disconnect` frame's task may
        # be waiting out the backoff below when the adapter stops. Hold them, so close() can end them.
        task = asyncio.current_task()
        if task is not None:
            self._listeners.add(task)
        try:
            kind = message.get("type")
            if kind == "hello" and not self.closed:
                self._opened()
            if kind == "disconnect" and message.get("reason") == TOO_MANY:
                await self._after_refusal()
            else:
                await super().run_message_listeners(message, raw_message)
        finally:
            if task is not None:
                self._listeners.discard(task)

    async def close(self) -> None:
        """Close the connection and end every task of this client (slack-sdk only cancels its monitor,
        receiver and processor, and does not wait for them). The adapter drains the requests it is handling
        before it calls this; whatever is still running then is cancelled (an unacked envelope is redelivered)."""
        await super().close()  # type: ignore[no-untyped-call]
        current = asyncio.current_task()
        background = (self.message_processor, self.current_session_monitor, self.message_receiver)
        tasks = [t for t in (*self._listeners, *background) if t is not None and t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def connect_to_new_endpoint(self, force: bool = False) -> None:
        self._judge(force)
        await super().connect_to_new_endpoint(force)

    def _judge(self, force: bool) -> None:
        """Why the current session is being replaced, counted once per session."""
        session = self.current_session
        if session is None or session is self._judged or self.closed:
            return
        reason: str | None = None
        if force:
            reason = None  # Slack asked for it (`disconnect` frame): a rotation, not a failure
        elif self.stale:  # slack-sdk: the last pong is 4 ping intervals old
            reason = f"no pong for {4 * self.ping_interval:g}s (4 ping intervals)"
        elif session.closed and isinstance(session.exception(), ServerTimeoutError):
            reason = f"no pong within {self.ping_interval / 2:g}s of a ping"
        elif not session.closed:
            return  # still fine: slack-sdk will not replace it
        self._judged = session
        if reason is None:
            self.health.lost()
            return
        self.health.stale(reason)
        log.warning(
            "Slack: the Socket Mode connection went silent (%s); opening a new one (stale detection %d)",
            reason,
            self.health.stale_detections,
        )

    async def issue_new_wss_url(self) -> str:
        # slack-sdk retries a failed apps.connections.open every ping interval, forever: back off instead.
        if self._failures:
            delay = backoff_delay(self._failures, self.ping_interval, random.random())
            log.info(
                "Slack: apps.connections.open failed %d time(s); retrying in %.1fs", self._failures, delay
            )
            await asyncio.sleep(delay)
        elif self._refusals:  # said once already (REFUSED_LINE); ask again slowly, quietly
            delay = backoff_delay(self._refusals, self.ping_interval, random.random())
            log.debug("Slack: Socket Mode refused %d time(s); asking again in %.1fs", self._refusals, delay)
            await asyncio.sleep(delay)
        try:
            url = await super().issue_new_wss_url()
        except Exception:
            self._failures += 1
            raise
        self._failures = 0
        return url


def _frame_is_refusal(raw: str) -> bool:
    try:
        frame = json.loads(raw)
    except ValueError:
        return False
    return isinstance(frame, dict) and frame.get("type") == "disconnect" and frame.get("reason") == TOO_MANY
