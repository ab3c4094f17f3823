"""Submissions and the inbox (DESIGN.md §2.5), all inside commit callbacks.

A conversation is busy while `core.live.run` exists (a run: the generation tasks answering its inputs).
Idle: an input is placed at once and a run starts in the same commit. Busy: it waits in `core.inbox`; steers
are placed after the current tool round and join the run, follow-ups start the next run when the current one
answers, writes are placed at every boundary.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from harness_core._json import WRAPPED_DEPTH, clean_text, strict_copy
from harness_core.documents import InboxDoc, LiveDoc
from harness_core.errors import ConversationBusy, RequestIdConflict
from harness_core.messages import ImageContent, TextContent, UserMessage
from harness_core.records import CORE_USER, EntryDraft, Submission, WhenBusy

if TYPE_CHECKING:
    from harness_core._tx import Tx
    from harness_core.harness import Harness

UserContent = str | list[TextContent | ImageContent]


@dataclass(frozen=True)
class Input:
    """A user input. `request_id` makes submission exactly-once per conversation. The content must be strict
    JSON text (`StrictJsonError` otherwise): clean text from outside with `clean_text` first."""

    content: UserContent
    request_id: str | None = None
    when_busy: WhenBusy = "followUp"


@dataclass(frozen=True)
class Write:
    """An entry to append at the next boundary (never starts a model call). Its data and messages are stored as
    given: a value that is not strict JSON raises `StrictJsonError` naming its path, nothing is converted."""

    entry: EntryDraft
    request_id: str | None = None


def _content_json(content: UserContent) -> Any:
    """The input's content as strict JSON. Python-mode dumps and a strict copy: pydantic's JSON mode would turn
    what is not JSON into something else (NaN into null, a set into a list) instead of refusing it."""
    if isinstance(content, str):
        return strict_copy(content, "input content")
    return strict_copy([part.model_dump() for part in content], "input content")


def entry_json(entry: EntryDraft) -> dict[str, Any]:
    """A written entry as strict JSON, as queued in `core.inbox` and hashed: nothing coerced, so the entry placed
    later is the entry given; a value that is not strict JSON raises `StrictJsonError` naming its path."""
    dumped = entry.model_dump(exclude_none=True)
    data = entry.data
    dumped.pop("data", None)
    out: dict[str, Any] = strict_copy(dumped, f"entry {entry.kind}", limit=WRAPPED_DEPTH)
    if data is not None:
        out["data"] = strict_copy(data, f"entry {entry.kind} data")
    return out


def _payload_json(draft: Input | Write) -> tuple[Any, Any]:
    if isinstance(draft, Input):
        content = _content_json(draft.content)
        return {"type": "input", "content": content}, content
    entry = entry_json(draft.entry)
    return {"type": "write", "entry": entry}, entry


def payload_hash(draft: Input | Write) -> str:
    return _hash(_payload_json(draft)[0])


def _hash(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


async def admit(harness: Harness, tx: Tx, conversation_id: int, draft: Input | Write) -> Submission:
    """Admit a submission: dedupe by request id, then place at once or queue.

    The content is checked first (strict JSON, DESIGN.md §2.3): a value that is not raises `StrictJsonError`
    naming its path and nothing is written.
    """
    payload, checked = _payload_json(draft)
    digest = _hash(payload)
    kind: Literal["input", "write"] = "input" if isinstance(draft, Input) else "write"
    if draft.request_id is not None:
        existing = await tx.submission_by_request(conversation_id, draft.request_id)
        if existing is not None:
            if existing.type != kind or existing.payload_hash != digest:
                raise RequestIdConflict(
                    f"request id {draft.request_id!r} was already used in conversation {conversation_id} "
                    f"for a different {existing.type}"
                )
            return existing
    # Read first; take a draft (a copy, diffed at commit) only of what this admission changes.
    busy = "run" in (await tx.snapshot(LiveDoc, conversation_id) or {})
    queued = bool((await tx.snapshot(InboxDoc, conversation_id) or {}).get("items"))
    submission_id = tx.mint_id()
    base = Submission(
        id=submission_id,
        conversation_id=conversation_id,
        request_id=draft.request_id,
        type=kind,
        status="queued",
        payload_hash=digest,
    )
    if isinstance(draft, Input):
        if busy and draft.when_busy == "reject":
            raise ConversationBusy(f"conversation {conversation_id} is busy")
        if busy or queued:
            mode = "steer" if draft.when_busy == "steer" else "followUp"
            inbox = await tx.doc(InboxDoc, conversation_id)
            inbox.value["items"].append({"id": submission_id, "mode": mode, "content": checked})
            tx.put_submission(base)
            if not busy:
                await final_boundary(harness, tx, conversation_id, settle_inputs=None)
            return await _reread(tx, submission_id)
        entry = place_user(tx, conversation_id, checked)
        tx.put_submission(base.model_copy(update={"status": "placed", "entry": entry.id}))
        await start_run(harness, tx, conversation_id, [submission_id])
        return await _reread(tx, submission_id)
    if busy or queued:
        inbox = await tx.doc(InboxDoc, conversation_id)
        inbox.value["items"].append({"id": submission_id, "mode": "write", "entry": checked})
        tx.put_submission(base)
        if not busy:
            await final_boundary(harness, tx, conversation_id, settle_inputs=None)
        return await _reread(tx, submission_id)
    tx.put_submission(base)
    await place_write(tx, conversation_id, submission_id, checked)
    return await _reread(tx, submission_id)


async def _reread(tx: Tx, submission_id: int) -> Submission:
    found = await tx.submission(submission_id)
    assert found is not None
    return found


def place_user(tx: Tx, conversation_id: int, content: Any) -> Any:
    message = UserMessage(content=content, timestamp=tx.now)
    return tx.append_entry(conversation_id, EntryDraft(kind=CORE_USER, model=[message]))


async def place_write(tx: Tx, conversation_id: int, submission_id: int, entry_json: dict[str, Any]) -> bool:
    """Append a write's entry, or settle it `stale` if its head reaches before the active range."""
    draft = EntryDraft.model_validate(entry_json)
    submission = await tx.submission(submission_id)
    assert submission is not None
    if isinstance(draft.head, int):
        marker = await tx.latest_head(conversation_id)
        range_start = marker.head if marker is not None and marker.head is not None else 0
        if draft.head < range_start:
            tx.put_submission(
                submission.model_copy(update={"status": "unanswered", "reason": "stale", "detail": None})
            )
            return False
    entry = tx.append_entry(conversation_id, draft)
    tx.put_submission(submission.model_copy(update={"status": "done", "entry": entry.id}))
    return True


async def start_run(harness: Harness, tx: Tx, conversation_id: int, inputs: list[int]) -> int:
    """Create the generation task that answers `inputs` and record the run in `core.live`."""
    live = await tx.doc(LiveDoc, conversation_id)
    task = await harness.create_task_in(tx, "core.generation", {}, conversation_id=conversation_id)
    live.value["run"] = {"task_id": task.id, "inputs": list(inputs)}
    return task.id


async def settle_inputs(
    tx: Tx,
    inputs: list[int],
    *,
    answer: int | None = None,
    reason: str | None = None,
    detail: str | None = None,
) -> None:
    for submission_id in inputs:
        submission = await tx.submission(submission_id)
        if submission is None or submission.status not in ("queued", "placed"):
            continue
        if answer is not None and submission.status == "placed":
            tx.put_submission(submission.model_copy(update={"status": "done", "answer": answer}))
        else:
            tx.put_submission(
                submission.model_copy(
                    update={
                        "status": "unanswered",
                        "reason": reason or "aborted",
                        # Detail is an error text, which may quote outside text: made valid, never refused.
                        "detail": None if detail is None else clean_text(detail),
                    }
                )
            )


@dataclass
class Selection:
    writes: list[dict[str, Any]] = field(default_factory=list)
    users: list[dict[str, Any]] = field(default_factory=list)
    reset: bool = False


async def select(
    harness: Harness, tx: Tx, conversation_id: int, boundary: Literal["final", "post_tools"]
) -> Selection:
    """Choose the inbox items a boundary places, remove them from the inbox, and place them."""
    inbox = await tx.doc(InboxDoc, conversation_id)
    items: list[dict[str, Any]] = inbox.value["items"]
    settings = harness.settings
    writes = [item for item in items if item["mode"] == "write"]
    reset = any(item["entry"].get("head") == "self" for item in writes)
    steers = [item for item in items if item["mode"] == "steer"]
    follow_ups = (
        [item for item in items if item["mode"] == "followUp"] if boundary == "final" or reset else []
    )
    if settings.steering_mode == "one-at-a-time":
        steers = steers[:1]
    if settings.follow_up_mode == "one-at-a-time":
        follow_ups = follow_ups[:1]
    users = sorted([*steers, *follow_ups], key=lambda item: int(item["id"]))
    chosen = {int(item["id"]) for item in [*writes, *users]}
    inbox.value["items"] = [item for item in items if int(item["id"]) not in chosen]
    for item in sorted(writes, key=lambda item: int(item["id"])):
        await place_write(tx, conversation_id, int(item["id"]), item["entry"])
    for item in users:
        entry = place_user(tx, conversation_id, item["content"])
        submission = await tx.submission(int(item["id"]))
        if submission is not None:
            tx.put_submission(submission.model_copy(update={"status": "placed", "entry": entry.id}))
    return Selection(writes=writes, users=users, reset=reset)


async def final_boundary(
    harness: Harness,
    tx: Tx,
    conversation_id: int,
    *,
    settle_inputs: tuple[list[int], int] | None,
    continuation: Any = None,
) -> int | None:
    """Apply the final boundary: settle the run's inputs (answered), place queued items, start the next run.

    With a `continuation` (from an `on_yield` hook) and no user item or reset selected, the run continues with
    a new user entry instead of settling. Returns the successor generation task id, if any.
    """
    live = await tx.doc(LiveDoc, conversation_id)
    selection = await select(harness, tx, conversation_id, "final")
    run = live.value.get("run")
    if continuation is not None and not selection.users and not selection.reset and run is not None:
        place_user(tx, conversation_id, continuation)
        task = await harness.create_task_in(tx, "core.generation", {}, conversation_id=conversation_id)
        run["task_id"] = task.id
        live.value.pop("generation", None)
        return task.id
    if settle_inputs is not None:
        inputs, answer = settle_inputs
        await _settle_answered(tx, inputs, answer)
    live.value.pop("run", None)
    live.value.pop("generation", None)
    live.value.pop("tools", None)
    if selection.users:
        return await start_run(harness, tx, conversation_id, [int(item["id"]) for item in selection.users])
    return None


STOPPED = "stopped"  # the abort reason of `Conversation.abort`'s tasks: what queued after it stays queued


async def end_run_unanswered(
    harness: Harness,
    tx: Tx,
    conversation_id: int,
    task_id: int,
    *,
    reason: str,
    detail: str | None = None,
    queue_goes_on: bool = True,
) -> bool:
    """The run of generation task `task_id` ends without an answer (model error, no model, an abort, a faulted
    or orphaned generation): its inputs become unanswered (`reason`, `detail`), the run leaves the live view,
    and what is queued goes on per `after_failed_run` (`queue_goes_on=False`: a stop, which withdrew the
    queue; what arrived since stays queued). Nothing happens when that run is no longer the conversation's;
    returns whether it ended it."""
    live = await tx.doc(LiveDoc, conversation_id)
    run = live.value.get("run")
    if run is None or run.get("task_id") != task_id:
        return False
    await settle_inputs(tx, [int(i) for i in run.get("inputs", [])], reason=reason, detail=detail)
    for key in ("run", "generation", "tools"):
        live.value.pop(key, None)
    if queue_goes_on:
        await after_failed_run(harness, tx, conversation_id)
    return True


async def after_failed_run(harness: Harness, tx: Tx, conversation_id: int) -> None:
    """A run has just ended without an answer (model error, no model, a faulted or orphaned generation).

    With `after_failed_run = "continue"` the queued items are placed now, as if the run had answered, so the
    next run starts in this commit: in a chat the message queued behind a failed one is often someone else's,
    and holding it until someone speaks again would silence the channel. `"hold"` keeps them queued until the
    next submission's boundary (pi-durable's rule).
    """
    if harness.settings.after_failed_run == "continue":
        await final_boundary(harness, tx, conversation_id, settle_inputs=None)


async def _settle_answered(tx: Tx, inputs: list[int], answer: int) -> None:
    await settle_inputs(tx, inputs, answer=answer)


async def withdraw_inputs(tx: Tx, conversation_id: int) -> list[int]:
    """Withdraw every queued input (writes stay): they become unanswered/aborted."""
    inbox = await tx.doc(InboxDoc, conversation_id)
    withdrawn = [int(item["id"]) for item in inbox.value["items"] if item["mode"] != "write"]
    inbox.value["items"] = [item for item in inbox.value["items"] if item["mode"] == "write"]
    await settle_inputs(tx, withdrawn, reason="aborted")
    return withdrawn
