"""The provider-neutral message model.

These are the messages stored in entries (`Entry.model`) and sent to providers. Every model is a pydantic
model whose JSON form is strict JSON, so a message can live inside an entry, a document or a checkpoint.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

StopReason = Literal["stop", "length", "toolUse", "error", "aborted"]


def now_ms() -> int:
    return int(time.time() * 1000)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class TextContent(_Model):
    type: Literal["text"] = "text"
    text: str


class ThinkingContent(_Model):
    type: Literal["thinking"] = "thinking"
    thinking: str
    # Opaque provider signature that must be sent back verbatim (Anthropic extended thinking).
    signature: str | None = None


class ImageContent(_Model):
    type: Literal["image"] = "image"
    data: str  # base64
    mime_type: str


class ToolCall(_Model):
    type: Literal["toolCall"] = "toolCall"
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    # Raw argument JSON while it is still streaming; absent once the call is complete.
    partial_json: str | None = None


class Usage(_Model):
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.input + self.output + self.cache_read + self.cache_write

    def plus(self, other: Usage) -> Usage:
        return Usage(
            input=self.input + other.input,
            output=self.output + other.output,
            cache_read=self.cache_read + other.cache_read,
            cache_write=self.cache_write + other.cache_write,
            cost=round(self.cost + other.cost, 10),
        )


UserPart = Annotated[TextContent | ImageContent, Field(discriminator="type")]
AssistantPart = Annotated[TextContent | ThinkingContent | ToolCall, Field(discriminator="type")]


class UserMessage(_Model):
    role: Literal["user"] = "user"
    content: str | list[UserPart]
    timestamp: int = Field(default_factory=now_ms)


class ErrorInfo(_Model):
    """Provider error classification carried by an assistant message with stop_reason "error"."""

    message: str
    retryable: bool = False
    overflow: bool = False
    retry_after_ms: int | None = None
    status: int | None = None


class AssistantMessage(_Model):
    role: Literal["assistant"] = "assistant"
    content: list[AssistantPart] = Field(default_factory=list)
    stop_reason: StopReason | None = None
    usage: Usage = Field(default_factory=Usage)
    provider: str = ""
    model: str = ""
    error: ErrorInfo | None = None
    timestamp: int = Field(default_factory=now_ms)

    def text(self) -> str:
        return "".join(part.text for part in self.content if isinstance(part, TextContent))

    def tool_calls(self) -> list[ToolCall]:
        return [part for part in self.content if isinstance(part, ToolCall)]


class ToolResultMessage(_Model):
    role: Literal["toolResult"] = "toolResult"
    tool_call_id: str
    tool_name: str
    content: list[UserPart] = Field(default_factory=list)
    details: Any = None
    usage: Usage | None = None
    is_error: bool = False
    duration_ms: int | None = None
    timestamp: int = Field(default_factory=now_ms)

    def text(self) -> str:
        return "".join(part.text for part in self.content if isinstance(part, TextContent))


class ToolDeclaration(_Model):
    """What a provider is told about a tool: name, description and JSON schema of its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class SystemMessage(_Model):
    """A positional system-prompt patch (`core.system` entries).

    `sections` maps a section key to its new text (or None to remove it); `tools_removed` is applied
    before `tools_added`. The effective system prompt and tool set are the replay of every such patch in the
    active context, so an unchanged prompt appends nothing and provider prompt caches stay warm.
    """

    role: Literal["system"] = "system"
    content: Literal[""] = ""
    sections: dict[str, str | None] = Field(default_factory=dict)
    tools_added: list[ToolDeclaration] = Field(default_factory=list)
    tools_removed: list[str] = Field(default_factory=list)
    timestamp: int = Field(default_factory=now_ms)


Message = Annotated[
    UserMessage | AssistantMessage | ToolResultMessage | SystemMessage, Field(discriminator="role")
]
MESSAGE_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)
MESSAGES_ADAPTER: TypeAdapter[list[Message]] = TypeAdapter(list[Message])


def message_from_json(value: Any) -> Message:
    return MESSAGE_ADAPTER.validate_python(value)


def messages_to_json(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.model_dump(mode="json", exclude_none=True) for m in messages]


def user_text(message: UserMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    return "".join(part.text for part in message.content if isinstance(part, TextContent))


def estimate_tokens(message: Message) -> int:
    """A cheap token estimate (about four characters a token) used for compaction thresholds."""
    if isinstance(message, UserMessage):
        chars = len(user_text(message))
    elif isinstance(message, AssistantMessage):
        chars = 0
        for part in message.content:
            if isinstance(part, TextContent):
                chars += len(part.text)
            elif isinstance(part, ThinkingContent):
                chars += len(part.thinking)
            else:
                chars += len(part.name) + len(str(part.arguments))
    elif isinstance(message, ToolResultMessage):
        chars = len(message.text())
    else:
        chars = sum(len(v or "") for v in message.sections.values())
    return max(1, chars // 4)
