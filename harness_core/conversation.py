"""Handles: `ConversationHandle` and `SubmissionHandle`. Stateless (an id and the harness); compare by id."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from harness_core._ancestry import ancestry
from harness_core._feed import Feed
from harness_core._inbox import STOPPED, Input, Write, admit, withdraw_inputs
from harness_core._session import Publication
from harness_core.agent import AgentChange, ResolvedAgent
from harness_core.context import ContextView, derive_context, extend_context
from harness_core.documents import BUILTIN_DOCS, AgentDoc, DocDefinition, LiveDoc
from harness_core.errors import HarnessClosed, NotFound, StorageRequestError
from harness_core.messages import UserMessage
from harness_core.records import (
    CORE_RESET,
    Conversation,
    Entry,
    EntryDraft,
    Ownerless,
    Ownership,
    Page,
    Submission,
)

if TYPE_CHECKING:
    from harness_core._tx import Tx
    from harness_core.harness import Harness

T = TypeVar("T")
Order = Literal["asc", "desc"]


class SubmissionHandle:
    def __init__(self, harness: Harness, record: Submission) -> None:
        self._harness = harness
        self.id = record.id
        self.conversation_id = record.conversation_id
        self.record = record  # as admitted

    async def status(self) -> Submission:
        found = await self._harness.session.storage.submission(self.id)
        assert found is not None
        return found

    async def wait(self) -> Submission:
        """Resolve when the input is answered (`done`, with `answer`) or `unanswered` (with `reason`), or a write
        is placed. Cancelling the wait cancels only the wait."""
        return await self._harness.wait_submission(self.id)

    async def abort(self) -> Literal["aborted", "already_placed", "settled"]:
        """Withdraw a queued submission."""
        from harness_core.documents import InboxDoc

        async def withdraw(tx: Tx) -> Literal["aborted", "already_placed", "settled"]:
            record = await tx.submission(self.id)
            assert record is not None
            if record.status == "placed":
                return "already_placed"
            if record.status != "queued":
                return "settled"
            inbox = await tx.doc(InboxDoc, record.conversation_id)
            inbox.value["items"] = [i for i in inbox.value["items"] if int(i["id"]) != self.id]
            tx.put_submission(record.model_copy(update={"status": "unanswered", "reason": "aborted"}))
            return "aborted"

        return await self._harness.commit(withdraw)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubmissionHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("submission", self.id))


class ConversationHandle:
    def __init__(self, harness: Harness, conversation_id: int) -> None:
        self._harness = harness
        self.id = conversation_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConversationHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("conversation", self.id))

    def __repr__(self) -> str:
        return f"ConversationHandle({self.id})"

    @property
    def harness(self) -> Harness:
        return self._harness

    async def record(self) -> Conversation:
        found = await self._harness.session.read_conversation(self.id)
        if found is None:
            raise NotFound(f"conversation {self.id} does not exist")
        return found

    # --- input ------------------------------------------------------------------------------------------------

    async def submit(self, draft: Input | Write) -> SubmissionHandle:
        """Admit an input or a write. With a `request_id`, submitting again returns the first submission."""
        harness = self._harness

        async def run(tx: Tx) -> Submission:
            return await admit(harness, tx, self.id, draft)

        record = await harness.commit(run)
        harness.resume()
        return SubmissionHandle(harness, record)

    async def reset(self, handoff: str | None = None) -> SubmissionHandle:
        """Start the model context afresh (optionally with a handoff message); history stays stored."""
        model = [UserMessage(content=handoff)] if handoff else None
        return await self.submit(Write(entry=EntryDraft(kind=CORE_RESET, head="self", model=model)))

    async def configure(self, change: AgentChange) -> None:
        async def run(tx: Tx) -> None:
            draft = await tx.doc(AgentDoc, self.id)
            draft.value = change.apply(draft.value)

        await self._harness.commit(run)

    async def agent(self) -> ResolvedAgent:
        return await self._harness.resolve_agent(self.id)

    async def commit(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        return await self._harness.commit(fn)

    async def snapshot(self, definition: DocDefinition, key: str | None = None) -> Any:
        return await self._harness.snapshot(definition, self.id, key)

    # --- forks and work -----------------------------------------------------------------------------------------

    async def fork(
        self, at: int, *, ownership: Ownership | None = None, agent: AgentChange | None = None
    ) -> ConversationHandle:
        """A new conversation that sees this one's entries up to and including entry `at`."""

        async def run(tx: Tx) -> int:
            child = await tx.fork_conversation(self.id, at, ownership or Ownerless())
            if agent is not None:
                draft = await tx.doc(AgentDoc, child.id)
                draft.value = agent.apply(draft.value)
            return child.id

        return ConversationHandle(self._harness, await self._harness.commit(run))

    async def compact(self, instructions: str | None = None) -> int:
        """Summarize older entries now (a conversation-owned compaction task). Returns the task id."""
        harness = self._harness

        async def run(tx: Tx) -> int:
            task = await harness.create_task_in(
                tx,
                "core.compaction",
                {"reason": "manual", "instructions": instructions},
                conversation_id=self.id,
            )
            live = await tx.doc(LiveDoc, self.id)
            live.value.setdefault("compactions", []).append(
                {"task_id": task.id, "reason": "manual", "blocking": False, "attempt": 1}
            )
            return task.id

        task_id = await harness.commit(run)
        harness.resume()
        return task_id

    async def abort(self, *, background: bool = False) -> None:
        """Withdraw queued inputs and abort the conversation's live work; resolve when it is idle."""
        harness = self._harness

        async def run(tx: Tx) -> list[int]:
            await withdraw_inputs(tx, self.id)
            marked = []
            for task in tx.live_tasks().values():
                if task.conversation_id != self.id or task.owner_task_id is not None:
                    continue
                if task.background and not background:
                    continue
                if not task.abort_requested:
                    tx.put_task(task.marked_for_abort(STOPPED))
                marked.append(task.id)
            return marked

        marked = await harness.commit(run)
        for task_id in marked:
            invocation = harness.scheduler.invocations.get(task_id)
            if invocation is not None and invocation.mode == "run":
                harness.scheduler.signal_abort(invocation)
        harness.resume()
        for task_id in marked:
            await harness.wait_for_task(task_id)
        await harness.wait_for_idle(self.id)

    async def wait_for_idle(self) -> None:
        await self._harness.wait_for_idle(self.id)

    # --- history and context ------------------------------------------------------------------------------------

    async def ancestry(self) -> list[tuple[int, int | None]]:
        return await ancestry(self.id, self._harness.session.read_conversation)

    async def entries(
        self, limit: int = 50, cursor: dict[str, Any] | None = None, order: Order = "desc"
    ) -> Page[Entry]:
        """Page the fork-aware stored history (newest first by default). Pass `page.cursor` to continue."""
        after: int | None = None
        if cursor is not None:
            if cursor.get("scan") != f"transcript:{self.id}" or not isinstance(cursor.get("after"), int):
                raise StorageRequestError(f"cursor {cursor!r} does not belong to this conversation's history")
            if cursor.get("order") != order:
                raise StorageRequestError(f"cursor is for order {cursor.get('order')!r}, not {order!r}")
            after = cursor["after"]
        chain = await self.ancestry()
        segments = chain if order == "desc" else list(reversed(chain))
        items: list[Entry] = []
        storage = self._harness.session.storage
        for conversation_id, cap in segments:
            if len(items) > limit:
                break
            if order == "desc":
                max_id = cap if after is None else (after - 1 if cap is None else min(cap, after - 1))
                page = await storage.scan_entries(
                    conversation_id, max_id=max_id, order="desc", limit=limit + 1 - len(items)
                )
            else:
                min_id = None if after is None else after + 1
                page = await storage.scan_entries(
                    conversation_id, min_id=min_id, max_id=cap, order="asc", limit=limit + 1 - len(items)
                )
            items.extend(page.items)
        more = len(items) > limit
        items = items[:limit]
        next_cursor = (
            {"scan": f"transcript:{self.id}", "order": order, "after": items[-1].id}
            if more and items
            else None
        )
        return Page(items=items, cursor=next_cursor)

    async def context(self, at: int | None = None) -> ContextView:
        """The model context as of entry `at` (default: the tail): exactly what a fork at `at` starts with."""
        view = await load_context(self._harness, self.id, at)
        # The cached view is shared, and later views extend its lists: the caller gets lists of its own.
        return replace(
            view,
            entries=list(view.entries),
            contributions=[list(group) for group in view.contributions],
            messages=list(view.messages),
            edits=None if view.edits is None else dict(view.edits),
        )

    def watch(self) -> ConversationWatch:
        """Committed changes to this conversation, starting with a snapshot (see `ConversationWatch`)."""
        return ConversationWatch(self._harness, self.id)


async def load_context(harness: Harness, conversation_id: int, cutoff: int | None = None) -> ContextView:
    """The active range (newest head marker through `cutoff`) and the context derived from it. Served from
    the harness's context cache when it holds the conversation (O(new entries)), read otherwise."""
    head, entries = await harness.context_cache.get(
        conversation_id, cutoff, lambda: read_active_range(harness, conversation_id, None)
    )
    if cutoff is not None and head is not None and head.id > cutoff:
        head, entries = await read_active_range(harness, conversation_id, cutoff)  # an earlier point
        return derive_context(head, entries)
    view: ContextView = harness.context_cache.derived(
        conversation_id, entries, lambda: derive_context(head, entries), extend_context
    )
    return view


async def read_active_range(
    harness: Harness, conversation_id: int, cutoff: int | None
) -> tuple[Entry | None, list[Entry]]:
    """Read the newest head marker at or before `cutoff` and the visible entries from its head on. O(range)."""
    handle = ConversationHandle(harness, conversation_id)
    chain = await handle.ancestry()
    storage = harness.session.storage
    head: Entry | None = None
    for conv, cap in chain:
        limit = cap if cutoff is None else (cutoff if cap is None else min(cap, cutoff))
        head = await storage.latest_head(conv, at_or_before=limit)
        if head is not None:
            break
    start = 0 if head is None or head.head is None else head.head
    entries: list[Entry] = []
    for conv, cap in reversed(chain):
        max_id = cap if cutoff is None else (cutoff if cap is None else min(cap, cutoff))
        if max_id is not None and max_id < start:
            continue
        cursor = None
        while True:
            page = await storage.scan_entries(
                conv, min_id=start, max_id=max_id, order="asc", limit=1000, cursor=cursor
            )
            entries.extend(page.items)
            cursor = page.cursor
            if cursor is None:
                break
    return head, entries


# --- watching ---------------------------------------------------------------------------------------------------

WATCH_BUFFER = 100


@dataclass
class WatchFrame:
    """One delivered change. `kind="snapshot"` carries the whole view; `kind="change"` what one commit did."""

    kind: Literal["snapshot", "change"]
    seq: int
    entries: list[Entry] = field(default_factory=list)  # snapshot: the active entries; change: appended ones
    docs: dict[str, Any] = field(default_factory=dict)  # built-in documents: whole new values


class ConversationWatch(Feed[WatchFrame]):
    """An async iterator of committed view changes, starting from a snapshot.

    A consumer that falls more than 100 frames behind gets one fresh snapshot instead of the backlog
    (convergence, not an audit log). Use as `async with conversation.watch() as frames: async for f in frames`.
    """

    limit = WATCH_BUFFER

    def __init__(self, harness: Harness, conversation_id: int) -> None:
        super().__init__(harness)
        self.conversation_id = conversation_id

    async def first(self) -> tuple[WatchFrame, int]:
        frame = await self.snapshot()
        return frame, frame.seq

    async def snapshot(self) -> WatchFrame:
        seq = self._harness.session.last_seq
        view = await load_context(self._harness, self.conversation_id)
        docs = {d.kind: await self._harness.snapshot(d, self.conversation_id) for d in BUILTIN_DOCS}
        return WatchFrame(
            kind="snapshot",
            seq=seq,
            entries=list(view.entries),  # the cached view's list is shared: the consumer gets its own
            docs={k: v for k, v in docs.items() if v is not None},
        )

    def translate(self, publication: Publication) -> WatchFrame | None:
        entries = [e for e in publication.entries if e.conversation_id == self.conversation_id]
        docs = {
            d.record.kind: d.value
            for d in publication.docs
            if d.record.scope == "conversation"
            and d.record.scope_id == self.conversation_id
            and d.record.kind.startswith("core.")
        }
        if not entries and not docs:
            return None
        return WatchFrame(kind="change", seq=publication.seq, entries=entries, docs=docs)


__all__ = [
    "ConversationHandle",
    "ConversationWatch",
    "HarnessClosed",
    "Input",
    "SubmissionHandle",
    "WatchFrame",
    "Write",
]
