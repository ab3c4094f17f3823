"""`watch_events`: coding-agent style events for one conversation, derived from committed changes only.

Every batch carries a `cursor` (the commit seq). A client that reconnects passes `after=cursor` and gets the
entries committed since then (derived from storage, where entries live forever) plus the current live state
(run, partial answer, running tools), instead of a full snapshot. A consumer more than 100 batches behind
gets one fresh `snapshot` instead of the backlog.

Event types: snapshot, run_start, run_end, turn_start, turn_end, message_start, message_update (with the
text delta), message_end, entry_appended, tool_execution_start/update/end, inbox_update, submission,
auto_retry_start, compaction_start/end, task_failed, agent_changed, usage_changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness_core._feed import Feed
from harness_core._session import Publication
from harness_core.conversation import load_context
from harness_core.documents import AgentDoc, InboxDoc, LiveDoc, UsageDoc
from harness_core.records import Entry, Submission, Task

if TYPE_CHECKING:
    from harness_core.harness import Harness

EVENT_BUFFER = 100


@dataclass
class EventBatch:
    cursor: int
    events: list[dict[str, Any]] = field(default_factory=list)


def _entry_json(entry: Entry) -> dict[str, Any]:
    return entry.model_dump(mode="json", exclude_none=True)


def _message_text(message: dict[str, Any] | None) -> str:
    if not message:
        return ""
    return "".join(p.get("text", "") for p in message.get("content", []) if p.get("type") == "text")


class EventStream(Feed[EventBatch]):
    """Async iterator of `EventBatch`es. Use `async with watch_events(...) as stream: async for batch in stream`."""

    limit = EVENT_BUFFER

    def __init__(self, harness: Harness, conversation_id: int, after: int | None) -> None:
        super().__init__(harness)
        self.conversation_id = conversation_id
        self._after = after
        self._live: dict[str, Any] = {}
        self._last_seq = 0
        self._turns: set[int] = set()

    async def first(self) -> tuple[EventBatch, int]:
        batch = await (self.snapshot() if self._after is None else self._resume(self._after))
        return batch, batch.cursor

    async def snapshot(self) -> EventBatch:
        harness = self._harness
        seq = harness.session.last_seq
        view = await load_context(harness, self.conversation_id)
        live = await harness.snapshot(LiveDoc, self.conversation_id) or {}
        inbox = await harness.snapshot(InboxDoc, self.conversation_id) or {"items": []}
        self._live = live
        self._last_seq = seq
        return EventBatch(
            cursor=seq,
            events=[
                {
                    "type": "snapshot",
                    "entries": [_entry_json(e) for e in view.entries],
                    "run": live.get("run"),
                    "generation": live.get("generation"),
                    "tools": live.get("tools", []),
                    "compactions": live.get("compactions", []),
                    "inbox": [{"id": i["id"], "mode": i["mode"]} for i in inbox.get("items", [])],
                    "agent": await harness.snapshot(AgentDoc, self.conversation_id) or {},
                    "usage": await harness.snapshot(UsageDoc, self.conversation_id) or {},
                }
            ],
        )

    async def _resume(self, after: int) -> EventBatch:
        """Everything committed after `after` that a client needs to converge, without a snapshot."""
        harness = self._harness
        seq = harness.session.last_seq
        events: list[dict[str, Any]] = []
        storage = harness.session.storage
        cursor = None
        while True:
            page = await storage.scan_entries(self.conversation_id, order="asc", limit=500, cursor=cursor)
            for entry in page.items:
                if entry.seq > after:
                    events.extend(self._entry_events(entry))
            cursor = page.cursor
            if cursor is None:
                break
        sub_cursor = None
        while True:
            subs = await storage.scan_submissions(
                conversation_id=self.conversation_id, limit=500, cursor=sub_cursor
            )
            for submission in subs.items:
                if submission.seq > after:
                    events.append({"type": "submission", "record": submission.model_dump(mode="json")})
            sub_cursor = subs.cursor
            if sub_cursor is None:
                break
        live = await harness.snapshot(LiveDoc, self.conversation_id) or {}
        inbox = await harness.snapshot(InboxDoc, self.conversation_id) or {"items": []}
        self._live = {}
        events.extend(self._live_events(live))
        events.append(
            {"type": "inbox_update", "items": [{"id": i["id"], "mode": i["mode"]} for i in inbox["items"]]}
        )
        self._last_seq = seq
        return EventBatch(cursor=seq, events=[{"type": "resume", "after": after}, *events])

    # --- translating commits to events -------------------------------------------------------------------------

    def _entry_events(self, entry: Entry) -> list[dict[str, Any]]:
        data = _entry_json(entry)
        if entry.model:
            return [{"type": "message_start", "entry": data}, {"type": "message_end", "entry": data}]
        return [{"type": "entry_appended", "entry": data}]

    def _live_events(self, live: dict[str, Any]) -> list[dict[str, Any]]:
        """Diff the previous `core.live` value against the new one."""
        before = self._live
        events: list[dict[str, Any]] = []
        run_before, run_after = before.get("run"), live.get("run")
        if run_after is not None and (
            run_before is None or run_before.get("inputs", [None])[:1] != run_after.get("inputs", [None])[:1]
        ):
            if run_before is not None:
                events.append({"type": "run_end", "inputs": run_before.get("inputs", [])})
            events.append({"type": "run_start", "inputs": run_after.get("inputs", [])})
        elif run_after is None and run_before is not None:
            events.append({"type": "run_end", "inputs": run_before.get("inputs", [])})
        gen_before = before.get("generation") or {}
        gen_after = live.get("generation") or {}
        msg_before, msg_after = gen_before.get("message"), gen_after.get("message")
        if msg_after is not None:
            if msg_before is None or gen_before.get("attempt") != gen_after.get("attempt"):
                events.append(
                    {"type": "message_start", "partial": msg_after, "attempt": gen_after.get("attempt")}
                )
            else:
                old_text, new_text = _message_text(msg_before), _message_text(msg_after)
                delta = new_text[len(old_text) :] if new_text.startswith(old_text) else None
                events.append({"type": "message_update", "partial": msg_after, "delta": delta})
        if gen_after.get("retry") and gen_after.get("retry") != gen_before.get("retry"):
            retry = gen_after["retry"]
            events.append(
                {
                    "type": "auto_retry_start",
                    "attempt": gen_after.get("attempt"),
                    "at": retry.get("at"),
                    "error": retry.get("error"),
                }
            )
        slots_before = {s["call_id"]: s for s in before.get("tools", [])}
        for slot in live.get("tools", []):
            previous = slots_before.get(slot["call_id"], {})
            if slot.get("status") == "running" and previous.get("status") != "running":
                events.append(
                    {
                        "type": "tool_execution_start",
                        "tool_call_id": slot["call_id"],
                        "tool_name": slot["name"],
                        "args": slot.get("arguments"),
                    }
                )
            if slot.get("status") == "running" and (
                slot.get("output") != previous.get("output") or slot.get("details") != previous.get("details")
            ):
                events.append(
                    {
                        "type": "tool_execution_update",
                        "tool_call_id": slot["call_id"],
                        "tool_name": slot["name"],
                        "output": slot.get("output"),
                        "details": slot.get("details"),
                    }
                )
            if slot.get("status") == "done" and previous.get("status") != "done":
                events.append(
                    {
                        "type": "tool_execution_end",
                        "tool_call_id": slot["call_id"],
                        "tool_name": slot["name"],
                        "entry": slot.get("entry"),
                    }
                )
        comp_before = {c["task_id"] for c in before.get("compactions", [])}
        comp_after = {c["task_id"]: c for c in live.get("compactions", [])}
        for task_id, status in comp_after.items():
            if task_id not in comp_before:
                events.append(
                    {
                        "type": "compaction_start",
                        "task_id": task_id,
                        "reason": status.get("reason"),
                        "blocking": status.get("blocking"),
                    }
                )
        for task_id in comp_before - set(comp_after):
            events.append({"type": "compaction_end", "task_id": task_id})
        self._live = live
        return events

    def translate(self, publication: Publication) -> EventBatch | None:
        cid = self.conversation_id
        events: list[dict[str, Any]] = []
        docs = {
            d.record.kind: d
            for d in publication.docs
            if d.record.scope == "conversation" and d.record.scope_id == cid
        }
        if "core.live" in docs:
            events.extend(self._live_events(docs["core.live"].value or {}))
        for entry in publication.entries:
            if entry.conversation_id == cid:
                events.extend(self._entry_events(entry))
        for task in publication.tasks:
            if task.conversation_id != cid:
                continue
            events.extend(self._task_events(task))
        for submission in sorted(publication.submissions, key=lambda s: s.id):
            if submission.conversation_id == cid:
                events.append({"type": "submission", "record": _submission_json(submission)})
        if "core.inbox" in docs:
            items = (docs["core.inbox"].value or {}).get("items", [])
            events.append(
                {"type": "inbox_update", "items": [{"id": i["id"], "mode": i["mode"]} for i in items]}
            )
        if "core.agent" in docs:
            events.append({"type": "agent_changed", "agent": docs["core.agent"].value or {}})
        if "core.usage" in docs:
            events.append({"type": "usage_changed", "usage": docs["core.usage"].value or {}})
        if not events:
            return None
        return EventBatch(cursor=publication.seq, events=events)

    def _task_events(self, task: Task) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if task.kind == "core.generation" and task.live and task.id not in self._turns:
            self._turns.add(task.id)
            events.append({"type": "turn_start", "task_id": task.id})
        if (
            task.kind == "core.generation"
            and task.state.status in ("terminal", "completing")
            and task.state.outcome is not None
        ):
            events.append({"type": "turn_end", "task_id": task.id, "status": task.state.outcome.status})
        if (
            task.state.status == "terminal"
            and task.state.outcome is not None
            and task.state.outcome.status in ("faulted", "orphaned")
        ):
            message = (
                task.state.outcome.error.message if task.state.outcome.error else task.state.outcome.reason
            )
            events.append({"type": "task_failed", "task_id": task.id, "kind": task.kind, "message": message})
        return events


def _submission_json(submission: Submission) -> dict[str, Any]:
    return submission.model_dump(mode="json")


def watch_events(harness: Harness, conversation_id: int, *, after: int | None = None) -> EventStream:
    """Events for one conversation. With `after` (a cursor from an earlier batch), resume from there."""
    return EventStream(harness, conversation_id, after)
