"""Places to conversations: a channel is an ownerless conversation of its own; a thread is a fork of its
channel's conversation at the entry of the message it hangs off."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from adapters.bridge.docs import MessageDoc, PlaceDoc, PlaceOfDoc
from adapters.bridge.model import Place
from harness_core import AgentChange, AgentDoc, Ownerless, Tx


def newer(a: str | None, b: str | None) -> str | None:
    """The newer of two message ids (Slack ts and Discord snowflakes both order numerically)."""
    if a is None:
        return b
    if b is None:
        return a
    try:
        return a if Decimal(a) >= Decimal(b) else b
    except InvalidOperation:
        return max(a, b)


async def conversation_for(tx: Tx, place: Place, agent: AgentChange | None) -> tuple[int, bool]:
    """The conversation of `place`, created in this commit if needed. Returns (id, created)."""
    known = await tx.snapshot(PlaceDoc, key=place.key)
    if known is not None and known.get("conversation_id") is not None:
        return int(known["conversation_id"]), False
    doc = await tx.doc(PlaceDoc, key=place.key, seed={})
    if place.thread is None:
        conversation_id = await _new_conversation(tx, agent)
    else:
        parent, _ = await conversation_for(tx, place.channel_place, agent)
        at = await fork_point(tx, place, parent)
        if at is None:
            conversation_id = await _new_conversation(tx, agent)
        else:
            conversation_id = (await tx.fork_conversation(parent, at, Ownerless())).id
    doc.value = {"conversation_id": conversation_id, "place": place.to_json(), "last_seen": None}
    place_of = await tx.doc(PlaceOfDoc, conversation_id)
    place_of.value = {"place": place.to_json()}
    return conversation_id, True


async def _new_conversation(tx: Tx, agent: AgentChange | None) -> int:
    conversation = await tx.create_conversation(Ownerless())
    if agent is not None:
        stored = await tx.doc(AgentDoc, conversation.id)
        stored.value = agent.apply(stored.value)
    return conversation.id


async def fork_point(tx: Tx, thread: Place, parent_conversation: int) -> int | None:
    """The entry a thread's fork starts after: the answer the bot gave in that thread, the bot answer the thread
    hangs off, or the user message it hangs off (the channel's newest entry when that is not placed yet)."""
    assert thread.thread is not None
    found = await tx.snapshot(MessageDoc, key=thread.message_key(thread.thread))
    info: dict[str, Any] = found or {}
    for field in ("thread_answer", "entry_id"):
        candidate = info.get(field)
        if candidate is not None and await tx.entry_visible(parent_conversation, int(candidate)) is not None:
            return int(candidate)
    submission_id = info.get("submission_id")
    if submission_id is not None:
        submission = await tx.submission(int(submission_id))
        visible = (
            submission is not None
            and submission.entry is not None
            and await tx.entry_visible(parent_conversation, submission.entry) is not None
        )
        if visible and submission is not None and submission.entry is not None:
            return submission.entry
    latest = await tx.latest_entry(parent_conversation)
    return None if latest is None else latest.id


async def note_seen(tx: Tx, place: Place, message_id: str) -> None:
    doc = await tx.doc(PlaceDoc, key=place.key, seed={})
    doc.value["last_seen"] = newer(doc.value.get("last_seen"), message_id)
