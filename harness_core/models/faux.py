"""`FauxProvider`: a scripted, deterministic model for tests and offline demos (provider name "faux").

Script it with functions of the request, so every process that replays a conversation gets the same answers:

    faux = FauxProvider()
    faux.set_responses([lambda request: faux_assistant([faux_text("hello")])])

Responses are consumed in order; `set_responder(fn)` answers every request with `fn` instead. A response is
streamed in chunks (`chunk_size` characters, `delay_ms` apart) so partial commits and mid-stream crashes can
be exercised; usage is estimated from the text.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from harness_core.messages import (
    AssistantMessage,
    ErrorInfo,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    Usage,
    estimate_tokens,
)
from harness_core.models import ModelInfo, ModelPrice, ModelRequest

Response = AssistantMessage | Callable[[ModelRequest], AssistantMessage]


def faux_text(text: str) -> TextContent:
    return TextContent(text=text)


def faux_thinking(text: str) -> ThinkingContent:
    return ThinkingContent(thinking=text)


def faux_tool_call(name: str, arguments: dict[str, Any] | None = None, *, id: str | None = None) -> ToolCall:
    return ToolCall(id=id or f"call_{name}", name=name, arguments=dict(arguments or {}))


def faux_assistant(
    content: Sequence[TextContent | ThinkingContent | ToolCall] | str,
    *,
    stop_reason: StopReason | None = None,
    usage: Usage | None = None,
) -> AssistantMessage:
    parts: list[TextContent | ThinkingContent | ToolCall] = (
        [TextContent(text=content)] if isinstance(content, str) else list(content)
    )
    if stop_reason is None:
        stop_reason = "toolUse" if any(isinstance(p, ToolCall) for p in parts) else "stop"
    return AssistantMessage(content=parts, stop_reason=stop_reason, usage=usage or Usage())


def faux_error(
    message: str, *, retryable: bool = False, overflow: bool = False, retry_after_ms: int | None = None
) -> AssistantMessage:
    return AssistantMessage(
        stop_reason="error",
        error=ErrorInfo(
            message=message, retryable=retryable, overflow=overflow, retry_after_ms=retry_after_ms
        ),
    )


class FauxProvider:
    def __init__(
        self,
        *,
        name: str = "faux",
        chunk_size: int = 8,
        delay_ms: float = 0,
        context_window: int = 128_000,
        max_tokens: int = 8_192,
        price: ModelPrice | None = None,
        record_requests: bool = True,
    ) -> None:
        self.name = name
        self.chunk_size = max(1, chunk_size)
        self.delay_ms = delay_ms
        self.context_window = context_window
        self.max_tokens = max_tokens
        self.price = price or ModelPrice()
        # Tests read `requests`; long benchmark or demo runs turn it off (each entry is a deep copy).
        self.record_requests = record_requests
        self.requests: list[ModelRequest] = []
        self._responses: list[Response] = []
        self._responder: Callable[[ModelRequest], AssistantMessage] | None = None

    def set_responses(self, responses: Sequence[Response]) -> None:
        self._responses = list(responses)

    def add_responses(self, responses: Sequence[Response]) -> None:
        self._responses.extend(responses)

    def set_responder(self, responder: Callable[[ModelRequest], AssistantMessage] | None) -> None:
        """Answer every request with `responder(request)` (after any queued responses)."""
        self._responder = responder

    def model(self, model_id: str) -> ModelInfo | None:
        return ModelInfo(
            provider=self.name,
            id=model_id,
            context_window=self.context_window,
            max_tokens=self.max_tokens,
            price=self.price,
        )

    async def aclose(self) -> None:
        return None

    def _next(self, request: ModelRequest) -> AssistantMessage:
        if self._responses:
            response = self._responses.pop(0)
        elif self._responder is not None:
            response = self._responder
        else:
            return faux_error("faux provider: no scripted response left")
        message = response(request) if callable(response) else response
        return message.model_copy(deep=True)

    async def stream(self, model: ModelInfo, request: ModelRequest) -> AsyncGenerator[AssistantMessage, None]:
        if self.record_requests:
            self.requests.append(request.model_copy(deep=True))
        final = self._next(request)
        final.provider = self.name
        final.model = model.id
        if final.usage.total_tokens == 0 and final.stop_reason != "error":
            prompt = sum(estimate_tokens(m) for m in request.messages) + len(request.system_prompt) // 4
            final.usage = Usage(input=prompt, output=estimate_tokens(final))
        final.usage.cost = self.price.cost(final.usage)
        if final.stop_reason == "error":
            await self._pause()
            yield final
            return
        partial = AssistantMessage(provider=self.name, model=model.id)
        for part in final.content:
            if isinstance(part, TextContent):
                current = TextContent(text="")
                partial.content.append(current)
                for start in range(0, len(part.text), self.chunk_size):
                    current.text += part.text[start : start + self.chunk_size]
                    await self._pause()
                    yield partial
            elif isinstance(part, ThinkingContent):
                partial.content.append(part.model_copy())
                await self._pause()
                yield partial
            else:
                raw = json.dumps(part.arguments)
                call = ToolCall(id=part.id, name=part.name, arguments={}, partial_json="")
                partial.content.append(call)
                for start in range(0, len(raw), self.chunk_size * 4):
                    call.partial_json = (call.partial_json or "") + raw[start : start + self.chunk_size * 4]
                    await self._pause()
                    yield partial
                call.arguments = dict(part.arguments)
                call.partial_json = None
        await self._pause()
        yield final

    async def _pause(self) -> None:
        if self.delay_ms > 0:
            await asyncio.sleep(self.delay_ms / 1000)
        else:
            await asyncio.sleep(0)
