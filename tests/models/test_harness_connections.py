"""Connection handling of the HTTP providers under the harness: a finished response hands its connection back
to the pool (a run of model requests does not pay a TCP and TLS handshake each), and a server that keeps the
stream open after its final event costs neither the answer nor a hang."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from harness_core import Input
from harness_core.models._base import HTTPProvider

from .harness_support import (
    Call,
    Dialect,
    GatedStream,
    OpenRig,
    Rigs,
    Script,
    network_chunks,
    stream_response,
)

pytestmark = pytest.mark.timeout(10)


class LocalServer:
    """Serves queued SSE bodies on the dialect's path and records the client port of every request."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.bodies: list[list[bytes]] = []
        self.ports: list[int] = []
        self.requests: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(await request.json())
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        self.ports.append(int(peer[1]) if peer else -1)
        if not self.bodies:
            return web.json_response({"error": {"message": "no response left"}}, status=400)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for event in self.bodies.pop(0):
            await response.write(event)
        await response.write_eof()
        return response


@pytest.fixture
async def local(dialect: Dialect) -> AsyncIterator[tuple[LocalServer, str]]:
    server = LocalServer(dialect)
    app = web.Application()
    app.router.add_post(dialect.path, server.handle)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield server, dialect.base_url_for(f"http://127.0.0.1:{port}")
    await runner.cleanup()


@pytest.fixture
async def real_http(dialect: Dialect) -> AsyncIterator[Rigs]:
    """Rigs whose providers talk to real sockets (no respx)."""
    rigs = Rigs(dialect, Script())
    yield rigs
    await rigs.aclose()


async def test_a_run_reuses_one_connection(
    dialect: Dialect, real_http: Rigs, local: tuple[LocalServer, str]
) -> None:
    server, base_url = local
    rig = await real_http(base_url=base_url)
    call = Call(dialect.call_ids[0], "forecast", {"city": "Zürich", "days": 3})
    server.bodies += [
        dialect.tool_call_events([call]),
        dialect.text_events("Sunny."),
        dialect.text_events("You are welcome."),
    ]
    assert (await (await rig.root.submit(Input("Weather in Zürich?"))).wait()).status == "done"
    assert (await (await rig.root.submit(Input("Thanks"))).wait()).status == "done"
    assert rig.executed == [{"city": "Zürich", "days": 3}]
    assert len(server.ports) == 3 and len(set(server.ports)) == 1, server.ports
    assert json.dumps(server.requests[2], ensure_ascii=False).count("Zürich: sunny for 3 days") == 1


async def test_a_stream_left_open_after_its_final_event_still_answers(
    dialect: Dialect, script: Script, open_rig: OpenRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(HTTPProvider, "drain_timeout", 0.01)
    rig = await open_rig()
    body = GatedStream(network_chunks(dialect.text_events("Done, ", "but the line stays open.")), hang=True)
    script.add(stream_response(body))
    settled = await (await rig.root.submit(Input("Hello?"))).wait()
    assert settled.status == "done"
    assert await rig.answer_text(settled.answer) == "Done, but the line stays open."
    assert body.hanging.is_set() and body.closed
