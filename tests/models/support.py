"""Helpers for provider tests: SSE bodies, byte streams that can be cut, fail or hang, and collection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpx

from harness_core.messages import AssistantMessage

SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8"}


def sse_data(*payloads: Any, done: bool = False) -> bytes:
    """`data:` events (OpenAI style); strings are sent verbatim."""
    out = []
    for payload in payloads:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        out.append(f"data: {text}\n\n")
    if done:
        out.append("data: [DONE]\n\n")
    return "".join(out).encode()


def sse_events(*events: dict[str, Any]) -> bytes:
    """Named events (Anthropic style): the event name is the payload's `type`."""
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def split_every(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


class ChunkStream(httpx.AsyncByteStream):
    """A response body delivered chunk by chunk; then it ends, raises `error`, or hangs until closed."""

    def __init__(
        self, chunks: Iterable[bytes], *, error: Exception | None = None, hang: bool = False
    ) -> None:
        self.chunks = list(chunks)
        self.error = error
        self.hang = hang
        self.closed = False
        self.hanging = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            await asyncio.sleep(0)
            yield chunk
        if self.error is not None:
            raise self.error
        if self.hang:
            self.hanging.set()
            await asyncio.Event().wait()

    async def aclose(self) -> None:
        self.closed = True


def sse_response(
    body: bytes | ChunkStream, status: int = 200, headers: dict[str, str] | None = None
) -> httpx.Response:
    stream = body if isinstance(body, ChunkStream) else ChunkStream([body])
    return httpx.Response(status, headers={**SSE_HEADERS, **(headers or {})}, stream=stream)


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, json=payload, headers=headers)


async def collect(stream: AsyncIterator[AssistantMessage]) -> list[AssistantMessage]:
    """Every item as a deep copy (providers may keep mutating one object)."""
    return [item.model_copy(deep=True) async for item in stream]


def assert_stream_contract(items: list[AssistantMessage]) -> AssistantMessage:
    assert items, "the stream yielded nothing"
    assert all(item.stop_reason is None for item in items[:-1])
    final = items[-1]
    assert final.stop_reason is not None
    return final


def request_json(route: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(route.calls.last.request.content)
    return body
