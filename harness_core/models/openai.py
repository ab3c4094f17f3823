"""OpenAI Chat Completions (and compatible servers: vLLM, llama.cpp server, Ollama, LM Studio, ...).

`OpenAIProvider()` reads `OPENAI_API_KEY` and `OPENAI_BASE_URL` (default `https://api.openai.com/v1`); the
request goes to `{base_url}/chat/completions` with `stream: true` and `stream_options.include_usage`. Without
a key no `Authorization` header is sent (local servers rarely need one).

Request mapping:
- `system_prompt` → the first message, role `system` (OpenAI maps it to `developer` for reasoning models).
- user text → a string; user images → `image_url` parts with `data:` URLs.
- assistant text → `content`; tool calls → `tool_calls` (`arguments` re-serialized; a call whose arguments
  were invalid is sent back with its raw text); thinking is not sent (Chat Completions takes none back).
- tool results → `role: "tool"` messages (text only; an empty result is sent as "(no output)"; `is_error` has
  no field here, the tool layer's error text goes as is). Images from a run of consecutive tool results follow
  in one `user` message, after the last `tool` message, since `tool` messages cannot carry images.
- tools → `{"type": "function", "function": {name, description, parameters}}`.
- `session_id` → `prompt_cache_key` by default: OpenAI routes requests with the same key to the same prompt
  cache, which is what a conversation's growing prefix wants, and it is the documented successor of the
  deprecated `user` field. Compatible servers ignore unknown fields. `session_id_field="user"` sends `user`
  instead, `None` sends nothing.
- `reasoning` (not "off") → `reasoning_effort` for models registered with `reasoning=True` ("minimal" becomes
  "low" outside the gpt-5 family, which alone accepts it; "off" sends nothing, leaving the server default).
  Those models also get `max_completion_tokens` instead of `max_tokens`. Either is only sent when the request
  sets `max_tokens`, so a compatible server with a small context never sees an impossible default.
- `options`: `temperature`, `top_p`, `stop`, `seed`, `frequency_penalty`, `presence_penalty`,
  `parallel_tool_calls`, `tool_choice` are passed through; `extra_body` (a dict) is merged into the body last.

Response mapping: `delta.content` → text; `delta.reasoning_content` / `delta.reasoning` (vLLM, llama.cpp,
Ollama, OpenRouter, DeepSeek) → thinking; `delta.tool_calls` fragments are assembled per `index` (several calls
in parallel; `partial_json` carries the raw text and `arguments` a best-effort partial parse while streaming).
Servers that stray from that shape are assembled too: at an index already in use, a fragment with a new `id`
and a function name, after the current call's arguments are complete, starts a new call (Ollama sends every
parallel call with index 0), while a new id without a name continues the call (some servers change the id after
the first fragment); an id that arrives after a call's first fragment is adopted; fragments without `index` are
matched by `id` (or continue the call being streamed when they carry neither id nor name); an id repeated within
one response gets a `_2`, `_3` ... suffix, since results are paired with calls by id. Invalid final argument
JSON → `arguments={}` with the raw text left in `partial_json` (see `_json.py`).
`finish_reason` `stop` → stop, `length` → length, `tool_calls`/`function_call` (or any finish with calls) →
toolUse, `content_filter` → a non-retryable error. Usage: `prompt_tokens` minus cached →
`input`, `prompt_tokens_details.cached_tokens` (or DeepSeek's `prompt_cache_hit_tokens`) → `cache_read`,
`completion_tokens` → `output`. The stream is complete at `data: [DONE]` (or at EOF after a finish reason,
for servers that omit `[DONE]`); an EOF before that is a retryable "stream cut".

Overflow: code `context_length_exceeded`, llama.cpp's `exceed_context_size_error`, status 413, and the usual
wording of compatible servers (see `_errors.py`).
"""

from __future__ import annotations

import hashlib
import json
import uuid
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
from harness_core.models import ModelInfo, ModelRequest

from ._base import EventParser, HTTPProvider, StreamFailure, unique_call_id
from ._errors import Classifier, parse_error_payload
from ._json import ArgumentText, finish_tool_call
from ._sse import SSEEvent

SessionField = Literal["prompt_cache_key", "user"]

# USD per million tokens; cache_read is the cached-input price.
OPENAI_MODELS: dict[str, dict[str, Any]] = {
    "gpt-4o": {
        "context_window": 128_000,
        "max_tokens": 16_384,
        "price": {"input": 2.5, "output": 10.0, "cache_read": 1.25},
    },
    "gpt-4o-mini": {
        "context_window": 128_000,
        "max_tokens": 16_384,
        "price": {"input": 0.15, "output": 0.6, "cache_read": 0.075},
    },
    "gpt-4.1": {
        "context_window": 1_047_576,
        "max_tokens": 32_768,
        "price": {"input": 2.0, "output": 8.0, "cache_read": 0.5},
    },
    "gpt-4.1-mini": {
        "context_window": 1_047_576,
        "max_tokens": 32_768,
        "price": {"input": 0.4, "output": 1.6, "cache_read": 0.1},
    },
    "gpt-4.1-nano": {
        "context_window": 1_047_576,
        "max_tokens": 32_768,
        "price": {"input": 0.1, "output": 0.4, "cache_read": 0.025},
    },
    "o3": {
        "context_window": 200_000,
        "max_tokens": 100_000,
        "reasoning": True,
        "price": {"input": 2.0, "output": 8.0, "cache_read": 0.5},
    },
    "o4-mini": {
        "context_window": 200_000,
        "max_tokens": 100_000,
        "reasoning": True,
        "price": {"input": 1.1, "output": 4.4, "cache_read": 0.275},
    },
    "gpt-5": {
        "context_window": 400_000,
        "max_tokens": 128_000,
        "reasoning": True,
        "price": {"input": 1.25, "output": 10.0, "cache_read": 0.125},
    },
    "gpt-5-mini": {
        "context_window": 400_000,
        "max_tokens": 128_000,
        "reasoning": True,
        "price": {"input": 0.25, "output": 2.0, "cache_read": 0.025},
    },
    "gpt-5-nano": {
        "context_window": 400_000,
        "max_tokens": 128_000,
        "reasoning": True,
        "price": {"input": 0.05, "output": 0.4, "cache_read": 0.005},
    },
}

_PASSTHROUGH_OPTIONS = (
    "temperature",
    "top_p",
    "stop",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "parallel_tool_calls",
    "tool_choice",
)
_FINISH_REASONS: dict[str, Literal["stop", "length", "toolUse"]] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "toolUse",
    "function_call": "toolUse",
}
_MAX_TOOL_CALL_ID = 40


def _tool_call_id(raw: str) -> str:
    """OpenAI rejects tool call ids longer than 40 characters; shorten longer ones (from other providers)
    deterministically so a call and its result still match."""
    if len(raw) <= _MAX_TOOL_CALL_ID:
        return raw
    return "call_" + hashlib.sha256(raw.encode()).hexdigest()[:32]


def _data_url(image: ImageContent) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:{image.mime_type};base64,{image.data}"}}


def _user_content(message: UserMessage) -> str | list[dict[str, Any]]:
    if isinstance(message.content, str):
        return message.content
    if not any(isinstance(part, ImageContent) for part in message.content):
        return "".join(part.text for part in message.content if isinstance(part, TextContent))
    parts: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, TextContent):
            parts.append({"type": "text", "text": part.text})
        else:
            parts.append(_data_url(part))
    return parts


def _assistant_message(message: AssistantMessage) -> dict[str, Any] | None:
    text = "".join(part.text for part in message.content if isinstance(part, TextContent))
    calls = []
    for call in message.tool_calls():
        arguments = call.partial_json if call.partial_json is not None else json.dumps(call.arguments)
        calls.append(
            {
                "id": _tool_call_id(call.id),
                "type": "function",
                "function": {"name": call.name, "arguments": arguments},
            }
        )
    if not text and not calls:
        return None
    out: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        out["tool_calls"] = calls
    return out


def convert_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The Chat Completions `messages` array for a request (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if request.system_prompt:
        out.append({"role": "system", "content": request.system_prompt})
    pending_images: list[dict[str, Any]] = []

    def flush_images() -> None:
        if pending_images:
            out.append({"role": "user", "content": list(pending_images)})
            pending_images.clear()

    for message in request.messages:
        if isinstance(message, ToolResultMessage):
            text = message.text()
            images = [part for part in message.content if isinstance(part, ImageContent)]
            if images:
                pending_images.append(
                    {
                        "type": "text",
                        "text": f"Image output of tool {message.tool_name} (call {message.tool_call_id}):",
                    }
                )
                pending_images.extend(_data_url(image) for image in images)
                if not text:
                    text = "(image output follows in the next message)"
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": _tool_call_id(message.tool_call_id),
                    "content": text or "(no output)",
                }
            )
            continue
        flush_images()
        if isinstance(message, UserMessage):
            out.append({"role": "user", "content": _user_content(message)})
        elif isinstance(message, AssistantMessage):
            converted = _assistant_message(message)
            if converted is not None:
                out.append(converted)
        # System patches (`core.system`) are folded into `system_prompt` by the harness; none belong here.
    flush_images()
    return out


class OpenAIProvider(HTTPProvider):
    """OpenAI Chat Completions over httpx with SSE streaming. See the module docstring for the mapping."""

    DEFAULT_NAME: ClassVar[str] = "openai"
    DEFAULT_BASE_URL: ClassVar[str] = "https://api.openai.com/v1"
    API_KEY_ENV: ClassVar[str] = "OPENAI_API_KEY"
    BASE_URL_ENV: ClassVar[str] = "OPENAI_BASE_URL"
    KNOWN_MODELS: ClassVar[dict[str, dict[str, Any]]] = OPENAI_MODELS
    OVERFLOW_CODES: ClassVar[frozenset[str]] = frozenset(
        {"context_length_exceeded", "exceed_context_size_error"}
    )

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
        session_id_field: SessionField | None = "prompt_cache_key",
    ) -> None:
        super().__init__(
            api_key, base_url, client=client, models=models, timeout=timeout, headers=headers, name=name
        )
        self.session_id_field = session_id_field

    def build_body(self, model: ModelInfo, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model.id,
            "messages": convert_messages(request),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in request.tools
            ]
        if request.max_tokens is not None:
            body["max_completion_tokens" if model.reasoning else "max_tokens"] = request.max_tokens
        if model.reasoning and request.reasoning != "off":
            effort = request.reasoning
            if effort == "minimal" and not model.id.startswith("gpt-5"):
                effort = "low"  # only the gpt-5 family accepts "minimal"
            body["reasoning_effort"] = effort
        if request.session_id and self.session_id_field is not None:
            body[self.session_id_field] = request.session_id
        for key in _PASSTHROUGH_OPTIONS:
            if key in request.options:
                body[key] = request.options[key]
        extra = request.options.get("extra_body")
        if isinstance(extra, dict):
            body.update(extra)
        return body

    def _prepare(self, model: ModelInfo, request: ModelRequest) -> tuple[str, dict[str, str], dict[str, Any]]:
        headers = {"Accept": "text/event-stream"}
        key = self._api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return f"{self.base_url}/chat/completions", headers, self.build_body(model, request)

    def _parser(self, message: AssistantMessage, model: ModelInfo) -> EventParser:
        return _ChatParser(message, self._classifier)


def _complete(raw: str) -> bool:
    """Whether argument text is finished: empty, or a whole JSON value."""
    if not raw.strip():
        return True
    try:
        json.loads(raw)
    except (ValueError, RecursionError):  # nested past the parser's depth: not a finished value either
        return False
    return True


class _ChatParser(EventParser):
    def __init__(self, message: AssistantMessage, classifier: Classifier) -> None:
        super().__init__(message, classifier)
        self._calls: dict[Any, ToolCall] = {}
        self._args: dict[int, ArgumentText] = {}  # id(ToolCall) -> its argument text
        self._server_ids: dict[int, str | None] = {}  # id(ToolCall) -> the id the server gave it
        self._last: ToolCall | None = None
        self._finish_reason: str | None = None

    # -- content helpers ---------------------------------------------------------------------------------

    def _append_text(self, text: str) -> None:
        content = self.message.content
        if content and isinstance(content[-1], TextContent):
            content[-1].text += text
        else:
            content.append(TextContent(text=text))

    def _append_thinking(self, text: str) -> None:
        content = self.message.content
        if content and isinstance(content[-1], ThinkingContent):
            content[-1].thinking += text
        else:
            content.append(ThinkingContent(thinking=text))

    def _tool_fragment(self, position: int, fragment: dict[str, Any]) -> None:
        index = fragment.get("index")
        raw_id = fragment.get("id")
        call_id = raw_id if isinstance(raw_id, str) and raw_id else None
        function = fragment.get("function") or {}
        raw_name = function.get("name")
        name = raw_name if isinstance(raw_name, str) and raw_name else None
        key: Any
        call: ToolCall | None
        if isinstance(index, int):
            key = index
            call = self._calls.get(key)
            if call is not None and call_id is not None:
                known = self._server_ids.get(id(call))
                if known is None:  # the id came after the call's first fragment: adopt it
                    self._server_ids[id(call)] = call_id
                    call.id = unique_call_id(self.message, call_id, exclude=call)
                elif known != call_id and name is not None and _complete(self._args[id(call)].raw):
                    # Ollama (and proxies in front of Gemini or the Responses API) stream every parallel call
                    # with index 0: a fragment that starts a call (new id and a name) after the previous call's
                    # arguments are complete is a new call. A new id without a name is not: some servers
                    # (Poolside) give a call's later fragments another id.
                    call = None
        elif call_id is not None:
            key = ("id", call_id)
            call = self._calls.get(key)
        else:
            key = ("pos", len(self._calls), position)
            # No index and no id: a fragment that names no function continues the call being streamed.
            call = self._last if name is None else None
        if call is None:
            call = ToolCall(
                id=unique_call_id(self.message, call_id or f"call_{uuid.uuid4().hex[:24]}"),
                name=name or "",
                partial_json="",
            )
            self._calls[key] = call  # later fragments of this index belong to the newest call
            self._server_ids[id(call)] = call_id
            self._args[id(call)] = ArgumentText()
            self.message.content.append(call)
        elif name and not call.name:
            call.name = name
        self._last = call
        arguments = function.get("arguments")
        if arguments is not None:
            if not isinstance(arguments, str):  # some servers send the object itself
                arguments = json.dumps(arguments)
            text = self._args[id(call)]
            text.append(arguments)
            text.apply(call)

    # -- events ------------------------------------------------------------------------------------------

    def feed(self, event: SSEEvent) -> bool:
        if event.data.strip() == "[DONE]":
            self.done = True
            return False
        chunk = event.json()
        if not isinstance(chunk, dict):
            return False
        error = parse_error_payload(chunk) if "error" in chunk or chunk.get("object") == "error" else None
        if error is not None:
            status = int(error.code) if error.code is not None and error.code.isdigit() else None
            raise StreamFailure(
                self.classifier.event_error(error, status=status, retryable_types={"server_error"})
            )
        changed = False
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage(usage)
            changed = True
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                self._append_thinking(reasoning)
                changed = True
            content = delta.get("content")
            if isinstance(content, str) and content:
                self._append_text(content)
                changed = True
            for position, fragment in enumerate(delta.get("tool_calls") or []):
                if isinstance(fragment, dict):
                    self._tool_fragment(position, fragment)
                    changed = True
            finish = choice.get("finish_reason")
            if isinstance(finish, str) and finish:
                self._finish_reason = finish
        return changed

    def _usage(self, usage: dict[str, Any]) -> None:
        prompt = int(usage.get("prompt_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens") or usage.get("prompt_cache_hit_tokens") or 0)
        target = self.message.usage
        target.input = max(0, prompt - cached)
        target.cache_read = cached
        target.output = int(usage.get("completion_tokens") or 0)

    def finish(self) -> ErrorInfo | None:
        for call in self.message.tool_calls():
            text = self._args.get(id(call))
            finish_tool_call(call, text.raw if text is not None else "")
        if not self.done and self._finish_reason is None:
            return self.classifier.stream_cut()
        reason = self._finish_reason or "stop"
        if reason == "content_filter":
            return self.classifier.plain("the response was stopped by the provider's content filter")
        stop = _FINISH_REASONS.get(reason, "stop")
        if self.message.tool_calls() and stop == "stop":
            stop = "toolUse"
        self.message.stop_reason = stop
        return None
