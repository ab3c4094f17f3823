"""OpenAIProvider against recorded-shape Chat Completions streams (respx; no network)."""

from __future__ import annotations

import asyncio
import itertools
import json
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
from harness_core.models import ModelInfo, ModelPrice, ModelRef, ModelRequest, Models, Provider
from harness_core.models.openai import OpenAIProvider

from .support import (
    ChunkStream,
    assert_stream_contract,
    collect,
    json_response,
    request_json,
    split_every,
    sse_data,
    sse_response,
)

BASE = "https://llm.test/v1"
URL = f"{BASE}/chat/completions"
KEY = "sk-test-SECRET-0123456789"


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "gpt-4o",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
        **extra,
    }


def usage_chunk(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


def text_body(*pieces: str, finish: str = "stop") -> bytes:
    events: list[Any] = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in pieces]
    events.append(chunk({}, finish))
    events.append(usage_chunk(10, len(pieces)))
    return sse_data(*events, done=True)


@pytest.fixture
async def provider() -> AsyncIterator[OpenAIProvider]:
    p = OpenAIProvider(api_key=KEY, base_url=BASE)
    yield p
    await p.aclose()


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


def ask(text: str = "hi", **kwargs: Any) -> ModelRequest:
    return ModelRequest(messages=[UserMessage(content=text)], **kwargs)


async def run(
    provider: OpenAIProvider, request: ModelRequest, model_id: str = "gpt-4o"
) -> list[AssistantMessage]:
    return await collect(provider.stream(provider.model(model_id), request))


# -- happy paths --------------------------------------------------------------------------------------------


async def test_plain_text_answer(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    route = mock.post(URL).mock(return_value=sse_response(text_body("Hello", ", world.")))
    items = await run(provider, ask())
    final = assert_stream_contract(items)
    assert final.stop_reason == "stop"
    assert final.content == [TextContent(text="Hello, world.")]
    assert final.provider == "openai"
    assert final.model == "gpt-4o"
    assert final.error is None
    sent = request_json(route)
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["model"] == "gpt-4o"
    assert route.calls.last.request.headers["authorization"] == f"Bearer {KEY}"


async def test_streamed_answer_in_many_chunks(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    text = "Streaming é accents, emoji 🚀 and\nnewlines arrive piece by piece until the answer is complete."
    pieces = [text[i : i + 3] for i in range(0, len(text), 3)]
    body = ChunkStream(split_every(text_body(*pieces), 7))  # network chunks split lines and UTF-8 sequences
    mock.post(URL).mock(return_value=sse_response(body))
    items = await run(provider, ask())
    final = assert_stream_contract(items)
    assert final.text() == text
    partial_texts = [item.text() for item in items[:-1] if item.content]
    assert len(partial_texts) >= len(pieces)
    for shorter, longer in itertools.pairwise(partial_texts):
        assert longer.startswith(shorter)
    assert partial_texts[0] != text


async def test_two_parallel_tool_calls_with_fragmented_arguments(
    provider: OpenAIProvider, mock: respx.MockRouter
) -> None:
    def frag(index: int, arguments: str, *, call_id: str | None = None, name: str | None = None) -> Any:
        tool: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
        if call_id:
            tool["id"] = call_id
            tool["type"] = "function"
            tool["function"]["name"] = name
        return chunk({"tool_calls": [tool]})

    body = sse_data(
        chunk({"role": "assistant", "content": None}),
        frag(0, "", call_id="call_weather", name="get_weather"),
        frag(0, '{"ci'),
        frag(1, "", call_id="call_time", name="get_time"),
        frag(0, 'ty": "Par'),
        frag(1, '{"tz": "Europe/'),
        frag(0, 'is", "units": ["c", '),
        frag(1, 'Paris", "fmt": "24h"}'),
        frag(0, '"k"], "note": "quote \\" and \\u00e9"}'),
        chunk({}, "tool_calls"),
        usage_chunk(50, 40),
        done=True,
    )
    mock.post(URL).mock(return_value=sse_response(body))
    items = await run(provider, ask("weather and time?", tools=[ToolDeclaration(name="get_weather")]))
    final = assert_stream_contract(items)
    assert final.stop_reason == "toolUse"
    calls = final.tool_calls()
    assert [(c.id, c.name) for c in calls] == [("call_weather", "get_weather"), ("call_time", "get_time")]
    assert calls[0].arguments == {"city": "Paris", "units": ["c", "k"], "note": 'quote " and é'}
    assert calls[1].arguments == {"tz": "Europe/Paris", "fmt": "24h"}
    assert all(c.partial_json is None for c in calls)
    # While streaming, the raw text is kept and arguments hold a best-effort partial parse.
    streaming = [i.tool_calls()[0] for i in items[:-1] if i.tool_calls() and i.tool_calls()[0].partial_json]
    assert any(c.partial_json == '{"city": "Par' and c.arguments == {"city": "Par"} for c in streaming)


async def test_invalid_tool_argument_json_keeps_raw_text(
    provider: OpenAIProvider, mock: respx.MockRouter
) -> None:
    tool = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "run", "arguments": '{"cmd": "ls'},
    }
    body = sse_data(chunk({"tool_calls": [tool]}), chunk({}, "tool_calls"), done=True)
    mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.stop_reason == "toolUse"
    (call,) = final.tool_calls()
    assert call.arguments == {}
    assert call.partial_json == '{"cmd": "ls'


async def test_tool_call_without_arguments(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    tool = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "now", "arguments": ""}}
    body = sse_data(chunk({"tool_calls": [tool]}), chunk({}, "tool_calls"), done=True)
    mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.tool_calls() == [ToolCall(id="call_1", name="now", arguments={})]


async def test_reasoning_deltas_become_thinking(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    body = sse_data(
        chunk({"reasoning_content": "Let me "}),
        chunk({"reasoning_content": "think."}),
        chunk({"reasoning": " More."}),
        chunk({"content": "42"}),
        chunk({}, "stop"),
        done=True,
    )
    mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask(), "qwen3"))
    assert final.content == [ThinkingContent(thinking="Let me think. More."), TextContent(text="42")]


async def test_compatible_server_quirks(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    """No usage, no [DONE], whole tool calls without `index`, and finish_reason "stop" despite calls."""
    body = sse_data(
        chunk({"content": "Checking."}),
        chunk({"tool_calls": [{"id": "a", "function": {"name": "one", "arguments": {"x": 1}}}]}),
        chunk({"tool_calls": [{"id": "b", "function": {"name": "two", "arguments": '{"y": 2}'}}]}),
        chunk({}, "stop"),
    )
    mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask(), "llama-3.1-8b"))
    assert final.stop_reason == "toolUse"
    assert final.text() == "Checking."
    assert [(c.id, c.name, c.arguments) for c in final.tool_calls()] == [
        ("a", "one", {"x": 1}),
        ("b", "two", {"y": 2}),
    ]
    assert final.usage.total_tokens == 0


@pytest.mark.parametrize(
    ("finish", "stop"), [("length", "length"), ("stop", "stop"), ("something_new", "stop")]
)
async def test_finish_reason_mapping(
    provider: OpenAIProvider, mock: respx.MockRouter, finish: str, stop: str
) -> None:
    mock.post(URL).mock(return_value=sse_response(text_body("x", finish=finish)))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.stop_reason == stop


async def test_content_filter_is_an_error(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    mock.post(URL).mock(return_value=sse_response(text_body("x", finish="content_filter")))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.stop_reason == "error"
    assert final.error is not None
    assert not final.error.retryable
    assert "content filter" in final.error.message


# -- request mapping ----------------------------------------------------------------------------------------

PNG = "iVBORw0KGgo="


def conversation() -> list[Any]:
    return [
        UserMessage(
            content=[TextContent(text="Look at this"), ImageContent(data=PNG, mime_type="image/png")]
        ),
        AssistantMessage(
            content=[
                ThinkingContent(thinking="hidden", signature="sig"),
                TextContent(text="Let me check."),
                ToolCall(id="call_a", name="read", arguments={"path": "/a"}),
                ToolCall(id="call_b", name="shot", arguments={}),
            ],
            stop_reason="toolUse",
        ),
        ToolResultMessage(
            tool_call_id="call_a", tool_name="read", content=[TextContent(text="A")], is_error=True
        ),
        ToolResultMessage(
            tool_call_id="call_b", tool_name="shot", content=[ImageContent(data=PNG, mime_type="image/jpeg")]
        ),
        UserMessage(content="and now?"),
    ]


async def test_request_body_mapping(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    route = mock.post(URL).mock(return_value=sse_response(text_body("ok")))
    request = ModelRequest(
        system_prompt="You are terse.",
        messages=conversation(),
        tools=[
            ToolDeclaration(
                name="read",
                description="Read a file",
                parameters={
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                    "required": ["path"],
                },
            )
        ],
        session_id="conv-123",
        reasoning="high",
        max_tokens=1000,
        options={"temperature": 0.2, "extra_body": {"top_k": 5}, "unknown": "ignored"},
    )
    await run(provider, request, "o4-mini")
    body = request_json(route)
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look at this"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path": "/a"}'},
                },
                {"id": "call_b", "type": "function", "function": {"name": "shot", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "A"},
        {"role": "tool", "tool_call_id": "call_b", "content": "(image output follows in the next message)"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Image output of tool shot (call call_b):"},
                {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{PNG}"}},
            ],
        },
        {"role": "user", "content": "and now?"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read",
                "description": "Read a file",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                    "required": ["path"],
                },
            },
        }
    ]
    assert body["prompt_cache_key"] == "conv-123"
    assert "user" not in body
    assert body["reasoning_effort"] == "high"
    assert body["max_completion_tokens"] == 1000
    assert "max_tokens" not in body
    assert body["temperature"] == 0.2
    assert body["top_k"] == 5
    assert "unknown" not in body


async def test_request_body_for_plain_model_and_user_field(mock: respx.MockRouter) -> None:
    provider = OpenAIProvider(api_key=KEY, base_url=BASE, session_id_field="user")
    route = mock.post(URL).mock(return_value=sse_response(text_body("ok")))
    try:
        await run(provider, ask(session_id="s-1", reasoning="high", max_tokens=50), "gpt-4o")
    finally:
        await provider.aclose()
    body = request_json(route)
    assert body["user"] == "s-1"
    assert "prompt_cache_key" not in body
    assert "reasoning_effort" not in body  # not a reasoning model
    assert body["max_tokens"] == 50
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert "tools" not in body


async def test_invalid_arguments_are_sent_back_verbatim(
    provider: OpenAIProvider, mock: respx.MockRouter
) -> None:
    route = mock.post(URL).mock(return_value=sse_response(text_body("ok")))
    bad = ToolCall(id="c" * 60, name="run", arguments={}, partial_json='{"cmd": ')
    request = ModelRequest(
        messages=[
            UserMessage(content="go"),
            AssistantMessage(content=[bad], stop_reason="toolUse"),
            ToolResultMessage(tool_call_id="c" * 60, tool_name="run", content=[], is_error=True),
        ]
    )
    await run(provider, request)
    messages = request_json(route)["messages"]
    call = messages[1]["tool_calls"][0]
    assert call["function"]["arguments"] == '{"cmd": '
    assert len(call["id"]) <= 40
    assert messages[1]["content"] is None
    assert messages[2] == {"role": "tool", "tool_call_id": call["id"], "content": "(no output)"}


# -- usage and cost -----------------------------------------------------------------------------------------


async def test_usage_and_cost(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    body = sse_data(
        chunk({"content": "hi"}), chunk({}, "stop"), usage_chunk(1200, 300, cached=200), done=True
    )
    mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask()))
    assert (final.usage.input, final.usage.cache_read, final.usage.output, final.usage.cache_write) == (
        1000,
        200,
        300,
        0,
    )
    price = provider.model("gpt-4o").price
    assert final.usage.cost == pytest.approx(
        (1000 * price.input + 200 * price.cache_read + 300 * price.output) / 1e6
    )
    assert final.usage.cost > 0


# -- errors -------------------------------------------------------------------------------------------------


def openai_error(
    message: str, type_: str = "invalid_request_error", code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


@pytest.mark.parametrize(
    ("headers", "expected_ms"),
    [({"retry-after": "7"}, 7000), ({"retry-after-ms": "1500", "retry-after": "9"}, 1500), ({}, None)],
)
async def test_429_is_retryable_with_retry_after(
    provider: OpenAIProvider, mock: respx.MockRouter, headers: dict[str, str], expected_ms: int | None
) -> None:
    error = openai_error(
        "Rate limit reached for gpt-4o on tokens per min.", "requests", "rate_limit_exceeded"
    )
    mock.post(URL).mock(return_value=json_response(429, error, headers))
    items = await run(provider, ask())
    final = assert_stream_contract(items)
    assert len(items) == 1
    assert final.stop_reason == "error"
    assert final.error is not None
    assert final.error.retryable
    assert not final.error.overflow
    assert final.error.status == 429
    assert final.error.retry_after_ms == expected_ms
    assert "Rate limit reached" in final.error.message


async def test_insufficient_quota_is_not_retryable(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    error = openai_error("You exceeded your current quota.", "insufficient_quota", "insufficient_quota")
    mock.post(URL).mock(return_value=json_response(429, error))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert not final.error.retryable
    assert "current quota" in final.error.message


@pytest.mark.parametrize("status", [500, 502, 503, 408, 409])
async def test_server_errors_are_retryable(
    provider: OpenAIProvider, mock: respx.MockRouter, status: int
) -> None:
    mock.post(URL).mock(
        return_value=json_response(status, openai_error("The server had an error", "server_error"))
    )
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert final.error.retryable
    assert final.error.status == status
    assert "The server had an error" in final.error.message


async def test_error_without_json_body(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    mock.post(URL).mock(return_value=httpx.Response(502, text="<html>Bad Gateway</html>"))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert final.error.retryable
    assert "Bad Gateway" in final.error.message


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, "Invalid value for 'messages[1].role': 'robot' is not supported."),
        (401, "Incorrect API key provided: sk-abc***. You can find your API key at platform."),
        (404, "The model `gpt-9` does not exist or you do not have access to it."),
    ],
)
async def test_client_errors_are_not_retryable(
    provider: OpenAIProvider, mock: respx.MockRouter, status: int, message: str
) -> None:
    mock.post(URL).mock(return_value=json_response(status, openai_error(message)))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.stop_reason == "error"
    assert final.error is not None
    assert not final.error.retryable
    assert not final.error.overflow
    assert final.error.status == status
    assert message in final.error.message
    assert f"HTTP {status}" in final.error.message


@pytest.mark.parametrize(
    ("status", "payload"),
    [
        (
            400,
            openai_error(
                "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.",
                code="context_length_exceeded",
            ),
        ),
        (  # vLLM
            400,
            {
                "object": "error",
                "message": "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens "
                "(8000 in the messages, 1000 in the completion). Please reduce the length of the messages.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            },
        ),
        (  # llama.cpp server (some versions answer 500)
            500,
            {
                "error": {
                    "code": 500,
                    "message": "the request exceeds the available context size. try increasing the context size",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 1407,
                    "n_ctx": 256,
                }
            },
        ),
        (
            400,
            {"error": {"message": "prompt too long; exceeded max context length by 120 tokens"}},
        ),  # Ollama-style
        (413, {"error": {"message": "Request Entity Too Large"}}),
    ],
)
async def test_context_overflow(
    provider: OpenAIProvider, mock: respx.MockRouter, status: int, payload: Any
) -> None:
    mock.post(URL).mock(return_value=json_response(status, payload))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.stop_reason == "error"
    assert final.error is not None
    assert final.error.overflow
    assert not final.error.retryable


async def test_error_event_mid_stream(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    body = sse_data(
        chunk({"content": "Partial "}),
        {"error": {"message": "The server is overloaded", "type": "server_error"}},
    )
    mock.post(URL).mock(return_value=sse_response(body))
    items = await run(provider, ask())
    final = assert_stream_contract(items)
    assert final.text() == "Partial "
    assert final.error is not None
    assert final.error.retryable
    assert "overloaded" in final.error.message


async def test_json_error_with_status_200(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    payload = {"error": {"code": 400, "message": "the request exceeds the available context size"}}
    mock.post(URL).mock(return_value=json_response(200, payload))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert final.error.overflow
    assert "available context size" in final.error.message


async def test_stream_cut_mid_way_is_retryable(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    body = sse_data(chunk({"content": "Hello"}), chunk({"content": " wor"}))
    mock.post(URL).mock(return_value=sse_response(body))
    items = await run(provider, ask())
    final = assert_stream_contract(items)
    assert final.stop_reason == "error"
    assert final.text() == "Hello wor"
    assert final.error is not None
    assert final.error.retryable
    assert "stream cut" in final.error.message


async def test_connection_reset_mid_stream_is_retryable(
    provider: OpenAIProvider, mock: respx.MockRouter
) -> None:
    body = ChunkStream(
        [sse_data(chunk({"content": "Hel"}))], error=httpx.ReadError("Connection reset by peer")
    )
    mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.text() == "Hel"
    assert final.error is not None
    assert final.error.retryable
    assert "Connection reset by peer" in final.error.message
    assert body.closed


async def test_connect_error_is_retryable(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    mock.post(URL).mock(side_effect=httpx.ConnectError("Connection refused"))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert final.error.retryable
    assert "Connection refused" in final.error.message


async def test_read_timeout_is_retryable(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    body = ChunkStream([sse_data(chunk({"content": "slow"}))], error=httpx.ReadTimeout("timed out"))
    mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert final.error.retryable


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"this is not an event stream\n\n", "malformed SSE line"),
        (b'{"choices": []}\n\n', "malformed SSE line"),
        (b"data: {not json\n\n", "invalid JSON"),
    ],
)
async def test_malformed_stream_fails_clearly_without_hanging(
    provider: OpenAIProvider, mock: respx.MockRouter, line: bytes, expected: str
) -> None:
    # The server keeps the connection open after the bad line: the provider must stop on its own.
    body = ChunkStream([sse_data(chunk({"content": "ok"})), line], hang=True)
    mock.post(URL).mock(return_value=sse_response(body))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.stop_reason == "error"
    assert final.error is not None
    assert not final.error.retryable
    assert expected in final.error.message
    assert body.closed


# -- cancellation -------------------------------------------------------------------------------------------


@pytest.mark.timeout(10)
async def test_closing_the_iterator_closes_the_response(
    provider: OpenAIProvider, mock: respx.MockRouter
) -> None:
    body = ChunkStream([sse_data(chunk({"content": "first"}))], hang=True)
    mock.post(URL).mock(return_value=sse_response(body))
    stream = provider.stream(provider.model("gpt-4o"), ask())
    first = await anext(stream)
    assert first.text() == "first"
    assert not body.closed
    await stream.aclose()  # type: ignore[attr-defined]
    assert body.closed


@pytest.mark.timeout(10)
async def test_cancelling_the_consumer_closes_the_response(
    provider: OpenAIProvider, mock: respx.MockRouter
) -> None:
    body = ChunkStream([sse_data(chunk({"content": "first"}))], hang=True)
    mock.post(URL).mock(return_value=sse_response(body))
    seen: list[str] = []

    async def consume() -> None:
        async for item in provider.stream(provider.model("gpt-4o"), ask()):
            seen.append(item.text())

    task = asyncio.create_task(consume())
    await body.hanging.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["first"]
    assert body.closed


# -- configuration, secrets, models -------------------------------------------------------------------------


async def test_reads_key_and_base_url_from_environment(
    monkeypatch: pytest.MonkeyPatch, mock: respx.MockRouter
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env-987654321")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1/")
    route = mock.post("http://127.0.0.1:8080/v1/chat/completions").mock(
        return_value=sse_response(text_body("ok"))
    )
    provider = OpenAIProvider()
    try:
        assert provider.name == "openai"
        assert provider.base_url == "http://127.0.0.1:8080/v1"
        final = assert_stream_contract(await run(provider, ask()))
    finally:
        await provider.aclose()
    assert final.text() == "ok"
    assert route.calls.last.request.headers["authorization"] == "Bearer sk-from-env-987654321"


async def test_defaults_without_environment(monkeypatch: pytest.MonkeyPatch, mock: respx.MockRouter) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    route = mock.post("https://api.openai.com/v1/chat/completions").mock(
        return_value=sse_response(text_body("ok"))
    )
    provider = OpenAIProvider()
    try:
        await run(provider, ask())
    finally:
        await provider.aclose()
    assert "authorization" not in route.calls.last.request.headers


async def test_api_key_never_shown(
    provider: OpenAIProvider, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    assert KEY not in repr(provider)
    assert KEY not in str(provider)
    mock.post(URL).mock(return_value=json_response(401, openai_error(f"Incorrect API key provided: {KEY}.")))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert "Incorrect API key provided" in final.error.message
    assert KEY not in final.error.message
    assert KEY not in final.model_dump_json()
    assert all(KEY not in record.getMessage() for record in caplog.records)


async def test_aclose_closes_owned_client_only() -> None:
    owned = OpenAIProvider(api_key=KEY, base_url=BASE)
    client = owned._http()
    await owned.aclose()
    assert client.is_closed

    external = httpx.AsyncClient()
    borrowed = OpenAIProvider(api_key=KEY, base_url=BASE, client=external)
    assert borrowed._http() is external
    await borrowed.aclose()
    assert not external.is_closed
    await external.aclose()


async def test_one_client_is_shared_by_requests(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    mock.post(URL).mock(side_effect=lambda request: sse_response(text_body("ok")))
    await run(provider, ask())
    client = provider._http()
    await run(provider, ask())
    assert provider._http() is client


def test_model_table_defaults_and_registration() -> None:
    provider = OpenAIProvider(api_key=KEY)
    assert isinstance(provider, Provider)
    known = provider.model("gpt-4o")
    assert known.provider == "openai"
    assert known.context_window == 128_000
    assert known.price.input > 0
    dated = provider.model("gpt-4o-2024-08-06")
    assert dated.id == "gpt-4o-2024-08-06"
    assert dated.price == known.price
    unknown = provider.model("qwen2.5-coder:7b")
    assert unknown == ModelInfo(provider="openai", id="qwen2.5-coder:7b")
    provider.register_model(
        ModelInfo(provider="x", id="local", context_window=8192, max_tokens=1024, price=ModelPrice(input=1))
    )
    assert provider.model("local").context_window == 8192
    assert provider.model("local").provider == "openai"
    models = Models(provider)
    assert models.get_model(ModelRef.parse("openai:local")) == provider.model("local")


async def test_streams_through_models_registry(mock: respx.MockRouter) -> None:
    provider = OpenAIProvider(api_key=KEY, base_url=BASE, name="local")
    mock.post(URL).mock(return_value=sse_response(text_body("via registry")))
    models = Models(provider)
    try:
        final = assert_stream_contract(await collect(models.stream(ModelRef.parse("local:any-model"), ask())))
    finally:
        await models.aclose()
    assert final.text() == "via registry"
    assert final.provider == "local"
    assert json.loads(mock.calls.last.request.content)["model"] == "any-model"


async def test_large_tool_arguments_in_many_fragments(
    provider: OpenAIProvider, mock: respx.MockRouter
) -> None:
    content = "".join(f"line {i}: some file content\\n" for i in range(3000))
    raw = json.dumps({"path": "/big.txt", "content": content})
    head = {"index": 0, "id": "call_w", "type": "function", "function": {"name": "write", "arguments": ""}}
    fragments = [chunk({"tool_calls": [head]})]
    fragments += [
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": raw[i : i + 13]}}]})
        for i in range(0, len(raw), 13)
    ]
    body = sse_data(*fragments, chunk({}, "tool_calls"), done=True)
    mock.post(URL).mock(return_value=sse_response(ChunkStream(split_every(body, 4096))))
    final = assert_stream_contract(await collect(provider.stream(provider.model("gpt-4o"), ask())))
    (call,) = final.tool_calls()
    assert call.arguments == {"path": "/big.txt", "content": content}
    assert call.partial_json is None


async def test_redirect_is_reported_not_followed(provider: OpenAIProvider, mock: respx.MockRouter) -> None:
    mock.post(URL).mock(return_value=httpx.Response(308, headers={"location": "https://elsewhere.test/v1"}))
    final = assert_stream_contract(await run(provider, ask()))
    assert final.error is not None
    assert not final.error.retryable
    assert final.error.status == 308
    assert "https://elsewhere.test/v1" in final.error.message


@pytest.mark.parametrize(("model_id", "effort"), [("gpt-5-mini", "minimal"), ("o3", "low")])
async def test_minimal_reasoning_effort(
    provider: OpenAIProvider, mock: respx.MockRouter, model_id: str, effort: str
) -> None:
    route = mock.post(URL).mock(return_value=sse_response(text_body("ok")))
    await run(provider, ask(reasoning="minimal"), model_id)
    assert request_json(route)["reasoning_effort"] == effort


async def test_the_request_body_is_let_go_before_the_answer_streams(mock: respx.MockRouter) -> None:
    # The body is a copy of the whole context in small objects; each request in flight held one for the whole
    # answer (issue 12). Sent as the same JSON, it is gone by the first partial.
    import gc
    import weakref

    class Body(dict[str, Any]):
        pass

    bodies: list[weakref.ref[Body]] = []

    class Watched(OpenAIProvider):
        def _prepare(
            self, model: ModelInfo, request: ModelRequest
        ) -> tuple[str, dict[str, str], dict[str, Any]]:
            url, headers, body = super()._prepare(model, request)
            watched = Body(body)
            bodies.append(weakref.ref(watched))
            return url, headers, watched

    provider = Watched(api_key=KEY, base_url=BASE)
    route = mock.post(URL).mock(return_value=sse_response(text_body("Hel", "lo")))
    alive_at_partials: list[bool] = []
    async for item in provider.stream(provider.model("gpt-4o"), ask("the context")):
        gc.collect()
        alive_at_partials.append(bodies[0]() is not None)
        if item.stop_reason is not None:
            assert item.text() == "Hello"
    await provider.aclose()
    assert alive_at_partials and not any(alive_at_partials)
    sent = request_json(route)
    assert sent["messages"] == [{"role": "user", "content": "the context"}]
    assert route.calls.last.request.headers["content-type"] == "application/json"
