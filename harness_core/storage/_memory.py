"""The in-memory backend: the reference semantics. Nothing survives the process.

It copies on every write and read, so code that works against it cannot depend on sharing objects with the
store, which is what a serializing backend would do to it.
"""

from __future__ import annotations

import bisect
import copy
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, TypeVar

from harness_core.errors import StorageClosed, StorageRequestError, StrictJsonError
from harness_core.records import (
    Conversation,
    DocScope,
    DocumentContent,
    DocumentRecord,
    DocumentValue,
    Entry,
    Page,
    Submission,
    SubmissionStatus,
    Task,
)
from harness_core.storage._common import check_cursor, make_cursor, materialize
from harness_core.storage._protocol import CommitBatch, Order, StorageMeta

R = TypeVar("R", Conversation, Entry, Task, Submission)


def _page(items: list[R], order: Order, limit: int, cursor: dict[str, Any] | None, scan: str) -> Page[R]:
    """Page over items sorted ascending by id."""
    order, after = check_cursor(cursor, order, scan)
    ordered = items if order == "asc" else list(reversed(items))
    if after is not None:
        ordered = [i for i in ordered if (i.id > after if order == "asc" else i.id < after)]
    chosen = ordered[:limit]
    more = len(ordered) > limit
    next_cursor = make_cursor(scan, order, chosen[-1].id) if more and chosen else None
    return Page(items=[i.model_copy(deep=True) for i in chosen], cursor=next_cursor)


class MemoryStorage:
    def __init__(self) -> None:
        self._closed = False
        self._next_id = 1
        self._last_seq = 0
        self._conversations: dict[int, Conversation] = {}
        self._entries: dict[int, Entry] = {}
        self._entries_by_conv: dict[int, list[int]] = defaultdict(list)
        self._tasks: dict[int, Task] = {}
        self._submissions: dict[int, Submission] = {}
        self._by_request: dict[tuple[int, str], int] = {}
        self._doc_records: dict[int, DocumentRecord] = {}
        self._doc_contents: dict[int, list[DocumentContent]] = defaultdict(list)

    @classmethod
    async def open(cls) -> MemoryStorage:
        return cls()

    @property
    def description(self) -> str:
        return "memory"

    def _check(self) -> None:
        if self._closed:
            raise StorageClosed("memory storage is closed")

    async def meta(self) -> StorageMeta:
        self._check()
        return StorageMeta(next_id=self._next_id, last_seq=self._last_seq)

    async def commit(self, batches: Sequence[CommitBatch]) -> None:
        self._check()
        last = self._last_seq
        known = set(self._doc_records)
        for batch in batches:
            if batch.seq <= last:
                raise StorageRequestError(f"commit seq {batch.seq} is not after {last}")
            if batch.ingress_finished:
                raise StorageRequestError("this storage keeps no ingress records to finish")
            last = batch.seq
            # Validate everything before applying anything, so a bad group leaves the store untouched.
            known.update(create.record.id for create in batch.doc_creates)
            unknown = [c.id for c in batch.doc_changes if c.id not in known] + [
                d for d in batch.doc_retires if d not in known
            ]
            if unknown:
                raise StorageRequestError(f"commit seq {batch.seq} changes unknown documents {unknown}")
        try:
            copies = copy.deepcopy(list(batches))
        except (TypeError, ValueError, RecursionError, copy.Error) as exc:  # an object that cannot be copied
            raise StrictJsonError(f"memory storage refused a commit before applying it: {exc}") from exc
        for batch in copies:
            self._apply(batch)

    def _apply(self, batch: CommitBatch) -> None:
        for conversation in batch.conversations:
            self._conversations[conversation.id] = conversation
        for entry in batch.entries:
            self._entries[entry.id] = entry
            bisect.insort(self._entries_by_conv[entry.conversation_id], entry.id)
        for task in batch.tasks:
            self._tasks[task.id] = task
        for submission in batch.submissions:
            self._submissions[submission.id] = submission
            if submission.request_id is not None:
                self._by_request[(submission.conversation_id, submission.request_id)] = submission.id
        for create in batch.doc_creates:
            self._doc_records[create.record.id] = create.record
            self._doc_contents[create.record.id] = [
                DocumentContent(seq=batch.seq, version=create.version, base=create.value)
            ]
        for change in batch.doc_changes:
            record = self._doc_records[change.id]
            contents = self._doc_contents[change.id]
            if change.content.is_base and not self._rewindable(record):
                contents.clear()  # a base of a current-only document makes older revisions reclaimable
            contents.append(change.content)
        for doc_id in batch.doc_retires:
            record = self._doc_records[doc_id]
            self._doc_records[doc_id] = record.model_copy(update={"retired_seq": batch.seq})
            if not self._rewindable(record):
                self._doc_contents.pop(doc_id, None)  # nothing can read a retired current-only document
        self._next_id = max(self._next_id, batch.next_id)
        self._last_seq = batch.seq

    @staticmethod
    def _rewindable(record: DocumentRecord) -> bool:
        return record.scope == "conversation" and record.history == "rewindable"

    async def conversation(self, conversation_id: int) -> Conversation | None:
        self._check()
        found = self._conversations.get(conversation_id)
        return None if found is None else found.model_copy(deep=True)

    async def scan_conversations(
        self,
        *,
        owner_task_id: int | None = None,
        order: Order = "asc",
        limit: int = 100,
        cursor: dict[str, Any] | None = None,
    ) -> Page[Conversation]:
        self._check()
        items = sorted(
            (
                c
                for c in self._conversations.values()
                if owner_task_id is None or c.owner_task_id == owner_task_id
            ),
            key=lambda c: c.id,
        )
        return _page(items, order, limit, cursor, "conversations")

    async def entry(self, entry_id: int) -> Entry | None:
        self._check()
        found = self._entries.get(entry_id)
        return None if found is None else found.model_copy(deep=True)

    async def scan_entries(
        self,
        conversation_id: int,
        *,
        min_id: int | None = None,
        max_id: int | None = None,
        order: Order = "desc",
        limit: int = 100,
        cursor: dict[str, Any] | None = None,
    ) -> Page[Entry]:
        self._check()
        ids = self._entries_by_conv.get(conversation_id, [])
        lo = 0 if min_id is None else bisect.bisect_left(ids, min_id)
        hi = len(ids) if max_id is None else bisect.bisect_right(ids, max_id)
        items = [self._entries[i] for i in ids[lo:hi]]
        return _page(items, order, limit, cursor, f"entries:{conversation_id}")

    async def latest_head(self, conversation_id: int, *, at_or_before: int | None = None) -> Entry | None:
        self._check()
        ids = self._entries_by_conv.get(conversation_id, [])
        hi = len(ids) if at_or_before is None else bisect.bisect_right(ids, at_or_before)
        for index in range(hi - 1, -1, -1):
            entry = self._entries[ids[index]]
            if entry.head is not None:
                return entry.model_copy(deep=True)
        return None

    async def task(self, task_id: int) -> Task | None:
        self._check()
        found = self._tasks.get(task_id)
        return None if found is None else found.model_copy(deep=True)

    async def scan_tasks(
        self,
        *,
        live: bool | None = None,
        conversation_id: int | None = None,
        kind: str | None = None,
        order: Order = "asc",
        limit: int = 100,
        cursor: dict[str, Any] | None = None,
    ) -> Page[Task]:
        self._check()
        items = sorted(
            (
                t
                for t in self._tasks.values()
                if (live is None or t.live == live)
                and (conversation_id is None or t.conversation_id == conversation_id)
                and (kind is None or t.kind == kind)
            ),
            key=lambda t: t.id,
        )
        return _page(items, order, limit, cursor, "tasks")

    async def submission(self, submission_id: int) -> Submission | None:
        self._check()
        found = self._submissions.get(submission_id)
        return None if found is None else found.model_copy(deep=True)

    async def submission_by_request(self, conversation_id: int, request_id: str) -> Submission | None:
        self._check()
        found = self._by_request.get((conversation_id, request_id))
        return None if found is None else self._submissions[found].model_copy(deep=True)

    async def scan_submissions(
        self,
        *,
        conversation_id: int | None = None,
        status: SubmissionStatus | None = None,
        order: Order = "asc",
        limit: int = 100,
        cursor: dict[str, Any] | None = None,
    ) -> Page[Submission]:
        self._check()
        items = sorted(
            (
                s
                for s in self._submissions.values()
                if (conversation_id is None or s.conversation_id == conversation_id)
                and (status is None or s.status == status)
            ),
            key=lambda s: s.id,
        )
        return _page(items, order, limit, cursor, "submissions")

    async def find_document(
        self,
        kind: str,
        scope: DocScope,
        scope_id: int | None,
        key: str | None = None,
        *,
        at_seq: int | None = None,
    ) -> DocumentRecord | None:
        self._check()
        best: DocumentRecord | None = None
        for record in self._doc_records.values():
            if (
                record.kind != kind
                or record.scope != scope
                or record.scope_id != scope_id
                or record.key != key
            ):
                continue
            alive = record.retired_seq is None if at_seq is None else record.alive_at(at_seq)
            if alive and (best is None or record.id > best.id):
                best = record
        return None if best is None else best.model_copy(deep=True)

    async def document(self, doc_id: int, *, at_seq: int | None = None) -> DocumentValue | None:
        self._check()
        record = self._doc_records.get(doc_id)
        if record is None:
            return None
        if at_seq is None:
            if record.retired_seq is not None:
                return None
            return materialize(record.model_copy(deep=True), self._doc_contents[doc_id])
        if not self._rewindable(record):
            raise StorageRequestError(
                f"document {doc_id} ({record.kind}) keeps no history; read it without at_seq"
            )
        if not record.alive_at(at_seq):
            return None
        return materialize(record.model_copy(deep=True), self._doc_contents[doc_id], at_seq)

    async def document_contents(self, doc_id: int) -> list[DocumentContent]:
        self._check()
        return [c.model_copy(deep=True) for c in self._doc_contents.get(doc_id, [])]

    async def scan_documents(
        self,
        *,
        scope: DocScope,
        scope_id: int | None = None,
        kind: str | None = None,
        alive_only: bool = True,
    ) -> list[DocumentRecord]:
        self._check()
        return [
            r.model_copy(deep=True)
            for r in sorted(self._doc_records.values(), key=lambda r: r.id)
            if r.scope == scope
            and r.scope_id == scope_id
            and (kind is None or r.kind == kind)
            and (not alive_only or r.retired_seq is None)
        ]

    async def close(self) -> None:
        self._closed = True
