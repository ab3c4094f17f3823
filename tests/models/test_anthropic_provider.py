"""AnthropicProvider against recorded-shape Messages API streams (respx; no network)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx

from harness_core.messages import (
    AssistantMessage,
    ImageContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolDeclaration,
    ToolResultMessage,
    UserMessage,
)
from harness_core.models import ModelInfo, ModelRequest, Provider
from harness_core.models.anthropic import AnthropicProvider

from .support import (
    ChunkStream,
    assert_stream_contract,
    collect,
    json_response,
    request_json,
    split_every,
    sse_events,
    sse_response,
)

BASE = "https://anthropic.test"
URL = f"{BASE}/v1/messages"
KEY = "sk-ant-test-SECRET-0123456789"
MODEL = "claude-sonnet-4-5"


def message_start(input_tokens: int = 10, cache_read: int = 0, cache_write: int = 0) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "cache_read_input_tokens": cache_read,
                "cache_creation_input_tokens": cache_write,
                "output_tokens": 1,
            },
        },
    }


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, payload: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": payload}


def text_delta(index: int, text: str) -> dict[str, Any]:
    return delta(index, {"type": "text_delta", "text": text})


def json_delta(index: int, fragment: str) -> dict[str, Any]:
    return delta(index, {"type": "input_json_delta", "partial_json": fragment})


def block_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_delta(stop_reason: str = "end_turn", output_tokens: int = 5) -> dict[str, Any]:
    return {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }


PING = {"type": "ping"}
STOP = {"type": "message_stop"}


def text_body(*pieces: str, stop_reason: str = "end_turn") -> bytes:
    return sse_events(
        message_start(),
        block_start(0, {"type": "text", "text": ""}),
        PING,
        *[text_delta(0, piece) for piece in pieces],
        block_stop(0),
        message_delta(stop_reason),
        STOP,
    )


@pytest.fixture
async def provider() -> AsyncIterator[AnthropicProvider]:
    p = AnthropicProvider(api_key=KEY, base_url=BASE)
    yield p
    await p.aclose()


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


def ask(text: str = "hi", **kwargs: Any) -> ModelRequest:
    return ModelRequest(messages=[UserMessage(content=text)], **kwargs)


async def run(
    provider: AnthropicProvider, request: ModelRequest, model_id: str = MODEL
) -> list[AssistantMessage]:
    return await collect(provider.stream(provider.model(model_id), request))


# -- happy paths --------------------------------------------------------------------------------------------


async def test_plain_text_answer(provider: AnthropicProvider, mock: respx.MockRouter) -> None:
    route = mock.post(URL).mock(return_value=sse_response(text_body("Hello", ", world.")))
    items = await run(provider, ask())
    final = assert_stream_contract(items)
    assert final.stop_reason == "stop"
    assert final.content == [TextContent(text="Hello, world.")]
    assert (final.provider, final.model, final.error) == ("anthropic", MODEL, None)
    headers = route.calls.last.request.headers
    assert headers["x-api-key"] == KEY
    assert headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in headers
    assert request_json(route)["stream"] is True


async def test_streamed_answer_in_many_chunks(provider: AnthropicProvider, mock: respx.MockRouter) -> None:
    text = "Claude streams é accents, emoji 🚀 and\nnewlines in many small deltas until the answer is done."
    pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
    mock.post(URL).mock(return_value=sse_response(ChunkStream(split_every(text_body(*pieces), 5))))
    items = await run(provider, ask())
    final = assert_stream_contract(items)
    assert final.text() == text
    partial_texts = [item.text() for item in items[:-1] if item.text()]
    assert len(partial_texts) >= len(pieces)
    for shorter, longer in itertools.pairwise(partial_texts):
        assert longer.startswith(shorter)


async def test_thinking_text_and_two_tool_calls(provider: AnthropicProvider, mock: respx.MockRouter) -> None:
    body = sse_events(
        message_start(),
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, {"type": "thinking_delta", "thinking": "Need weather "}),
        delta(0, {"type": "thinking_delta", "thinking": "and time."}),
        delta(0, {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}),
        block_stop(0),
        block_start(1, {"type": "text", "text": ""}),
        text_delta(1, "Checking both."),
        block_stop(1),
        block_start(2, {"type": "tool_use", "id": "toolu_01A", "name": "get_weather", "input": {}}),
        json_delta(2, ""),
        json_delta(2, '{"ci'),
        json_delta(2, 'ty": "Par'),
        json_delta(2, 'is", "units": ["c", '),
        json_delta(2, '"k"], "note": "quote \\" and \\u00e9"}'),
        block_stop(2),
        PING,
        block_start(3, {"type": "tool_use", "id": "toolu_01B", "name": "get_time", "input": {}}),
        json_delta(3, '{"tz": "Europe/'),
        json_delta(3, 'Paris"}'),
        block_stop(3),
        message_delta("tool_use", 80),
        STOP,
    )
    mock.post(URL).mock(return_value=sse_response(body))
    items = await run(provider, ask("weather and time?"))
    final = assert_stream_contract(items)
    assert final.stop_reason == "toolUse"
    assert final.content[0] == ThinkingContent(thinking="Need weather and time.", signature="EqQBCgIYAhIM")
    assert final.content[1] == TextContent(text="Checking both.")
    calls = final.tool_calls()
    assert [(c.id, c.name) for c in calls] == [("toolu_01A", "get_weather"), ("toolu_01B", "get_time")]
    assert calls[0].arguments == {"city": "Paris", "units": ["c", "k"], "note": 'quote " and é'}
    assert calls[1].arguments == {"tz": "Europe/Paris"}
    assert all(c.partial_json is None for c in calls)
    streaming = [i.tool_calls()[0] for i in items[:-1] if i.tool_calls() and i.tool_calls()[0].partial_json]
    assert any(c.partial_json == '{"city": "Par' and c.arguments == {"city": "Par"} for c in streaming)


async def test_tool_call_without_input_and_invalid_json(
    provider: AnthropicProvider, mock: respx.MockRouter
) -> None:
    body = sse_events(
        message_start(),
        block_start(0, {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}),
        block_stop(0),
        block_start(1, {"type": "tool_use", "id": "toolu_2", "name": "run", "input": {}}),
        json_delta(1, '{"cmd": "ls'),
        block_stop(1),
        message_delta("tool_use"),
        STOP,
    )
    mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask()))
    empty, invalid = final.tool_calls()
    assert empty == ToolCall(id="toolu_1", name="now", arguments={})
    assert (invalid.arguments, invalid.partial_json) == ({}, '{"cmd": "ls')


async def test_redacted_thinking_round_trips(provider: AnthropicProvider, mock: respx.MockRouter) -> None:
    body = sse_events(
        message_start(),
        block_start(0, {"type": "redacted_thinking", "data": "OPAQUE"}),
        block_stop(0),
        block_start(1, {"type": "text", "text": "ok"}),
        block_stop(1),
        message_delta(),
        STOP,
    )
    route = mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.content[0] == ThinkingContent(thinking="", signature="redacted:OPAQUE")
    mock.post(URL).mock(return_value=sse_response(text_body("again")))
    await run(
        provider, ModelRequest(messages=[UserMessage(content="hi"), final, UserMessage(content="more")])
    )
    sent = request_json(route)["messages"][1]
    assert sent == {
        "role": "assistant",
        "content": [{"type": "redacted_thinking", "data": "OPAQUE"}, {"type": "text", "text": "ok"}],
    }


@pytest.mark.parametrize(
    ("reason", "stop"),
    [("max_tokens", "length"), ("stop_sequence", "stop"), ("pause_turn", "stop"), ("brand_new", "stop")],
)
async def test_stop_reason_mapping(
    provider: AnthropicProvider, mock: respx.MockRouter, reason: str, stop: str
) -> None:
    mock.post(URL).mock(return_value=sse_response(text_body("x", stop_reason=reason)))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.stop_reason == stop


async def test_refusal_is_an_error(provider: AnthropicProvider, mock: respx.MockRouter) -> None:
    mock.post(URL).mock(return_value=sse_response(text_body("no", stop_reason="refusal")))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert not final.error.retryable
    assert "refus" in final.error.message


# -- request mapping ----------------------------------------------------------------------------------------

PNG = "iVBORw0KGgo="


async def test_request_body_mapping(provider: AnthropicProvider, mock: respx.MockRouter) -> None:
    route = mock.post(URL).mock(return_value=sse_response(text_body("ok")))
    request = ModelRequest(
        system_prompt="You are terse.",
        messages=[
            UserMessage(content=[TextContent(text="Look"), ImageContent(data=PNG, mime_type="image/png")]),
            AssistantMessage(
                content=[
                    ThinkingContent(thinking="plan", signature="sig-1"),
                    ThinkingContent(thinking="unsigned, from another provider"),
                    TextContent(text="Checking."),
                    ToolCall(id="toolu_a", name="read", arguments={"path": "/a"}),
                    ToolCall(id="call|b.1", name="shot", arguments={}),
                ],
                stop_reason="toolUse",
            ),
            ToolResultMessage(
                tool_call_id="toolu_a", tool_name="read", content=[TextContent(text="A")], is_error=True
            ),
            ToolResultMessage(
                tool_call_id="call|b.1",
                tool_name="shot",
                content=[TextContent(text="see"), ImageContent(data=PNG, mime_type="image/jpeg")],
            ),
            UserMessage(content="and now?"),
        ],
        tools=[
            ToolDeclaration(
                name="read",
                description="Read a file",
                parameters={"type": "object", "properties": {"path": {"type": "string"}}},
            )
        ],
        session_id="conv-123",
        reasoning="medium",
        options={"temperature": 1, "extra_body": {"service_tier": "auto"}, "unknown": 1},
    )
    await run(provider, request)
    body = request_json(route)
    assert body["model"] == MODEL
    assert body["max_tokens"] == provider.model(MODEL).max_tokens
    assert body["system"] == [
        {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}
    ]
    assert body["tools"] == [
        {
            "name": "read",
            "description": "Read a file",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        }
    ]
    assert body["metadata"] == {"user_id": "conv-123"}
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 10240}
    assert body["temperature"] == 1
    assert body["service_tier"] == "auto"
    assert "unknown" not in body
    image = {"type": "base64", "media_type": "image/png", "data": PNG}
    messages = body["messages"]
    assert messages[0] == {
        "role": "user",
        "content": [{"type": "text", "text": "Look"}, {"type": "image", "source": image}],
    }
    assistant = messages[1]
    assert assistant["role"] == "assistant"
    assert assistant["content"][:3] == [
        {"type": "thinking", "thinking": "plan", "signature": "sig-1"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_a", "name": "read", "input": {"path": "/a"}},
    ]
    sanitized = assistant["content"][3]["id"]
    assert assistant["content"][3] == {"type": "tool_use", "id": sanitized, "name": "shot", "input": {}}
    assert sanitized.replace("_", "").replace("-", "").isalnum()
    assert len(messages) == 3
    results = messages[2]
    assert results["role"] == "user"
    assert results["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_a",
            "content": [{"type": "text", "text": "A"}],
            "is_error": True,
        },
        {
            "type": "tool_result",
            "tool_use_id": sanitized,
            "content": [
                {"type": "text", "text": "see"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": PNG}},
            ],
        },
        {"type": "text", "text": "and now?", "cache_control": {"type": "ephemeral"}},
    ]


async def test_request_body_without_reasoning_or_caching(mock: respx.MockRouter) -> None:
    provider = AnthropicProvider(api_key=KEY, base_url=BASE, prompt_caching=False)
    route = mock.post(URL).mock(return_value=sse_response(text_body("ok")))
    try:
        await run(
            provider, ask(max_tokens=300, reasoning="high", system_prompt="S"), "claude-3-5-haiku-latest"
        )
        plain = request_json(route)
        await run(provider, ask(max_tokens=1500, reasoning="high"), MODEL)
        tight = request_json(route)
        await run(provider, ask(max_tokens=40_000, reasoning="high"), MODEL)
        roomy = request_json(route)
    finally:
        await provider.aclose()
    assert plain["max_tokens"] == 300
    assert "thinking" not in plain  # not a reasoning model
    assert "metadata" not in plain
    assert plain["system"] == [{"type": "text", "text": "S"}]
    assert plain["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert "thinking" not in tight  # 1500 tokens leave no room for the 1024 minimum plus an answer
    assert roomy["thinking"] == {"type": "enabled", "budget_tokens": 32768}
    assert roomy["max_tokens"] == 40_000


# -- usage and cost -----------------------------------------------------------------------------------------


async def test_usage_and_cost(provider: AnthropicProvider, mock: respx.MockRouter) -> None:
    body = sse_events(
        message_start(input_tokens=100, cache_read=1000, cache_write=200),
        block_start(0, {"type": "text", "text": ""}),
        text_delta(0, "hi"),
        block_stop(0),
        message_delta("end_turn", output_tokens=50),
        STOP,
    )
    mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask()))
    usage = final.usage
    assert (usage.input, usage.output, usage.cache_read, usage.cache_write) == (100, 50, 1000, 200)
    price = provider.model(MODEL).price
    expected = (
        100 * price.input + 50 * price.output + 1000 * price.cache_read + 200 * price.cache_write
    ) / 1e6
    assert usage.cost == pytest.approx(expected)
    assert usage.cost > 0


# -- errors -------------------------------------------------------------------------------------------------


def anthropic_error(type_: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message}}


@pytest.mark.parametrize(
    ("headers", "expected_ms"),
    [
        ({"retry-after": "12"}, 12_000),
        ({"retry-after": "0.5"}, 500),
        ({"retry-after-ms": "250"}, 250),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0),  # a date in the past: retry now
    ],
)
async def test_429_is_retryable_with_retry_after(
    provider: AnthropicProvider, mock: respx.MockRouter, headers: dict[str, str], expected_ms: int
) -> None:
    payload = anthropic_error(
        "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"
    )
    mock.post(URL).mock(return_value=json_response(429, payload, headers))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert final.error.retryable
    assert not final.error.overflow
    assert final.error.retry_after_ms == expected_ms
    assert final.error.status == 429
    assert "per-minute rate limit" in final.error.message


@pytest.mark.parametrize(
    ("status", "type_", "message"),
    [(500, "api_error", "Internal server error"), (529, "overloaded_error", "Overloaded")],
)
async def test_server_errors_are_retryable(
    provider: AnthropicProvider, mock: respx.MockRouter, status: int, type_: str, message: str
) -> None:
    mock.post(URL).mock(return_value=json_response(status, anthropic_error(type_, message)))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert final.error.retryable
    assert final.error.status == status
    assert message in final.error.message


async def test_overloaded_error_event_mid_stream(provider: AnthropicProvider, mock: respx.MockRouter) -> None:
    body = sse_events(
        message_start(),
        block_start(0, {"type": "text", "text": ""}),
        text_delta(0, "Partial answer"),
        anthropic_error("overloaded_error", "Overloaded"),
    )
    mock.post(URL).mock(return_value=sse_response(body))
    items = await run(provider, ask())
    final = assert_stream_contract(items)
    assert final.stop_reason == "error"
    assert final.text() == "Partial answer"
    assert final.error is not None
    assert final.error.retryable
    assert final.error.status == 529
    assert "Overloaded" in final.error.message


async def test_invalid_request_error_event_is_not_retryable(
    provider: AnthropicProvider, mock: respx.MockRouter
) -> None:
    body = sse_events(message_start(), anthropic_error("invalid_request_error", "messages: bad block"))
    mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert not final.error.retryable
    assert "messages: bad block" in final.error.message


async def test_stream_cut_mid_way_is_retryable(provider: AnthropicProvider, mock: respx.MockRouter) -> None:
    body = sse_events(
        message_start(), block_start(0, {"type": "text", "text": ""}), text_delta(0, "Hello wor")
    )
    mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.stop_reason == "error"
    assert final.text() == "Hello wor"
    assert final.error is not None
    assert final.error.retryable
    assert "stream cut" in final.error.message


async def test_peer_closing_mid_stream_is_retryable(
    provider: AnthropicProvider, mock: respx.MockRouter
) -> None:
    error = httpx.RemoteProtocolError("peer closed connection without sending complete message body")
    body = ChunkStream(
        [sse_events(message_start(), block_start(0, {"type": "text", "text": ""}))], error=error
    )
    mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert final.error.retryable
    assert "peer closed connection" in final.error.message


@pytest.mark.parametrize(
    ("status", "payload"),
    [
        (400, anthropic_error("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum")),
        (
            400,
            anthropic_error(
                "invalid_request_error",
                "input length and `max_tokens` exceed context limit: 195000 + 64000 > 200000, decrease input length "
                "or `max_tokens` and try again",
            ),
        ),
        (413, anthropic_error("request_too_large", "Request exceeds the maximum allowed number of bytes.")),
    ],
)
async def test_context_overflow(
    provider: AnthropicProvider, mock: respx.MockRouter, status: int, payload: Any
) -> None:
    mock.post(URL).mock(return_value=json_response(status, payload))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert final.error.overflow
    assert not final.error.retryable
    assert payload["error"]["message"] in final.error.message


@pytest.mark.parametrize(
    ("status", "type_", "message"),
    [
        (400, "invalid_request_error", "messages.1.content.0.tool_use.id: String should match pattern"),
        (401, "authentication_error", "invalid x-api-key"),
        (403, "permission_error", "Your API key does not have permission to use the specified resource."),
        (404, "not_found_error", "model: claude-nine"),
    ],
)
async def test_client_errors_are_not_retryable(
    provider: AnthropicProvider, mock: respx.MockRouter, status: int, type_: str, message: str
) -> None:
    mock.post(URL).mock(return_value=json_response(status, anthropic_error(type_, message)))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert not final.error.retryable
    assert not final.error.overflow
    assert final.error.status == status
    assert message in final.error.message
    assert type_ in final.error.message


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("line", "expected"),
    [(b"<html>oops</html>\n\n", "malformed SSE line"), (b"event: ping\ndata: {\n\n", "invalid JSON")],
)
async def test_malformed_stream_fails_clearly_without_hanging(
    provider: AnthropicProvider, mock: respx.MockRouter, line: bytes, expected: str
) -> None:
    body = ChunkStream([sse_events(message_start()), line], hang=True)
    mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert not final.error.retryable
    assert expected in final.error.message
    assert body.closed


# -- cancellation -------------------------------------------------------------------------------------------


@pytest.mark.timeout(10)
async def test_closing_the_iterator_closes_the_response(
    provider: AnthropicProvider, mock: respx.MockRouter
) -> None:
    body = ChunkStream(
        [sse_events(message_start(), block_start(0, {"type": "text", "text": ""}), text_delta(0, "first"))],
        hang=True,
    )
    mock.post(URL).mock(return_value=sse_response(body))
    stream = provider.stream(provider.model(MODEL), ask())
    first = await anext(stream)
    assert first.text() == ""
    second = await anext(stream)
    assert second.text() == "first"
    await stream.aclose()  # type: ignore[attr-defined]
    assert body.closed


@pytest.mark.timeout(10)
async def test_cancelling_the_consumer_closes_the_response(
    provider: AnthropicProvider, mock: respx.MockRouter
) -> None:
    body = ChunkStream([sse_events(message_start(), block_start(0, {"type": "text", "text": ""}))], hang=True)
    mock.post(URL).mock(return_value=sse_response(body))

    async def consume() -> None:
        async for _ in provider.stream(provider.model(MODEL), ask()):
            pass

    task = asyncio.create_task(consume())
    await body.hanging.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert body.closed


# -- configuration, secrets, models -------------------------------------------------------------------------


async def test_reads_key_and_base_url_from_environment(
    monkeypatch: pytest.MonkeyPatch, mock: respx.MockRouter
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env-987654321")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9000")
    route = mock.post("http://127.0.0.1:9000/v1/messages").mock(return_value=sse_response(text_body("ok")))
    provider = AnthropicProvider()
    try:
        assert provider.name == "anthropic"
        final = assert_stream_contract(await run(provider, ask()))
    finally:
        await provider.aclose()
    assert final.text() == "ok"
    assert route.calls.last.request.headers["x-api-key"] == "sk-ant-from-env-987654321"


async def test_default_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    provider = AnthropicProvider(api_key=KEY)
    assert provider.base_url == "https://api.anthropic.com"
    await provider.aclose()


async def test_api_key_never_shown(
    provider: AnthropicProvider, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    assert KEY not in repr(provider)
    assert KEY not in str(provider)
    payload = anthropic_error("authentication_error", f"invalid x-api-key {KEY}")
    mock.post(URL).mock(return_value=json_response(401, payload))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert "invalid x-api-key" in final.error.message
    assert KEY not in final.model_dump_json()
    assert all(KEY not in record.getMessage() for record in caplog.records)


def test_model_table_defaults_and_registration() -> None:
    provider = AnthropicProvider(api_key=KEY)
    assert isinstance(provider, Provider)
    sonnet = provider.model("claude-sonnet-4-5")
    assert sonnet.reasoning
    assert sonnet.context_window == 200_000
    assert sonnet.price.cache_write > sonnet.price.input > sonnet.price.cache_read > 0
    dated = provider.model("claude-sonnet-4-5-20250929")
    assert (dated.id, dated.price) == ("claude-sonnet-4-5-20250929", sonnet.price)
    assert provider.model("claude-sonnet-4-20250514").price == provider.model("claude-sonnet-4-0").price
    assert provider.model("claude-next") == ModelInfo(provider="anthropic", id="claude-next")
    provider.register_model(ModelInfo(provider="anthropic", id="claude-next", context_window=1_000_000))
    assert provider.model("claude-next").context_window == 1_000_000
