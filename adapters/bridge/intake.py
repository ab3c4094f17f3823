"""Intake, exactly once: every human message becomes a submission keyed by the message's identity, committed
(with its delivery record) before the platform is acknowledged.

A request id seen before is a duplicate only when the message is the same: the bridge keeps a digest of who said
what with the message's record and compares it. Different content under a known id (a platform that reused an
id) is a `RequestIdConflict`, logged at ERROR with the id and dropped, never silently taken for the old message.
A message the harness refuses as input (`StrictJsonError`, a conflict it found itself) is logged at ERROR, naming
its platform message, and dropped: the adapter acknowledges it, since a redelivery would fail the same way, and
the messages after it are still taken in.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import ValidationError

from adapters.bridge.docs import MessageDoc, PlaceDoc, ReplyDoc
from adapters.bridge.model import IncomingMessage, Place
from adapters.bridge.places import conversation_for, note_seen
from harness_core import CORE_USER, EntryDraft, Input, RequestIdConflict, StrictJsonError, Tx, Write
from harness_core.messages import UserMessage

if TYPE_CHECKING:
    from adapters.bridge.bridge import Bridge


log = logging.getLogger("adapters.bridge")

Outcome = Literal["answering", "recorded", "duplicate", "ignored", "conflict", "refused", "forwarded"]


@dataclass(frozen=True)
class IntakeResult:
    """`conflict`: the id was taken in before with other content; `refused`: the harness would not take it in
    (both logged at ERROR and dropped: acknowledge, a redelivery cannot do better); `forwarded`: committed as an
    ingress record for the owner of the place's partition (a `Router`; this worker or another): acknowledge."""

    conversation_id: int | None
    submission_id: int | None
    outcome: Outcome


def attributed(message: IncomingMessage) -> str:
    return f"{message.user_name}: {message.text}"


def content_digest(message: IncomingMessage) -> str:
    """Who said what, without the display name (a rename between a delivery and its retry is not a conflict)."""
    return hashlib.sha256(f"{message.user_id}\n{message.text}".encode()).hexdigest()[:32]


async def addressed(tx: Tx, bridge: Bridge, message: IncomingMessage) -> bool:
    policy = bridge.config.policy(message.place)
    if message.is_dm:
        return bridge.config.answer_dms
    if policy.answer == "all":
        return True
    if policy.answer != "mentions":  # "none": silent everywhere in the channel, threads the bot is in too
        return False
    if message.mentions_bot:
        return True
    if message.place.thread is not None:
        # A thread the bot is part of (it answered there, or the thread hangs off its answer) needs no mention.
        place = await tx.snapshot(PlaceDoc, key=message.place.key)
        if place and place.get("engaged"):
            return True
        parent = await tx.snapshot(MessageDoc, key=message.place.message_key(message.place.thread))
        return bool(
            parent and (parent.get("entry_id") is not None or parent.get("thread_answer") is not None)
        )
    return False


async def intake(bridge: Bridge, message: IncomingMessage, ingress_record: int | None = None) -> IntakeResult:
    harness = bridge.harness

    async def commit(tx: Tx) -> IntakeResult:
        if ingress_record is not None:  # whatever the outcome (a duplicate too), the record is done with it
            tx.finish_ingress(ingress_record)
        conversation_id, _ = await conversation_for(tx, message.place, bridge.agent)
        existing = await tx.submission_by_request(conversation_id, message.request_id)
        if existing is not None:
            record = await tx.snapshot(MessageDoc, key=message.request_id) or {}
            digest = record.get("digest")  # records from before digests were kept: no comparison possible
            if digest is not None and digest != content_digest(message):
                return IntakeResult(conversation_id, existing.id, "conflict")
            return IntakeResult(conversation_id, existing.id, "duplicate")
        await note_seen(tx, message.place, message.message_id)
        answer = await addressed(tx, bridge, message)
        policy = bridge.config.policy(message.place)
        if answer:
            submission = await harness.submit_in(
                tx,
                conversation_id,
                Input(attributed(message), request_id=message.request_id, when_busy="followUp"),
            )
            target = message.place
            if target.thread is None and policy.reply_in_thread and not message.is_dm:
                target = target.in_thread(message.message_id)
            await tx.create_doc(  # keyed by the submission id minted in this commit: new by construction
                ReplyDoc,
                key=str(submission.id),
                seed={
                    "conversation_id": conversation_id,
                    "target": target.to_json(),
                    "source": message.message_id,
                    "requester": {"user_id": message.user_id, "user_name": message.user_name},
                    "parts": [],
                },
            )
            outcome: Literal["answering", "recorded"] = "answering"
            if message.place.thread is not None:
                place = await tx.doc(PlaceDoc, key=message.place.key, seed={})
                place.value["engaged"] = True
        elif policy.record_unaddressed or message.place.thread is not None:
            note = EntryDraft(
                kind=CORE_USER, model=[UserMessage(content=attributed(message), timestamp=tx.now)]
            )
            submission = await harness.submit_in(
                tx, conversation_id, Write(note, request_id=message.request_id)
            )
            outcome = "recorded"
        else:
            return IntakeResult(conversation_id, None, "ignored")
        await tx.create_doc(  # the first time this message is taken in (the duplicate check above passed)
            MessageDoc,
            key=message.request_id,
            seed={
                "conversation_id": conversation_id,
                "submission_id": submission.id,
                "user_id": message.user_id,
                "user_name": message.user_name,
                "digest": content_digest(message),
            },
        )
        return IntakeResult(conversation_id, submission.id, outcome)

    try:
        result = await harness.commit(commit)
    except (StrictJsonError, RequestIdConflict, ValidationError) as exc:
        log.error(
            "intake refused platform message %s (%d characters by %s); dropped: %s: %s",
            message.request_id,
            len(message.text),
            message.user_id,
            type(exc).__name__,
            exc,
        )
        return IntakeResult(None, None, "refused")
    if result.outcome == "conflict":
        log.error(
            "RequestIdConflict: platform message %s was taken in before (submission %s) with different content; "
            "the new message is dropped. The platform reused a message id (for devchat: was its store replaced?)",
            message.request_id,
            result.submission_id,
        )
    elif result.outcome == "answering":
        harness.resume()
    return result


async def last_seen(bridge: Bridge, place: Place) -> str | None:
    doc = await bridge.harness.snapshot(PlaceDoc, key=place.key)
    return None if doc is None else doc.get("last_seen")
