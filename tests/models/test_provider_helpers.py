"""Unit tests of the provider helpers: SSE parsing, partial tool-argument JSON, error classification."""

from __future__ import annotations

import email.utils
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from harness_core.messages import ToolCall
from harness_core.models._errors import (
    Classifier,
    looks_like_overflow,
    parse_error_body,
    parse_retry_after,
    redact,
)
from harness_core.models._json import ArgumentText, argument_problem, finish_tool_call, parse_partial_json
from harness_core.models._sse import SSEEvent, SSEFormatError, iter_sse


async def lines_of(*lines: str) -> AsyncIterator[str]:
    for line in lines:
        yield line


async def parse(*lines: str) -> list[SSEEvent]:
    return [event async for event in iter_sse(lines_of(*lines))]


# -- SSE ----------------------------------------------------------------------------------------------------


async def test_sse_events_comments_and_multiline_data() -> None:
    events = await parse(
        ": keep-alive comment",
        "event: message_start",
        'data: {"a": 1}',
        "",
        "data: first line",
        "data:second line",
        "id: 7",
        "retry: 1000",
        "",
        "",
        "data: [DONE]",
        "",
    )
    assert events == [
        SSEEvent("message_start", '{"a": 1}'),
        SSEEvent("message", "first line\nsecond line"),
        SSEEvent("message", "[DONE]"),
    ]
    assert events[0].json() == {"a": 1}


async def test_sse_tolerates_crlf_and_a_missing_final_blank_line() -> None:
    assert await parse("data: x\r", "\r", "data: y") == [SSEEvent("message", "x"), SSEEvent("message", "y")]


async def test_sse_event_without_data_is_not_dispatched() -> None:
    assert await parse("event: lonely", "", ": only a comment", "") == []


@pytest.mark.parametrize("line", ["garbage", '{"choices": []}', "<!DOCTYPE html>", "dta: typo"])
async def test_sse_malformed_line_raises(line: str) -> None:
    with pytest.raises(SSEFormatError, match="malformed SSE line"):
        await parse("data: ok", "", line)


def test_sse_invalid_json_raises() -> None:
    with pytest.raises(SSEFormatError, match="invalid JSON in stream event"):
        SSEEvent("message", "{nope").json()


# -- partial JSON -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("", {}),
        ("{", {}),
        ('{"pa', {}),
        ('{"path"', {}),
        ('{"path":', {}),
        ('{"path": "/tm', {"path": "/tm"}),
        ('{"path": "/tmp", "n": 1', {"path": "/tmp", "n": 1}),
        ('{"path": "/tmp", "fl', {"path": "/tmp"}),
        ('{"a": [1, 2, {"b": "c', {"a": [1, 2, {"b": "c"}]}),
        ('{"a": "x\\', {"a": "x"}),
        ('{"a": "brace } inside', {"a": "brace } inside"}),
        ('{"ok": tr', {}),
        ('{"a": 1, "ok": tr', {"a": 1}),
        ('{"a": 1}', {"a": 1}),
        ("[1, 2", {}),
    ],
)
def test_parse_partial_json(prefix: str, expected: dict[str, object]) -> None:
    assert parse_partial_json(prefix) == expected


@pytest.mark.parametrize(
    ("raw", "arguments", "partial"),
    [
        ('{"x": 1}', {"x": 1}, None),
        ("", {}, None),
        ("   ", {}, None),
        ('{"x": ', {}, '{"x": '),
        ("[1, 2]", {}, "[1, 2]"),
        ("not json", {}, "not json"),
    ],
)
def test_finish_tool_call(raw: str, arguments: dict[str, object], partial: str | None) -> None:
    call = ToolCall(id="c", name="t", partial_json=raw)
    finish_tool_call(call, raw)
    assert (call.arguments, call.partial_json) == (arguments, partial)


# -- retry-after, overflow, error bodies --------------------------------------------------------------------


def test_retry_after_forms() -> None:
    now = 1_700_000_000.0
    in_30s = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(httpx.Headers({"retry-after": "3"}), now) == 3000
    assert parse_retry_after(httpx.Headers({"retry-after": "1.25"}), now) == 1250
    assert parse_retry_after(httpx.Headers({"retry-after": in_30s}), now) == 30_000
    assert parse_retry_after(httpx.Headers({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}), now) == 0
    assert parse_retry_after(httpx.Headers({"Retry-After-Ms": "20.5", "retry-after": "3"}), now) == 21
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "soon", "retry-after": "2"}), now) == 2000
    assert parse_retry_after(httpx.Headers({"retry-after": "whenever"}), now) is None
    assert parse_retry_after(httpx.Headers({"retry-after": "-5"}), now) is None
    assert parse_retry_after(httpx.Headers({}), now) is None


@pytest.mark.parametrize(
    "text",
    [
        "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens",
        "the request exceeds the available context size. try increasing the context size",
        "prompt is too long: 210000 tokens > 200000 maximum",
        "input length and `max_tokens` exceed context limit: 1 + 2 > 3",
        "The decoder prompt (length 5000) is longer than the maximum model length of 4096.",
        "Context size has been exceeded.",
        "Prompt contains 40000 tokens, too large for model with 32768 maximum context length",
        "This model's maximum prompt length is 131072 but the request contains 140000 tokens.",
        "too many tokens in the request",
        "Error: context_length_exceeded",
    ],
)
def test_overflow_wording(text: str) -> None:
    assert looks_like_overflow(text)


@pytest.mark.parametrize(
    "text",
    [
        "Rate limit reached for requests",
        "Invalid API key",
        "Overloaded",
        "model not found",
        "You exceeded your quota",
    ],
)
def test_not_overflow_wording(text: str) -> None:
    assert not looks_like_overflow(text)


def test_overflow_is_never_inferred_from_429() -> None:
    info = Classifier("p").http_error(
        429, httpx.Headers({}), '{"error": {"message": "too many tokens per minute"}}'
    )
    assert info.retryable
    assert not info.overflow


def test_error_body_shapes() -> None:
    assert parse_error_body('{"error": {"message": "m", "type": "t", "code": "c"}}').message == "m"
    assert parse_error_body('{"error": "plain"}').message == "plain"
    assert parse_error_body('{"object": "error", "message": "vllm", "code": 400}').code == "400"
    assert parse_error_body('{"detail": "fastapi"}').message == "fastapi"
    assert parse_error_body("").message == "(empty response body)"
    assert parse_error_body("<html>x</html>").message == "<html>x</html>"


def test_redact_and_classifier_masks_secrets() -> None:
    assert redact("key sk-123456 leaked", ["sk-123456", None, ""]) == "key *** leaked"
    info = Classifier("p", secrets=["sk-123456"]).http_error(401, httpx.Headers({}), "bad key sk-123456")
    assert "sk-123456" not in info.message
    assert info.message.startswith("p: HTTP 401")


def test_transport_error_classification() -> None:
    classifier = Classifier("p")
    assert classifier.transport_error(httpx.ConnectTimeout("slow"), mid_stream=False).retryable
    assert classifier.transport_error(httpx.WriteError("broken pipe"), mid_stream=False).retryable
    assert classifier.transport_error(httpx.RemoteProtocolError("closed"), mid_stream=True).retryable
    assert not classifier.transport_error(httpx.UnsupportedProtocol("ftp://"), mid_stream=False).retryable


def test_streaming_arguments_parse_count_stays_small(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness_core.models import _json

    calls = 0
    real = _json.parse_partial_json

    def counting(text: str) -> dict[str, object]:
        nonlocal calls
        calls += 1
        return real(text)

    monkeypatch.setattr(_json, "parse_partial_json", counting)
    call = ToolCall(id="c", name="write")
    text = _json.ArgumentText()
    fragments = ['{"path": "/f", "content": "'] + ["twenty chars of text"] * 5000 + ['"}']
    for fragment in fragments:
        text.append(fragment)
        text.apply(call)
    assert calls < 120  # every fragment while small, then only after 25 % growth
    assert call.partial_json == "".join(fragments)
    assert call.arguments["path"] == "/f"
    assert len(call.arguments["content"]) >= 0.75 * 5000 * 20  # the partial view lags by at most a quarter
    finish_tool_call(call, text.raw)
    assert call.arguments == {"path": "/f", "content": "twenty chars of text" * 5000}
    assert call.partial_json is None


# -- model output is text from outside: tool arguments are parsed strictly and made valid -----------------------


@pytest.mark.parametrize(
    ("raw", "arguments"),
    [
        ('{"q": "broken \\ud83d emoji"}', {"q": "broken \ufffd emoji"}),  # the escape
        ('{"q": "broken \ud83d emoji"}', {"q": "broken \ufffd emoji"}),  # the character itself
        ('{"\\udc00": 1}', {"\ufffd": 1}),  # a key
        ('{"q": "\\ud83d\\ude00"}', {"q": "\U0001f600"}),  # a pair stays one character
        ('{"q": "\ud83d' + '\ude00"}', {"q": "\U0001f600"}),  # a pair that arrived as two halves
        ('{"n": 9223372036854775807, "z": -0.0}', {"n": 2**63 - 1, "z": -0.0}),
    ],
)
def test_final_arguments_are_made_valid(raw: str, arguments: dict[str, object]) -> None:
    call = ToolCall(id="c", name="t")
    finish_tool_call(call, raw)
    assert call.arguments == arguments and call.partial_json is None
    json.dumps(call.arguments, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ('{"x": NaN}', "NaN is not JSON"),
        ('{"x": -Infinity}', "-Infinity is not JSON"),
        ('{"x": 1e400}', "arguments.x: inf is not JSON"),
        ('{"x": 18446744073709551616}', "arguments.x: int 18446744073709551616 is outside the 64-bit range"),
        ('{"x": ' + "[" * 200 + "]" * 200 + "}", "nesting deeper than 128 levels"),
        ('{"x": ' + "[" * 5000 + "]" * 5000 + "}", "nesting deeper than 128 levels"),
        ("[1, 2]", "not a JSON object but list"),
        ('{"x": ', "not valid JSON"),
    ],
)
def test_final_arguments_that_are_not_strict_make_an_invalid_call_with_a_reason(
    raw: str, problem: str
) -> None:
    call = ToolCall(id="c", name="t")
    finish_tool_call(call, raw)
    assert call.arguments == {} and call.partial_json == raw
    assert problem in argument_problem(raw)


def test_streaming_argument_text_with_surrogates_is_shown_valid() -> None:
    text = ArgumentText()
    call = ToolCall(id="c", name="t", partial_json="")
    for fragment in ['{"q": "a', "\ud83d", "\ude00 b \udc00", '"}']:
        text.append(fragment)
        text.apply(call)
        assert call.partial_json is not None
        call.partial_json.encode("utf-8")
        json.dumps(call.arguments, ensure_ascii=False).encode("utf-8")
    assert call.partial_json == '{"q": "a\U0001f600 b \ufffd"}'
    assert call.arguments == {"q": "a\U0001f600 b \ufffd"}
    assert parse_partial_json('{"q": "x\\ud83d') == {"q": "x\ufffd"}
