"""Model output made valid where it enters the harness (DESIGN.md §2.3).

Whatever a provider streams is text from outside: an unpaired UTF-16 surrogate in a text delta or in tool-call
arguments is valid JSON on the wire but cannot be stored as UTF-8. `Models.stream` passes every snapshot
through `valid_message`, so the generation task (partials and the final message) and compaction only ever see
storable messages, whichever provider produced them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

from harness_core._json import MAX_DEPTH, WRAPPED_DEPTH, check_json, check_record, clean_json, clean_text
from harness_core.errors import StrictJsonError
from harness_core.messages import AssistantMessage, TextContent, ThinkingContent, ToolCall


def valid_message(message: AssistantMessage) -> AssistantMessage:
    """`message` itself when it is storable as it is (the common case: one walk, ASCII text in O(1));
    otherwise a copy with unpaired surrogates replaced by U+FFFD, and tool calls whose arguments are not strict
    JSON (NaN, ints beyond 64 bits, nesting past 128 levels) turned into invalid calls (`arguments={}`, the text
    in `partial_json`), which the tool layer reports to the model instead of running them."""
    try:
        check_record(message, "model output", limit=WRAPPED_DEPTH)
        for call in message.tool_calls():
            check_json(call.arguments, "arguments", limit=MAX_DEPTH)
    except StrictJsonError:
        return _cleaned(message)
    return message


def _cleaned(message: AssistantMessage) -> AssistantMessage:
    copy = message.model_copy(deep=True)
    copy.provider = clean_text(copy.provider)
    copy.model = clean_text(copy.model)
    if copy.error is not None:
        copy.error.message = clean_text(copy.error.message)
    for part in copy.content:
        if isinstance(part, TextContent):
            part.text = clean_text(part.text)
        elif isinstance(part, ThinkingContent):
            part.thinking = clean_text(part.thinking)
            if part.signature is not None:
                part.signature = clean_text(part.signature)
        elif isinstance(part, ToolCall):
            _clean_call(part)
    return copy


def _clean_call(call: ToolCall) -> None:
    call.id = clean_text(call.id)
    call.name = clean_text(call.name)
    if call.partial_json is not None:
        call.partial_json = clean_text(call.partial_json)
    try:
        call.arguments = clean_json(call.arguments, "arguments", limit=MAX_DEPTH)
    except StrictJsonError:
        if call.partial_json is None:
            call.partial_json = _as_text(call.arguments)
        call.arguments = {}


def _as_text(value: object) -> str:
    """Arguments that are not JSON, as text for the model's error result (ASCII: surrogates come out escaped)."""
    try:
        return json.dumps(value, default=repr)
    except (ValueError, TypeError, RecursionError):
        return "(arguments that are not JSON)"


async def valid_stream(
    source: AsyncGenerator[AssistantMessage, None],
) -> AsyncGenerator[AssistantMessage, None]:
    """The provider's snapshots, each made valid. Closing this stream closes the provider's."""
    try:
        async for message in source:
            yield valid_message(message)
    finally:
        await source.aclose()
