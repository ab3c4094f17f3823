"""Fork ancestry: which conversations' entries a conversation sees, and up to where."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from harness_core.errors import NotFound
from harness_core.records import Conversation


async def ancestry(
    conversation_id: int, read: Callable[[int], Awaitable[Conversation | None]]
) -> list[tuple[int, int | None]]:
    """[(conversation id, highest visible entry id or None)] from the conversation up to its root."""
    chain: list[tuple[int, int | None]] = []
    cap: int | None = None
    current: int | None = conversation_id
    while current is not None:
        record = await read(current)
        if record is None:
            raise NotFound(f"conversation {current} does not exist")
        chain.append((current, cap))
        if record.parent is None:
            break
        cap = record.parent.at if cap is None else min(cap, record.parent.at)
        current = record.parent.conversation_id
    return chain


def visible_in(chain: list[tuple[int, int | None]], entry_conversation: int, entry_id: int) -> int | None:
    """The conversation of the chain through which an entry is visible, or None."""
    for conversation_id, cap in chain:
        if entry_conversation == conversation_id and (cap is None or entry_id <= cap):
            return conversation_id
    return None
