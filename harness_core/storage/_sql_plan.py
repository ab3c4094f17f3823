"""A commit planned into table rows before any I/O, shared by the SQL backends (SQLite, PostgreSQL).

Serializing every record first means a value that cannot be serialized refuses the commit before anything is
written (a certain outcome, unlike a failed write). The rows are driver-neutral: booleans stay `bool` (SQLite
binds them as 0/1), the record JSON is whatever the backend's `dump` returns (text for SQLite, bytes for
PostgreSQL), and columns a backend adds (PostgreSQL's partition) are written by its SQL, not carried here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from harness_core.errors import StrictJsonError
from harness_core.records import DocumentContent
from harness_core.storage._protocol import CommitBatch

# The meta row holds a reservation above what is used, rewritten only when commits pass it.
ID_BLOCK = 4096
SEQ_BLOCK = 1024

Dump = Callable[[BaseModel], Any]


@dataclass
class CommitPlan:
    """The rows of one commit. Row shapes (the SQL of each backend binds them in this order):

    - conversations `(id, owner_task_id, json)`, entries `(id, conversation_id, head, json)`,
    - tasks `(id, conversation_id, kind, live, json)`, submissions `(id, conversation_id, request_id, status,
      json)`,
    - docs `(id, kind, scope, scope_id, key, rewindable, created_seq, retired_seq, json)`,
    - contents `(doc_id, seq, part, is_base, json)`, bases `(doc_id, seq, part)` (a new base: older revisions
      of a current-only document can go), retires `(seq, doc_id)`.
    """

    conversations: list[tuple[Any, ...]] = field(default_factory=list)
    entries: list[tuple[Any, ...]] = field(default_factory=list)
    tasks: list[tuple[Any, ...]] = field(default_factory=list)
    submissions: list[tuple[Any, ...]] = field(default_factory=list)
    docs: list[tuple[Any, ...]] = field(default_factory=list)
    contents: list[tuple[Any, ...]] = field(default_factory=list)
    bases: list[tuple[Any, ...]] = field(default_factory=list)
    retires: list[tuple[int, int]] = field(default_factory=list)
    ingress_finished: list[int] = field(default_factory=list)  # ingress record ids (PostgreSQL only)
    next_id: int = 0
    last_seq: int = 0
    reserve: tuple[int, int] | None = None  # a new (next_id, last_seq) reservation to write into meta

    def statements(self, sql: Sequence[str]) -> list[tuple[str, list[tuple[Any, ...]]]]:
        """Pair the backend's statements (insert conversation, entry, upsert task, submission, insert doc,
        content, reclaim before base) with their rows, in the order the memory backend applies a batch."""
        rows = (
            self.conversations,
            self.entries,
            self.tasks,
            self.submissions,
            self.docs,
            self.contents,
            self.bases,
        )
        return list(zip(sql, rows, strict=True))


def plan_commit(batches: Sequence[CommitBatch], next_id: int, dump: Dump) -> CommitPlan:
    plan = CommitPlan(next_id=next_id)
    parts: dict[tuple[int, int], int] = {}  # revisions so far per (document, seq)

    def part(doc_id: int, seq: int) -> int:
        n = parts[doc_id, seq] = parts.get((doc_id, seq), -1) + 1
        return n

    for batch in batches:
        plan.ingress_finished.extend(batch.ingress_finished)
        for conv in batch.conversations:
            plan.conversations.append((conv.id, conv.owner_task_id, dump(conv)))
        for e in batch.entries:
            plan.entries.append((e.id, e.conversation_id, e.head, dump(e)))
        for t in batch.tasks:
            plan.tasks.append((t.id, t.conversation_id, t.kind, t.live, dump(t)))
        for s in batch.submissions:
            plan.submissions.append((s.id, s.conversation_id, s.request_id, s.status, dump(s)))
        for create in batch.doc_creates:
            r = create.record
            rewindable = r.scope == "conversation" and r.history == "rewindable"
            plan.docs.append(
                (r.id, r.kind, r.scope, r.scope_id, r.key, rewindable, r.created_seq, r.retired_seq, dump(r))
            )
            content = DocumentContent(seq=batch.seq, version=create.version, base=create.value)
            plan.contents.append((r.id, batch.seq, part(r.id, batch.seq), True, dump(content)))
        for change in batch.doc_changes:
            rev = change.content
            n = part(change.id, rev.seq)
            plan.contents.append((change.id, rev.seq, n, rev.is_base, dump(rev)))
            if rev.is_base:
                plan.bases.append((change.id, rev.seq, n))
        for doc_id in batch.doc_retires:
            plan.retires.append((batch.seq, doc_id))
        plan.next_id = max(plan.next_id, batch.next_id)
        plan.last_seq = batch.seq
    return plan


def plan_or_refuse(
    batches: Sequence[CommitBatch],
    next_id: int,
    reserved: tuple[int, int],
    dump: Dump,
    description: str,
    *,
    id_stride: int = 1,
) -> CommitPlan:
    """Plan a commit (ids from `next_id` on) and reserve a new block when it passes
    `reserved` (`ID_BLOCK` ids of this partition: a partition mints every `id_stride`-th id). A value that cannot be serialized (the harness checks values first, so only a caller of the
    storage itself gets here) refuses the commit with `StrictJsonError`: nothing was written, so the outcome
    is certain, unlike a failure of the write."""
    try:
        plan = plan_commit(batches, next_id, dump)
    except (ValueError, TypeError, RecursionError) as exc:  # PydanticSerializationError is a ValueError
        raise StrictJsonError(f"storage {description} refused a commit before writing it: {exc}") from exc
    if plan.next_id > reserved[0] or plan.last_seq > reserved[1]:
        plan.reserve = (plan.next_id + ID_BLOCK * id_stride, plan.last_seq + SEQ_BLOCK)
    return plan
