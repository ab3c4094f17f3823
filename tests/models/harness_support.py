"""Support for running the HTTP providers through the harness: one `Dialect` per provider (wire shapes of its
streams and errors, and a reader that turns a captured request body into a provider-neutral transcript), a
scripted respx responder that records every request, a byte stream that pauses at gates, and a recorder of
committed `core.live` values."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from harness_core import (
    CORE_ASSISTANT,
    AgentChange,
    ConversationHandle,
    Entry,
    Extension,
    Harness,
    HarnessSettings,
    ModelRef,
    Models,
    ProgressSettings,
    Publication,
    Registry,
    RetrySettings,
    tool,
)
from harness_core.messages import AssistantMessage
from harness_core.models._base import HTTPProvider
from harness_core.models.anthropic import AnthropicProvider
from harness_core.models.openai import OpenAIProvider
from harness_core.storage import MemoryStorage, Storage

from .support import SSE_HEADERS, split_every, sse_data, sse_events

# One normalized item of what a request carried: ("user", text), ("assistant", text),
# ("call", id, name, arguments), ("result", call id, text, is_error).
Item = tuple[Any, ...]


class Gate:
    """A point in a `GatedStream` where the server stops sending until the test opens the gate."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.opened = asyncio.Event()

    def open(self) -> None:
        self.opened.set()


class GatedStream(httpx.AsyncByteStream):
    """A response body sent piece by piece; a `Gate` item holds the rest back until it is opened; with
    `hang=True` the body never ends (a server that keeps the connection open) until the client closes it."""

    def __init__(self, items: Iterable[bytes | Gate], *, hang: bool = False) -> None:
        self.items = list(items)
        self.hang = hang
        self.hanging = asyncio.Event()
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for item in self.items:
            if isinstance(item, Gate):
                item.reached.set()
                await item.opened.wait()
                continue
            await asyncio.sleep(0)
            yield item
        if self.hang:
            self.hanging.set()
            await asyncio.Event().wait()

    async def aclose(self) -> None:
        self.closed = True


def network_chunks(events: Sequence[bytes], size: int = 7) -> list[bytes]:
    """Events re-cut into small network chunks that split lines and UTF-8 sequences."""
    return split_every(b"".join(events), size)


def stream_response(body: GatedStream | Sequence[bytes]) -> httpx.Response:
    stream = body if isinstance(body, GatedStream) else GatedStream(network_chunks(body))
    return httpx.Response(200, headers=SSE_HEADERS, stream=stream)


def fragments(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: dict[str, Any]

    @property
    def raw(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


class Dialect:
    """What a test needs to know about one provider's wire format."""

    name: str
    model_id: str
    url: str
    base_url: str
    call_ids: tuple[str, str]
    lead: int  # events `text_events` sends before the first piece of text
    path: str  # the endpoint's path on a local server

    def base_url_for(self, origin: str) -> str:
        """The provider's base URL for a local server at `origin` (`http://127.0.0.1:port`)."""
        return origin + self.path.removesuffix("/chat/completions").removesuffix("/v1/messages")

    def provider(self, base_url: str | None = None) -> HTTPProvider:
        raise NotImplementedError

    def text_events(self, *pieces: str) -> list[bytes]:
        """A complete streamed answer, one SSE event per item (split it anywhere to gate it)."""
        raise NotImplementedError

    def tool_call_events(self, calls: Sequence[Call], fragment: int = 4) -> list[bytes]:
        """A complete response with several tool calls whose argument JSON arrives in small fragments."""
        raise NotImplementedError

    def error(
        self, status: int, kind: str, message: str, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        raise NotImplementedError

    def rate_limited(self, retry_after_ms: int) -> httpx.Response:
        raise NotImplementedError

    def server_error(self) -> httpx.Response:
        raise NotImplementedError

    def overflow(self) -> httpx.Response:
        raise NotImplementedError

    def transcript(self, body: dict[str, Any]) -> list[Item]:
        raise NotImplementedError

    def system_prompt(self, body: dict[str, Any]) -> str:
        raise NotImplementedError

    def session_id(self, body: dict[str, Any]) -> str | None:
        raise NotImplementedError

    def tool_names(self, body: dict[str, Any]) -> list[str]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


class OpenAIDialect(Dialect):
    name = "openai"
    model_id = "gpt-4o-mini"
    base_url = "https://llm.test/v1"
    url = f"{base_url}/chat/completions"
    path = "/v1/chat/completions"  # on a local server whose origin is the base URL without "/v1"
    call_ids = ("call_Zq81kX", "call_Os72mY")
    lead = 1

    def provider(self, base_url: str | None = None) -> HTTPProvider:
        return OpenAIProvider(api_key="sk-test-0123456789", base_url=base_url or self.base_url)

    @staticmethod
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-9",
            "object": "chat.completion.chunk",
            "model": "gpt-4o-mini",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    @staticmethod
    def usage(prompt: int, completion: int) -> dict[str, Any]:
        return {
            "id": "chatcmpl-9",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        }

    def text_events(self, *pieces: str) -> list[bytes]:
        events = [sse_data(self.chunk({"role": "assistant", "content": ""}))]
        events += [sse_data(self.chunk({"content": piece})) for piece in pieces]
        events.append(sse_data(self.chunk({}, "stop"), self.usage(42, 7), done=True))
        return events

    def tool_call_events(self, calls: Sequence[Call], fragment: int = 4) -> list[bytes]:
        events = [sse_data(self.chunk({"role": "assistant", "content": None}))]
        queues = [fragments(call.raw, fragment) for call in calls]
        started = [False] * len(calls)
        # Round-robin: the calls' argument fragments interleave, as parallel calls do on this API.
        while any(queues):
            for index, call in enumerate(calls):
                if not queues[index]:
                    continue
                piece = queues[index].pop(0)
                tool: dict[str, Any] = {"index": index, "function": {"arguments": piece}}
                if not started[index]:
                    started[index] = True
                    tool.update(id=call.id, type="function")
                    tool["function"]["name"] = call.name
                events.append(sse_data(self.chunk({"tool_calls": [tool]})))
        events.append(sse_data(self.chunk({}, "tool_calls"), self.usage(60, 30), done=True))
        return events

    def error(
        self, status: int, kind: str, message: str, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        payload = {"error": {"message": message, "type": kind, "param": None, "code": kind}}
        return httpx.Response(status, json=payload, headers=headers)

    def rate_limited(self, retry_after_ms: int) -> httpx.Response:
        return self.error(
            429,
            "rate_limit_exceeded",
            "Rate limit reached for gpt-4o-mini on requests per min (RPM): Limit 3, Used 3.",
            headers={"retry-after-ms": str(retry_after_ms), "retry-after": "1"},
        )

    def server_error(self) -> httpx.Response:
        return self.error(500, "server_error", "The server had an error while processing your request.")

    def overflow(self) -> httpx.Response:
        return httpx.Response(
            400,
            json={
                "error": {
                    "message": "This model's maximum context length is 128000 tokens. However, your messages "
                    "resulted in 131072 tokens. Please reduce the length of the messages.",
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
            },
        )

    def transcript(self, body: dict[str, Any]) -> list[Item]:
        items: list[Item] = []
        for message in body["messages"]:
            role = message["role"]
            if role == "user":
                items.append(("user", message["content"]))
            elif role == "assistant":
                if message.get("content"):
                    items.append(("assistant", message["content"]))
                for call in message.get("tool_calls") or []:
                    function = call["function"]
                    items.append(("call", call["id"], function["name"], json.loads(function["arguments"])))
            elif role == "tool":
                items.append(("result", message["tool_call_id"], message["content"], False))
        return items

    def system_prompt(self, body: dict[str, Any]) -> str:
        first = body["messages"][0]
        return str(first["content"]) if first["role"] == "system" else ""

    def session_id(self, body: dict[str, Any]) -> str | None:
        return body.get("prompt_cache_key")

    def tool_names(self, body: dict[str, Any]) -> list[str]:
        return [tool["function"]["name"] for tool in body.get("tools", [])]


class AnthropicDialect(Dialect):
    name = "anthropic"
    model_id = "claude-haiku-4-5"
    base_url = "https://anthropic.test"
    url = f"{base_url}/v1/messages"
    path = "/v1/messages"
    call_ids = ("toolu_01Zq81kX", "toolu_02Os72mY")
    lead = 3

    def provider(self, base_url: str | None = None) -> HTTPProvider:
        return AnthropicProvider(api_key="sk-ant-test-0123456789", base_url=base_url or self.base_url)

    @staticmethod
    def start() -> dict[str, Any]:
        return {
            "type": "message_start",
            "message": {
                "id": "msg_01",
                "type": "message",
                "role": "assistant",
                "model": "claude-haiku-4-5",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 42, "output_tokens": 1},
            },
        }

    @staticmethod
    def end(stop_reason: str, output_tokens: int) -> list[dict[str, Any]]:
        return [
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
            {"type": "message_stop"},
        ]

    def text_events(self, *pieces: str) -> list[bytes]:
        events = [
            self.start(),
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            {"type": "ping"},
        ]
        events += [
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
            for piece in pieces
        ]
        events.append({"type": "content_block_stop", "index": 0})
        events += self.end("end_turn", 7)
        return [sse_events(event) for event in events]

    def tool_call_events(self, calls: Sequence[Call], fragment: int = 4) -> list[bytes]:
        # The Messages API streams parallel tool calls as consecutive `tool_use` blocks.
        events: list[dict[str, Any]] = [self.start()]
        for index, call in enumerate(calls):
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "tool_use", "id": call.id, "name": call.name, "input": {}},
                }
            )
            events += [
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": piece},
                }
                for piece in ["", *fragments(call.raw, fragment)]
            ]
            events.append({"type": "content_block_stop", "index": index})
        events += self.end("tool_use", 30)
        return [sse_events(event) for event in events]

    def error(
        self, status: int, kind: str, message: str, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        payload = {"type": "error", "error": {"type": kind, "message": message}}
        return httpx.Response(status, json=payload, headers=headers)

    def rate_limited(self, retry_after_ms: int) -> httpx.Response:
        return self.error(
            429,
            "rate_limit_error",
            "This request would exceed the rate limit for your organization of 50 requests per minute.",
            headers={"retry-after-ms": str(retry_after_ms), "retry-after": "1"},
        )

    def server_error(self) -> httpx.Response:
        return self.error(500, "api_error", "Internal server error")

    def overflow(self) -> httpx.Response:
        return self.error(400, "invalid_request_error", "prompt is too long: 214001 tokens > 200000 maximum")

    def transcript(self, body: dict[str, Any]) -> list[Item]:
        items: list[Item] = []
        for turn in body["messages"]:
            for block in turn["content"]:
                kind = block["type"]
                if kind == "text":
                    items.append((turn["role"], block["text"]))
                elif kind == "tool_use":
                    items.append(("call", block["id"], block["name"], block["input"]))
                elif kind == "tool_result":
                    text = "".join(
                        part["text"] for part in block.get("content", []) if part["type"] == "text"
                    )
                    items.append(("result", block["tool_use_id"], text, bool(block.get("is_error"))))
        return items

    def system_prompt(self, body: dict[str, Any]) -> str:
        return "".join(block["text"] for block in body.get("system", []))

    def session_id(self, body: dict[str, Any]) -> str | None:
        value = body.get("metadata", {}).get("user_id")
        return None if value is None else str(value)

    def tool_names(self, body: dict[str, Any]) -> list[str]:
        return [tool["name"] for tool in body.get("tools", [])]


DIALECTS: list[Dialect] = [OpenAIDialect(), AnthropicDialect()]


Response = httpx.Response | Callable[[], httpx.Response]


@dataclass
class Script:
    """A respx side effect: answers requests with the queued responses in order, records every request body
    and its arrival on `clock`, and logs `("request", n)` into `log` (shared with a `LiveRecorder`, so the
    order of events is visible)."""

    responses: list[Response] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    log: list[tuple[Any, ...]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    clock: Callable[[], float] = field(default=lambda: time.time() * 1000)

    def add(self, *responses: Response) -> None:
        self.responses.extend(responses)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(json.loads(request.content))
        self.arrivals.append(self.clock())
        self.log.append(("request", len(self.requests)))
        if not self.responses:  # an unexpected request: fail it without retries instead of hanging
            return httpx.Response(400, json={"error": {"message": "test script: no response left"}})
        response = self.responses.pop(0)
        return response() if callable(response) else response


class LiveRecorder:
    """Records committed `core.live` values of one conversation: retries scheduled (into the shared log) and
    partial texts, and lets a test wait for a committed partial with a given text."""

    def __init__(self, harness: Harness, conversation_id: int, log: list[tuple[Any, ...]]) -> None:
        self.conversation_id = conversation_id
        self.log = log
        self.partials: list[str] = []
        self.retries: list[dict[str, Any]] = []
        self._waiters: list[tuple[str, asyncio.Event]] = []
        self.dispose = harness.add_publication_listener(self._on_publication)

    def _on_publication(self, publication: Publication) -> None:
        for doc in publication.docs:
            record = doc.record
            if record.kind != "core.live" or record.scope_id != self.conversation_id or doc.value is None:
                continue
            generation = doc.value.get("generation") or {}
            retry = generation.get("retry")
            if retry is not None and retry not in self.retries:
                self.retries.append(retry)
                self.log.append(("retry", retry["at"], retry["error"]))
            message = generation.get("message")
            if message is not None:
                text = AssistantMessage.model_validate(message).text()
                self.partials.append(text)
                for wanted, event in self._waiters:
                    if wanted == text:
                        event.set()

    async def partial(self, text: str) -> None:
        """Wait until a partial with exactly this text is committed."""
        if text in self.partials:
            return
        event = asyncio.Event()
        self._waiters.append((text, event))
        await event.wait()


class Rig:
    """A harness over one provider, its root conversation, the tool's ledger, and a live recorder."""

    def __init__(self, harness: Harness, root: ConversationHandle, script: Script) -> None:
        self.harness = harness
        self.root = root
        self.script = script
        self.executed: list[dict[str, Any]] = []
        self.reports: list[BaseException] = []
        self.live = LiveRecorder(harness, root.id, script.log)

    async def assistant_entries(self) -> list[AssistantMessage]:
        out: list[AssistantMessage] = []
        for entry in await self.all_entries():
            if entry.kind == CORE_ASSISTANT and entry.model:
                message = entry.model[0]
                assert isinstance(message, AssistantMessage)
                out.append(message)
        return out

    async def all_entries(self) -> list[Entry]:
        page = await self.root.entries(limit=200)
        return list(reversed(page.items))

    async def answer_text(self, entry_id: int | None) -> str:
        assert entry_id is not None
        entry = await self.harness.session.storage.entry(entry_id)
        assert entry is not None and entry.model is not None
        message = entry.model[0]
        assert isinstance(message, AssistantMessage)
        return message.text()


def fast_settings(**overrides: Any) -> HarnessSettings:
    settings = HarnessSettings(
        retry=RetrySettings(base_delay_ms=1),
        progress=ProgressSettings(partial_interval_ms=5),
    )
    for key, value in overrides.items():
        setattr(settings, key, value)
    return settings


class Rigs:
    """Opens harnesses over one dialect's provider (each with a `forecast` tool recording its executions) and
    closes them all at the end."""

    def __init__(self, dialect: Dialect, script: Script) -> None:
        self.dialect = dialect
        self.script = script
        self.opened: list[tuple[Harness, HTTPProvider]] = []

    async def __call__(
        self,
        settings: HarnessSettings | None = None,
        storage: Storage | None = None,
        *,
        base_url: str | None = None,
        now: Callable[[], int] | None = None,
    ) -> Rig:
        dialect = self.dialect
        provider = dialect.provider(base_url)
        executed: list[dict[str, Any]] = []

        @tool
        async def forecast(city: str, days: int) -> str:
            """The weather forecast for a city."""
            executed.append({"city": city, "days": days})
            return f"{city}: sunny for {days} days"

        registry = Registry()
        registry.install(Extension("weather", tools=[forecast]))
        reports: list[BaseException] = []
        harness = await Harness.open(
            storage or await MemoryStorage.open(),
            models=Models(provider),
            registry=registry,
            settings=settings or fast_settings(),
            on_report=reports.append,
            now=now,
        )
        self.opened.append((harness, provider))
        root = await harness.root(
            agent=AgentChange(model=ModelRef(provider=dialect.name, model_id=dialect.model_id))
        )
        rig = Rig(harness, root, self.script)
        rig.executed = executed
        rig.reports = reports
        return rig

    async def aclose(self) -> None:
        for harness, provider in self.opened:
            await harness.close()
            await provider.aclose()


OpenRig = Rigs
