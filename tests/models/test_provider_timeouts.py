"""The providers' own HTTP client has real timeouts: a provider that stops sending mid-stream ends the attempt
with a retryable error instead of hanging, and the default leaves long generations room (httpx's own default,
5 s without a byte, would cut a slow model off)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from harness_core.messages import UserMessage
from harness_core.models import ModelRequest
from harness_core.models._base import HTTPProvider
from harness_core.models.anthropic import AnthropicProvider
from harness_core.models.openai import OpenAIProvider

PROVIDERS: list[type[HTTPProvider]] = [OpenAIProvider, AnthropicProvider]


@pytest.fixture
async def stalling_server() -> AsyncIterator[str]:
    """Answers every POST with SSE headers and one comment line, is silent for 2 s, then ends the response
    (a client without its own timeout sees a cut stream; one with a shorter timeout gives up first)."""
    release = asyncio.Event()

    async def stall(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b": waiting\n\n")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(release.wait(), 2.0)
        return response

    app = web.Application()
    app.router.add_post("/{tail:.*}", stall)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        release.set()
        await runner.cleanup()


@pytest.mark.parametrize("kind", PROVIDERS, ids=lambda k: k.__name__)
async def test_a_stalled_stream_times_out_as_a_retryable_error(
    kind: type[HTTPProvider], stalling_server: str
) -> None:
    provider = kind(api_key="sk-test", base_url=stalling_server, timeout=0.5)
    model = provider.model("gpt-4o" if kind is OpenAIProvider else "claude-sonnet-4-5")
    request = ModelRequest(messages=[UserMessage(content="hi")])
    try:
        items = [item async for item in provider.stream(model, request)]
    finally:
        await provider.aclose()
    final = items[-1]
    assert final.stop_reason == "error"
    assert final.error is not None and final.error.retryable
    assert "timed out" in final.error.message  # not "stream cut": the 0.5 s read timeout fired first


@pytest.mark.parametrize("kind", PROVIDERS, ids=lambda k: k.__name__)
async def test_the_default_timeouts_leave_a_slow_model_minutes_and_connect_fails_fast(
    kind: type[HTTPProvider],
) -> None:
    provider = kind(api_key="sk-test", base_url="http://127.0.0.1:9/v1")
    try:
        timeout = provider._http().timeout
    finally:
        await provider.aclose()
    assert timeout.read is not None and timeout.read >= 120
    assert timeout.connect is not None and timeout.connect <= 15
