"""Anthropic Messages API with streaming.

`AnthropicProvider()` reads `ANTHROPIC_API_KEY` and `ANTHROPIC_BASE_URL` (default `https://api.anthropic.com`);
requests go to `{base_url}/v1/messages` with `x-api-key`, `anthropic-version: 2023-06-01` and `stream: true`.

Request mapping:
- `system_prompt` → top-level `system` (one text block).
- `max_tokens` (required by the API) ← `request.max_tokens`, else the model's `max_tokens`.
- user text/images → `text` blocks and base64 `image` blocks; empty text blocks are dropped (the API rejects
  them).
- assistant → `thinking` blocks with their `signature` (sent back verbatim; thinking without a signature,
  e.g. from another provider, is dropped since the API would reject it), redacted thinking → `redacted_thinking`,
  text → `text`, tool calls → `tool_use` (invalid arguments are sent as `{}`).
- tool results → `tool_result` blocks (text and images, `is_error`) in a user turn; consecutive results, and a
  user message that directly follows them, share one user turn (results first, as the API requires).
- tool call ids are reduced to the `[A-Za-z0-9_-]`, 64-character form the API accepts (deterministically, so
  calls and results from other providers still pair up).
- tools → `{name, description, input_schema}`.
- `session_id` → `metadata.user_id`.
- `reasoning` (not "off") on a model registered with `reasoning=True` → `thinking: {type: "enabled",
  budget_tokens}` with budgets minimal 1024, low 4096, medium 10240, high 32768 tokens (overridable with
  `thinking_budgets=`); `max_tokens` stays the total cap the API applies, the budget is capped at
  `max_tokens - 1024` so the answer keeps room, and thinking is skipped when that leaves less than the API's
  1024-token minimum.
- prompt caching (`prompt_caching=True`, the default): `cache_control: ephemeral` on the system prompt and on
  the last block of the last user turn, so a conversation's prefix is read from the cache on the next turn.
- `options`: `temperature`, `top_p`, `top_k`, `stop_sequences`, `tool_choice` are passed through;
  `extra_body` (a dict) is merged into the body last.

Response mapping: `content_block_start/delta/stop` with `text_delta`, `thinking_delta`, `signature_delta`,
`input_json_delta` (tool arguments: `partial_json` raw text plus a best-effort partial parse while streaming;
invalid final JSON → `arguments={}` with the raw text left in `partial_json`, see `_json.py`);
`redacted_thinking` blocks → `ThinkingContent(thinking="", signature="redacted:" + data)` so they can be sent
back; a `tool_use` id repeated within one response (the API never does this, proxies in front of other models
may) gets a `_2`, `_3` ... suffix, since results are paired with calls by id. `message_start` usage
(`input_tokens`, `cache_read_input_tokens`, `cache_creation_input_tokens`) and `message_delta` usage
(cumulative `output_tokens`, and any updated input counts) → `Usage`; `stop_reason`
`end_turn`/`stop_sequence`/`pause_turn` → stop, `max_tokens`/`model_context_window_exceeded` → length,
`tool_use` → toolUse, `refusal` → a non-retryable error. `ping` is ignored, an `error` event ends the stream
(`overloaded_error`, `api_error`, `rate_limit_error` retryable). The stream is complete at `message_stop` (or at
EOF after a `message_delta` stop reason); an EOF before that is a retryable "stream cut".

Overflow: `prompt is too long`, `input length and max_tokens exceed context limit`, `request_too_large` / 413.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, ClassVar, Literal

import httpx

from harness_core.messages import (
    AssistantMessage,
    ErrorInfo,
    ImageContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from harness_core.models import ModelInfo, ModelRequest, ThinkingLevel

from ._base import EventParser, HTTPProvider, StreamFailure, unique_call_id
from ._errors import Classifier, ProviderError
from ._json import ArgumentText, finish_tool_call
from ._sse import SSEEvent

ANTHROPIC_VERSION = "2023-06-01"
REDACTED_PREFIX = "redacted:"
MIN_THINKING_BUDGET = 1024
MIN_ANSWER_TOKENS = 1024  # room kept for the answer when the thinking budget is capped by max_tokens

DEFAULT_THINKING_BUDGETS: dict[ThinkingLevel, int] = {
    "minimal": 1024,
    "low": 4096,
    "medium": 10240,
    "high": 32768,
}


def _claude(
    context: int, max_tokens: int, reasoning: bool, inp: float, out: float, read: float, write: float
) -> dict[str, Any]:
    return {
        "context_window": context,
        "max_tokens": max_tokens,
        "reasoning": reasoning,
        "price": {"input": inp, "output": out, "cache_read": read, "cache_write": write},
    }


# USD per million tokens; cache_write is the 5-minute cache write price.
ANTHROPIC_MODELS: dict[str, dict[str, Any]] = {
    "claude-opus-4-5": _claude(200_000, 64_000, True, 5.0, 25.0, 0.5, 6.25),
    "claude-opus-4-1": _claude(200_000, 32_000, True, 15.0, 75.0, 1.5, 18.75),
    "claude-opus-4-0": _claude(200_000, 32_000, True, 15.0, 75.0, 1.5, 18.75),
    "claude-sonnet-4-5": _claude(200_000, 64_000, True, 3.0, 15.0, 0.3, 3.75),
    "claude-sonnet-4-0": _claude(200_000, 64_000, True, 3.0, 15.0, 0.3, 3.75),
    "claude-3-7-sonnet-latest": _claude(200_000, 64_000, True, 3.0, 15.0, 0.3, 3.75),
    "claude-haiku-4-5": _claude(200_000, 64_000, True, 1.0, 5.0, 0.1, 1.25),
    "claude-3-5-haiku-latest": _claude(200_000, 8_192, False, 0.8, 4.0, 0.08, 1.0),
}
# Dated snapshot ids resolve through `HTTPProvider.model` (the date suffix is stripped); these are the
# undated aliases those snapshots belong to.
for _alias, _base in {
    "claude-opus-4": "claude-opus-4-0",
    "claude-sonnet-4": "claude-sonnet-4-0",
    "claude-3-7-sonnet": "claude-3-7-sonnet-latest",
    "claude-3-5-haiku": "claude-3-5-haiku-latest",
}.items():
    ANTHROPIC_MODELS.setdefault(_alias, ANTHROPIC_MODELS[_base])

_PASSTHROUGH_OPTIONS = ("temperature", "top_p", "top_k", "stop_sequences", "tool_choice")
_STOP_REASONS: dict[str, Literal["stop", "length", "toolUse"]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "toolUse",
}
_RETRYABLE_ERROR_TYPES = {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
_ID_OK = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _tool_use_id(raw: str) -> str:
    if _ID_OK.match(raw):
        return raw
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", raw)[:40]
    return f"{cleaned}_{hashlib.sha256(raw.encode()).hexdigest()[:16]}"


def _image(image: ImageContent) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": image.mime_type, "data": image.data}}


def _parts(parts: list[TextContent | ImageContent]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, TextContent):
            if part.text:
                blocks.append({"type": "text", "text": part.text})
        else:
            blocks.append(_image(part))
    return blocks


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, ThinkingContent):
            if part.signature and part.signature.startswith(REDACTED_PREFIX):
                blocks.append({"type": "redacted_thinking", "data": part.signature[len(REDACTED_PREFIX) :]})
            elif part.signature:
                blocks.append({"type": "thinking", "thinking": part.thinking, "signature": part.signature})
        elif isinstance(part, TextContent):
            if part.text:
                blocks.append({"type": "text", "text": part.text})
        else:
            arguments = part.arguments if part.partial_json is None else {}
            blocks.append(
                {"type": "tool_use", "id": _tool_use_id(part.id), "name": part.name, "input": arguments}
            )
    return blocks


def convert_messages(request: ModelRequest, *, cache: bool = True) -> list[dict[str, Any]]:
    """The Messages API `messages` array for a request (see the module docstring)."""
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for message in request.messages:
        if isinstance(message, UserMessage):
            if isinstance(message.content, str):
                add("user", [{"type": "text", "text": message.content}] if message.content else [])
            else:
                add("user", _parts(list(message.content)))
        elif isinstance(message, ToolResultMessage):
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": _tool_use_id(message.tool_call_id),
            }
            content = _parts(list(message.content))
            if content:
                result["content"] = content
            if message.is_error:
                result["is_error"] = True
            add("user", [result])
        elif isinstance(message, AssistantMessage):
            add("assistant", _assistant_blocks(message))
    if cache:
        for turn in reversed(turns):
            if turn["role"] == "user":
                turn["content"][-1] = {**turn["content"][-1], "cache_control": {"type": "ephemeral"}}
                break
    return turns


class AnthropicProvider(HTTPProvider):
    """Anthropic Messages API over httpx with SSE streaming. See the module docstring for the mapping."""

    DEFAULT_NAME: ClassVar[str] = "anthropic"
    DEFAULT_BASE_URL: ClassVar[str] = "https://api.anthropic.com"
    API_KEY_ENV: ClassVar[str] = "ANTHROPIC_API_KEY"
    BASE_URL_ENV: ClassVar[str] = "ANTHROPIC_BASE_URL"
    KNOWN_MODELS: ClassVar[dict[str, dict[str, Any]]] = ANTHROPIC_MODELS
    OVERFLOW_CODES: ClassVar[frozenset[str]] = frozenset({"request_too_large"})

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        client: httpx.AsyncClient | None = None,
        models: list[ModelInfo] | None = None,
        timeout: float | httpx.Timeout | None = None,
        headers: dict[str, str] | None = None,
        name: str | None = None,
        prompt_caching: bool = True,
        thinking_budgets: dict[ThinkingLevel, int] | None = None,
    ) -> None:
        super().__init__(
            api_key, base_url, client=client, models=models, timeout=timeout, headers=headers, name=name
        )
        self.prompt_caching = prompt_caching
        self.thinking_budgets = {**DEFAULT_THINKING_BUDGETS, **(thinking_budgets or {})}

    def build_body(self, model: ModelInfo, request: ModelRequest) -> dict[str, Any]:
        max_tokens = request.max_tokens if request.max_tokens is not None else model.max_tokens
        body: dict[str, Any] = {
            "model": model.id,
            "max_tokens": max_tokens,
            "stream": True,
            "messages": convert_messages(request, cache=self.prompt_caching),
        }
        if request.system_prompt:
            system: dict[str, Any] = {"type": "text", "text": request.system_prompt}
            if self.prompt_caching:
                system["cache_control"] = {"type": "ephemeral"}
            body["system"] = [system]
        if request.tools:
            body["tools"] = [
                {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
                for tool in request.tools
            ]
        if request.session_id:
            body["metadata"] = {"user_id": request.session_id}
        if model.reasoning and request.reasoning != "off":
            wanted = self.thinking_budgets.get(request.reasoning, MIN_THINKING_BUDGET)
            budget = min(wanted, max_tokens - MIN_ANSWER_TOKENS)
            if budget >= MIN_THINKING_BUDGET:
                body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        for key in _PASSTHROUGH_OPTIONS:
            if key in request.options:
                body[key] = request.options[key]
        extra = request.options.get("extra_body")
        if isinstance(extra, dict):
            body.update(extra)
        return body

    def _prepare(self, model: ModelInfo, request: ModelRequest) -> tuple[str, dict[str, str], dict[str, Any]]:
        headers = {"Accept": "text/event-stream", "anthropic-version": ANTHROPIC_VERSION}
        key = self._api_key()
        if key:
            headers["x-api-key"] = key
        return f"{self.base_url}/v1/messages", headers, self.build_body(model, request)

    def _parser(self, message: AssistantMessage, model: ModelInfo) -> EventParser:
        return _MessagesParser(message, self._classifier)


class _MessagesParser(EventParser):
    def __init__(self, message: AssistantMessage, classifier: Classifier) -> None:
        super().__init__(message, classifier)
        self._blocks: dict[int, TextContent | ThinkingContent | ToolCall] = {}
        self._args: dict[int, ArgumentText] = {}
        self._stop_reason: str | None = None

    def feed(self, event: SSEEvent) -> bool:
        data = event.json()
        if not isinstance(data, dict):
            return False
        kind = data.get("type") or event.event
        if kind == "content_block_delta":
            return self._delta(int(data["index"]), data.get("delta") or {})
        if kind == "content_block_start":
            return self._start(int(data["index"]), data.get("content_block") or {})
        if kind == "content_block_stop":
            index = int(data["index"])
            block = self._blocks.get(index)
            if isinstance(block, ToolCall):
                finish_tool_call(block, self._raw(index))
                return True
            return False
        if kind == "message_start":
            usage = (data.get("message") or {}).get("usage")
            if isinstance(usage, dict):
                self._usage(usage)
            return False
        if kind == "message_delta":
            delta = data.get("delta") or {}
            if isinstance(delta.get("stop_reason"), str):
                self._stop_reason = delta["stop_reason"]
            usage = data.get("usage")
            if isinstance(usage, dict):
                self._usage(usage)
                return True
            return False
        if kind == "message_stop":
            self.done = True
            return False
        if kind == "error":
            raw = data.get("error")
            details: dict[str, Any] = raw if isinstance(raw, dict) else {}
            error = ProviderError(str(details.get("message") or "unknown error"), details.get("type"), None)
            raise StreamFailure(
                self.classifier.event_error(
                    error, status=_ERROR_STATUS.get(error.type or ""), retryable_types=_RETRYABLE_ERROR_TYPES
                )
            )
        return False  # ping and event types added later

    def _start(self, index: int, block: dict[str, Any]) -> bool:
        kind = block.get("type")
        part: TextContent | ThinkingContent | ToolCall
        if kind == "text":
            part = TextContent(text=block.get("text") or "")
        elif kind == "thinking":
            part = ThinkingContent(
                thinking=block.get("thinking") or "", signature=block.get("signature") or None
            )
        elif kind == "redacted_thinking":
            part = ThinkingContent(thinking="", signature=REDACTED_PREFIX + str(block.get("data") or ""))
        elif kind == "tool_use":
            initial = block.get("input")
            part = ToolCall(
                id=unique_call_id(self.message, str(block.get("id") or f"toolu_{index}")),
                name=str(block.get("name") or ""),
                arguments=initial if isinstance(initial, dict) else {},
                partial_json="",
            )
            # A non-empty `input` here is the whole input (no deltas follow), as sent by some proxies.
            self._args[index] = ArgumentText(
                json.dumps(initial) if isinstance(initial, dict) and initial else ""
            )
        else:
            return False  # server tool blocks and future block types are not part of the message model
        self._blocks[index] = part
        self.message.content.append(part)
        return True

    def _delta(self, index: int, delta: dict[str, Any]) -> bool:
        block = self._blocks.get(index)
        kind = delta.get("type")
        if kind == "text_delta" and isinstance(block, TextContent):
            block.text += str(delta.get("text") or "")
        elif kind == "thinking_delta" and isinstance(block, ThinkingContent):
            block.thinking += str(delta.get("thinking") or "")
        elif kind == "signature_delta" and isinstance(block, ThinkingContent):
            block.signature = (block.signature or "") + str(delta.get("signature") or "")
        elif kind == "input_json_delta" and isinstance(block, ToolCall):
            text = self._args.setdefault(index, ArgumentText())
            text.append(str(delta.get("partial_json") or ""))
            text.apply(block)
        else:
            return False
        return True

    def _raw(self, index: int) -> str:
        text = self._args.get(index)
        return text.raw if text is not None else ""

    def _usage(self, usage: dict[str, Any]) -> None:
        target = self.message.usage
        if usage.get("input_tokens") is not None:
            target.input = int(usage["input_tokens"])
        if usage.get("output_tokens") is not None:
            target.output = int(usage["output_tokens"])
        if usage.get("cache_read_input_tokens") is not None:
            target.cache_read = int(usage["cache_read_input_tokens"])
        if usage.get("cache_creation_input_tokens") is not None:
            target.cache_write = int(usage["cache_creation_input_tokens"])

    def finish(self) -> ErrorInfo | None:
        for index, block in self._blocks.items():
            if isinstance(block, ToolCall) and block.partial_json is not None:
                finish_tool_call(block, self._raw(index))
        if not self.done and self._stop_reason is None:
            return self.classifier.stream_cut()
        reason = self._stop_reason or "end_turn"
        if reason == "refusal":
            return self.classifier.plain("the model refused to answer (stop_reason refusal)")
        stop = _STOP_REASONS.get(reason, "stop")
        if stop == "stop" and self.message.tool_calls():
            stop = "toolUse"
        self.message.stop_reason = stop
        return None
