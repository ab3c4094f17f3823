"""The machinery the HTTP providers share: configuration, the model table, one httpx client, and the
streaming loop that turns an SSE response into `AssistantMessage` snapshots without ever raising a provider
failure."""

from __future__ import annotations

import asyncio
import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, ClassVar

import httpx

from harness_core.messages import AssistantMessage, ErrorInfo, ToolCall
from harness_core.models import ModelInfo, ModelRequest

from ._errors import Classifier, parse_error_payload
from ._sse import SSEEvent, SSEFormatError, excerpt, iter_sse

DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=60.0, pool=30.0)
_DATE_SUFFIX = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2})$")


class StreamFailure(Exception):
    """Raised by an event parser when the provider reports an error inside the stream."""

    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


class EventParser(ABC):
    """Accumulates one response. `feed` returns whether the message changed; `done` turns true on the
    provider's final event; `finish` settles the message and returns an error when the stream was incomplete
    or ended badly."""

    def __init__(self, message: AssistantMessage, classifier: Classifier) -> None:
        self.message = message
        self.classifier = classifier
        self.done = False

    @abstractmethod
    def feed(self, event: SSEEvent) -> bool: ...

    @abstractmethod
    def finish(self) -> ErrorInfo | None: ...


def unique_call_id(message: AssistantMessage, wanted: str, *, exclude: ToolCall | None = None) -> str:
    """`wanted`, or `wanted_2`, `wanted_3`, ... when another call of the message already has that id.

    Tool results are paired with their calls by id, so two calls of one message must never share one; some
    OpenAI-compatible servers and proxies repeat an id across parallel calls (`functions.forecast:0`)."""
    taken = {call.id for call in message.tool_calls() if call is not exclude}
    if wanted not in taken:
        return wanted
    suffix = 2
    while f"{wanted}_{suffix}" in taken:
        suffix += 1
    return f"{wanted}_{suffix}"


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


class HTTPProvider(ABC):
    """Base class of `OpenAIProvider` and `AnthropicProvider`."""

    DEFAULT_NAME: ClassVar[str]
    DEFAULT_BASE_URL: ClassVar[str]
    API_KEY_ENV: ClassVar[str]
    BASE_URL_ENV: ClassVar[str]
    KNOWN_MODELS: ClassVar[Mapping[str, Mapping[str, Any]]]
    OVERFLOW_CODES: ClassVar[frozenset[str]] = frozenset()
    drain_timeout: float = 0.5  # seconds to wait for the end of a response after its final event

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        client: httpx.AsyncClient | None = None,
        models: list[ModelInfo] | None = None,
        timeout: float | httpx.Timeout | None = None,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
    ) -> None:
        self.name = name or self.DEFAULT_NAME
        self.__api_key = api_key if api_key is not None else _env(self.API_KEY_ENV)
        self.base_url = (base_url or _env(self.BASE_URL_ENV) or self.DEFAULT_BASE_URL).rstrip("/")
        self._extra_headers = dict(headers or {})
        if timeout is None:
            self._timeout = DEFAULT_TIMEOUT
        elif isinstance(timeout, httpx.Timeout):
            self._timeout = timeout
        else:
            self._timeout = httpx.Timeout(timeout, connect=min(10.0, timeout))
        self._client = client
        self._owns_client = client is None
        self._models: dict[str, ModelInfo] = {
            model_id: ModelInfo(provider=self.name, id=model_id, **spec)
            for model_id, spec in self.KNOWN_MODELS.items()
        }
        for info in models or []:
            self.register_model(info)
        self._classifier = Classifier(self.name, overflow_codes=self.OVERFLOW_CODES, secrets=[self.__api_key])

    # -- configuration ---------------------------------------------------------------------------------

    @property
    def has_api_key(self) -> bool:
        return bool(self.__api_key)

    def _api_key(self) -> str | None:
        return self.__api_key

    def __repr__(self) -> str:
        key = "set" if self.__api_key else "unset"
        return f"{type(self).__name__}(name={self.name!r}, base_url={self.base_url!r}, api_key={key})"

    # -- models ----------------------------------------------------------------------------------------

    def register_model(self, info: ModelInfo) -> None:
        """Add or replace a model's limits and price (its `provider` is set to this provider's name)."""
        if info.provider != self.name:
            info = info.model_copy(update={"provider": self.name})
        self._models[info.id] = info

    def known_models(self) -> list[ModelInfo]:
        return list(self._models.values())

    def model(self, model_id: str) -> ModelInfo:
        """The registered model; a dated id (`...-20250514`, `...-2024-08-06`) falls back to its undated
        entry; any other id gets conservative defaults (compatible servers serve arbitrary names)."""
        info = self._models.get(model_id)
        if info is not None:
            return info
        base = _DATE_SUFFIX.sub("", model_id)
        info = self._models.get(base)
        if info is not None:
            return info.model_copy(update={"id": model_id})
        return ModelInfo(provider=self.name, id=model_id)

    # -- HTTP ------------------------------------------------------------------------------------------

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout)
            self._owns_client = True
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client this provider created (a client passed in by the caller stays open)."""
        client, self._client = self._client, None
        if client is not None and self._owns_client:
            await client.aclose()

    @abstractmethod
    def _prepare(self, model: ModelInfo, request: ModelRequest) -> tuple[str, dict[str, str], dict[str, Any]]:
        """URL, headers and JSON body of the request."""

    @abstractmethod
    def _parser(self, message: AssistantMessage, model: ModelInfo) -> EventParser: ...

    async def stream(self, model: ModelInfo, request: ModelRequest) -> AsyncGenerator[AssistantMessage, None]:
        url, headers, body = self._prepare(model, request)
        # The body is encoded here (as httpx's `json=` would) and its tree of dicts let go before the response
        # streams: it is a copy of the whole context in small objects, and requests in flight at once each held
        # one for the whole answer (issue 12: peaks of live objects become memory the allocator keeps).
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        del body
        headers = {"Content-Type": "application/json", **headers, **self._extra_headers}
        message = AssistantMessage(provider=self.name, model=model.id)
        parser = self._parser(message, model)
        classifier = self._classifier
        error: ErrorInfo | None = None
        mid_stream = False
        try:
            async with self._http().stream("POST", url, content=content, headers=headers) as response:
                if response.status_code >= 400:
                    raw = (await response.aread()).decode("utf-8", "replace")
                    error = classifier.http_error(response.status_code, response.headers, raw)
                elif response.status_code >= 300:  # redirects are not followed: a POST must not be replayed
                    location = response.headers.get("location", "(no location)")
                    error = classifier.plain(
                        f"HTTP {response.status_code}: redirected to {location}; check the base URL",
                        status=response.status_code,
                    )
                elif _is_json(response.headers.get("content-type", "")):
                    raw = (await response.aread()).decode("utf-8", "replace")
                    error = self._json_instead_of_stream(raw)
                else:
                    mid_stream = True
                    events = iter_sse(response.aiter_lines())
                    async for event in events:
                        changed = self._feed(parser, event)
                        if changed:
                            message.usage.cost = model.price.cost(message.usage)
                            yield message
                        if parser.done:
                            break
                    error = parser.finish()
                    if parser.done:
                        await self._drain(events)
        except StreamFailure as exc:
            error = exc.info
        except SSEFormatError as exc:
            error = classifier.format_error(exc)
        except httpx.HTTPError as exc:
            error = classifier.transport_error(exc, mid_stream=mid_stream)
        message.usage.cost = model.price.cost(message.usage)
        if error is not None:
            message.stop_reason = "error"
            message.error = error
        elif message.stop_reason is None:  # pragma: no cover - parsers always settle the message
            message.stop_reason = "stop"
        yield message

    async def _drain(self, events: AsyncIterator[SSEEvent]) -> None:
        """Read what is left of a finished response (normally only the end of the body) so its connection
        goes back to the pool: without this every request would pay a new TCP and TLS handshake. A server that
        keeps the stream open after its final event gets `drain_timeout` seconds, then the connection is closed
        instead."""
        try:
            async with asyncio.timeout(self.drain_timeout):
                async for _event in events:
                    pass
        except (TimeoutError, SSEFormatError, httpx.HTTPError):
            pass

    def _feed(self, parser: EventParser, event: SSEEvent) -> bool:
        try:
            return parser.feed(event)
        except (StreamFailure, SSEFormatError):
            raise
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise SSEFormatError(
                f"unexpected event shape ({type(exc).__name__}: {exc}): {excerpt(event.data)!r}"
            ) from exc

    def _json_instead_of_stream(self, raw: str) -> ErrorInfo:
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = None
        parsed = parse_error_payload(payload)
        if parsed is not None:
            status = None
            if parsed.code is not None and parsed.code.isdigit():
                status = int(parsed.code)
            return self._classifier.event_error(parsed, status=status)
        return self._classifier.plain(
            f"expected an event stream but the server sent a JSON body: {excerpt(raw)!r}"
        )


def _is_json(content_type: str) -> bool:
    lowered = content_type.lower()
    return "json" in lowered and "event-stream" not in lowered
