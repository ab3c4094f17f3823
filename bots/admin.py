"""The admin endpoint (`[admin] listen = "127.0.0.1:9100"`): probes for supervisors and a Prometheus scrape.

- `GET /healthz`: 200 while the event loop runs a callback within 1 s (503 otherwise);
- `GET /readyz`: 200 only when the storage is open and every started adapter is connected; else 503 with a
  JSON body naming what is not (`{"ready": false, "not_ready": {"slack": "not connected"}}`);
- `GET /metrics`: Prometheus text format (`bots/metrics.py`).

It serves from a thread of its own, not from the event loop, so a stuck loop still gets an answer (503)
instead of a hung probe. Everything it needs from the bot runs in the loop (`run_coroutine_threadsafe`) with a
1 s limit. A non-loopback address requires `ADMIN_TOKEN` (sent as `Authorization: Bearer <token>`); when
`ADMIN_TOKEN` is set it is required on loopback too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from adapters.base import Adapter
from adapters.health import health_of
from bots.metrics import BotMetrics, Sample
from harness_core import Harness

log = logging.getLogger("bots.admin")
T = TypeVar("T")
PROBE_TIMEOUT = 1.0
LAG_INTERVAL = 0.5


class AdminError(Exception):
    """The admin endpoint cannot start as configured (the message says how to fix it)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class AdminServer:
    """Owns its HTTP thread and its loop-lag probe; `start()` in the bot's loop, `stop()` before it closes."""

    def __init__(
        self,
        address: tuple[str, int],
        metrics: BotMetrics,
        readiness: Callable[[], Awaitable[dict[str, str]]],
        env: Mapping[str, str],
    ) -> None:
        host, _ = address
        self.token = env.get("ADMIN_TOKEN") or None
        if self.token is None and not is_loopback(host):
            raise AdminError(
                f"admin.listen {host!r} is not a loopback address: set ADMIN_TOKEN in the environment (probes "
                "then send 'Authorization: Bearer <token>') or listen on 127.0.0.1"
            )
        self.address = address
        self.metrics = metrics
        self.readiness = readiness
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lag_task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{name}]" if ":" in name else name
        return f"http://{shown}:{port}/"

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.metrics.set_sampler(lambda: self.in_loop(self.metrics.sample(), Sample()))
        handler = _handler_for(self)
        try:
            server_class = _server_class(self.address[0])
            self._server = server_class(self.address, handler)
        except OSError as exc:
            raise AdminError(
                f"admin.listen {self.address[0]}:{self.address[1]}: cannot listen: {exc.strerror}"
            ) from None
        self._thread = threading.Thread(target=self._server.serve_forever, name="admin-http", daemon=True)
        self._thread.start()
        self._lag_task = asyncio.create_task(self._measure_lag(), name="admin-loop-lag")

    async def stop(self) -> None:
        if self._lag_task is not None:
            self._lag_task.cancel()
            await asyncio.gather(self._lag_task, return_exceptions=True)
        if self._server is not None:
            await asyncio.to_thread(self._server.shutdown)
            self._server.server_close()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
        self.metrics.set_sampler(None)

    async def _measure_lag(self) -> None:
        """Sleep a fixed interval and record how late the loop woke us: the loop's lag, without the server."""
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + LAG_INTERVAL
            await asyncio.sleep(LAG_INTERVAL)
            self.metrics.loop_lag.set(max(0.0, loop.time() - expected))

    # --- called from the HTTP thread -----------------------------------------------------------------------

    def in_loop(self, coroutine: Awaitable[T], default: T) -> T:
        """Run `coroutine` in the bot's loop and wait at most PROBE_TIMEOUT; `default` if it did not answer."""
        assert self._loop is not None
        try:
            future = asyncio.run_coroutine_threadsafe(_wrap(coroutine), self._loop)
        except RuntimeError:  # the loop is closed
            if inspect.iscoroutine(coroutine):
                coroutine.close()
            return default
        try:
            return future.result(PROBE_TIMEOUT)
        except FutureTimeout:
            future.cancel()
            return default
        except (
            Exception
        ) as exc:  # the probe itself failed (e.g. the storage): answer, do not drop the request
            log.warning("admin: probe failed: %r", exc)
            return default

    def loop_answers(self) -> float | None:
        """Seconds the loop took to run a callback, or None past PROBE_TIMEOUT."""
        assert self._loop is not None
        done = threading.Event()
        started = time.monotonic()
        try:
            self._loop.call_soon_threadsafe(done.set)
        except RuntimeError:  # the loop is closed
            return None
        return time.monotonic() - started if done.wait(PROBE_TIMEOUT) else None

    def authorized(self, header: str | None) -> bool:
        if self.token is None:
            return True
        expected = f"Bearer {self.token}".encode()
        return header is not None and hmac.compare_digest(header.encode(), expected)


async def _wrap(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _server_class(host: str) -> type[ThreadingHTTPServer]:
    if ":" in host:

        class _V6(ThreadingHTTPServer):
            address_family = socket.AF_INET6

        return _V6
    return ThreadingHTTPServer


def _handler_for(admin: AdminServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "durable-bots-admin"

        def do_GET(self) -> None:
            if not admin.authorized(self.headers.get("Authorization")):
                self._send(401, {"error": "missing or wrong bearer token (ADMIN_TOKEN)"})
                return
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                took = admin.loop_answers()
                if took is None:
                    self._send(
                        503,
                        {"ok": False, "error": f"the event loop did not answer within {PROBE_TIMEOUT:g} s"},
                    )
                else:
                    self._send(200, {"ok": True, "loop_ms": round(took * 1000, 2)})
            elif path == "/readyz":
                problems = admin.in_loop(admin.readiness(), {"event_loop": "not answering"})
                if problems:
                    self._send(503, {"ready": False, "not_ready": problems})
                else:
                    self._send(200, {"ready": True})
            elif path == "/metrics":
                if admin.loop_answers() is None:
                    self._send(503, {"error": "the event loop is not answering"})
                    return
                body = generate_latest(admin.metrics.registry)
                self._raw(200, body, CONTENT_TYPE_LATEST)
            else:
                self._send(404, {"error": "not found; try /healthz, /readyz or /metrics"})

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            self._raw(status, json.dumps(payload).encode(), "application/json")

        def _raw(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("admin: " + format, *args)

    return Handler


def readiness_of(
    harness: Harness, adapters: Sequence[Adapter], phase: Sequence[str], storage: object = None
) -> Callable[[], Awaitable[dict[str, str]]]:
    """`/readyz` of a running bot: what is not ready, by component (empty: ready). `phase[0]` is the run's
    phase ("starting", "" once ready, "stopping"); `adapters` the ones started so far.

    A storage backend with more to say (PostgreSQL: the lease) offers `not_ready() -> str | None`: a reason
    while it cannot serve (e.g. "lease not held"), None when it can. SQLite has nothing to add."""

    async def check() -> dict[str, str]:
        problems: dict[str, str] = {}
        if phase[0]:
            problems["bot"] = phase[0]
        if harness.closed.done():
            problems["storage"] = "closed (the storage failed or the bot is stopping)"
        else:
            check = getattr(storage, "not_ready", None)
            reason = check() if callable(check) else None
            if reason:
                problems["storage"] = str(reason)
        for adapter in adapters:
            health = health_of(adapter)
            if health is not None and not health.connected:
                problems[adapter.name] = f"not connected to {health.platform}"
        return problems

    return check
