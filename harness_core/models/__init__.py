"""Model providers: the registry (`Models`) and the provider contract.

A provider turns a `ModelRequest` into a stream of `AssistantMessage` snapshots. The contract every provider
follows (the generation task relies on it):

- `stream()` is an async iterator. Each item is the message accumulated so far (`stop_reason` None); the
  last item has `stop_reason` set. The provider may yield the same object it keeps mutating, so a consumer that
  keeps a snapshot must copy it.
- Provider failures are not raised: the last item has `stop_reason="error"` and `error` set (an `ErrorInfo`
  saying whether it is retryable, a context overflow, and the server's retry-after). Only programming errors
  raise.
- Cancelling the consuming task (or `aclose()` on the iterator) stops the stream and closes the HTTP response
  promptly.
- Text may be anything the server sent: `Models.stream` makes each snapshot valid (an unpaired surrogate
  becomes U+FFFD; tool-call arguments that are not strict JSON become an invalid call) before the harness
  sees it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from harness_core.messages import AssistantMessage, Message, ToolDeclaration, Usage

ThinkingLevel = Literal["off", "minimal", "low", "medium", "high"]


class ModelRef(BaseModel):
    """Names a model: a provider registered in `Models` and a model id it knows."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    provider: str
    model_id: str

    @classmethod
    def parse(cls, text: str) -> ModelRef:
        """Parse `provider:model` (the config file form)."""
        provider, sep, model_id = text.partition(":")
        if not sep or not provider or not model_id:
            raise ValueError(f"model must look like 'provider:model', got {text!r}")
        return cls(provider=provider, model_id=model_id)

    def __str__(self) -> str:
        return f"{self.provider}:{self.model_id}"


class ModelPrice(BaseModel):
    """US dollars per million tokens."""

    model_config = ConfigDict(frozen=True)
    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0

    def cost(self, usage: Usage) -> float:
        total = (
            usage.input * self.input
            + usage.output * self.output
            + usage.cache_read * self.cache_read
            + usage.cache_write * self.cache_write
        ) / 1_000_000
        return round(total, 10)


class ModelInfo(BaseModel):
    model_config = ConfigDict(frozen=True)
    provider: str
    id: str
    context_window: int = 128_000
    max_tokens: int = 8_192
    reasoning: bool = False
    price: ModelPrice = Field(default_factory=ModelPrice)


class ModelRequest(BaseModel):
    """One provider request. `messages` holds user, assistant and tool-result messages only: the system
    prompt and the offered tools are carried separately."""

    system_prompt: str = ""
    messages: list[Message] = Field(default_factory=list)
    tools: list[ToolDeclaration] = Field(default_factory=list)
    session_id: str | None = None
    reasoning: ThinkingLevel = "off"
    max_tokens: int | None = None
    options: dict[str, Any] = Field(default_factory=dict)


@runtime_checkable
class Provider(Protocol):
    name: str

    def model(self, model_id: str) -> ModelInfo | None:
        """The model's limits and price, or None when the provider does not know it."""
        ...

    def stream(self, model: ModelInfo, request: ModelRequest) -> AsyncGenerator[AssistantMessage, None]: ...

    async def aclose(self) -> None: ...


class Models:
    """Maps provider names to providers."""

    def __init__(self, *providers: Provider) -> None:
        self._providers: dict[str, Provider] = {}
        for provider in providers:
            self.set_provider(provider)

    def set_provider(self, provider: Provider) -> None:
        self._providers[provider.name] = provider

    def provider(self, name: str) -> Provider | None:
        return self._providers.get(name)

    def providers(self) -> list[Provider]:
        return list(self._providers.values())

    def get_model(self, ref: ModelRef) -> ModelInfo | None:
        provider = self._providers.get(ref.provider)
        return None if provider is None else provider.model(ref.model_id)

    def stream(self, ref: ModelRef, request: ModelRequest) -> AsyncGenerator[AssistantMessage, None]:
        provider = self._providers.get(ref.provider)
        info = None if provider is None else provider.model(ref.model_id)
        if provider is None or info is None:
            raise LookupError(f"unknown model {ref}")
        from harness_core.models._valid import valid_stream

        # Model output is text from outside: every snapshot is made storable here (see `_valid.py`).
        return valid_stream(provider.stream(info, request))

    async def aclose(self) -> None:
        for provider in self._providers.values():
            await provider.aclose()


__all__ = [
    "AssistantMessage",
    "ModelInfo",
    "ModelPrice",
    "ModelRef",
    "ModelRequest",
    "Models",
    "Provider",
    "ThinkingLevel",
]
