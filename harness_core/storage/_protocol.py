"""The storage contract. Small on purpose: commit a batch atomically, read records back, close.

The harness owns the commit line, so backends never see two commits at once and need no mutex of their own.
A backend must:

- apply a group of `CommitBatch`es atomically (the harness groups concurrent commits into one transaction):
  after `commit()` returns every write of every batch is durable (as durable as the backend promises) and
  visible to reads; if it raises, the harness treats the outcome as uncertain and closes. Batches keep their
  own seq so document history stays per commit;
- prepare (serialize) the whole group before writing anything. Preparing is never uncertain: a value that
  cannot be serialized raises `StrictJsonError` with nothing written, and the harness fails only those commits
  and stays open. Only the write itself may be uncertain. (The harness checks every value before a batch gets
  here, so this is a backstop; what a backend stores must read back equal to what it was given);
- return detached values (callers may mutate what they get back);
- keep `next_id` and `last_seq` so a reopened store never reuses an id or a sequence number;
- apply document contents in order: a base replaces the value, a delta is an RFC 6902 patch on the previous
  revision. A missing base, a version change inside a delta tail or a patch that does not apply is corruption
  (`StorageCorrupt`), never absence;
- take an exclusive owner lock when it persists to a file, so a second process gets `StorageLocked`.

A backend shared by processes (PostgreSQL) may also offer `check_owner()`, which raises `LeaseLost` unless this
process still safely owns the store; the harness calls it right before each tool execution, and the bridge
before each platform write.

`harness_core.testing.register_storage_conformance` checks all of this against any backend factory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

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

Order = Literal["asc", "desc"]


@dataclass(frozen=True)
class DocCreate:
    """A new document incarnation with its initial base."""

    record: DocumentRecord
    version: int
    value: Any


@dataclass(frozen=True)
class DocChange:
    """A new revision of an existing incarnation (`content.seq` equals the batch seq)."""

    id: int
    content: DocumentContent


@dataclass
class CommitBatch:
    seq: int  # strictly greater than every earlier batch's seq
    next_id: int  # every id below this may be in use; a reopened store mints from here
    conversations: list[Conversation] = field(default_factory=list)  # created (never rewritten)
    entries: list[Entry] = field(default_factory=list)  # appended (never rewritten)
    tasks: list[Task] = field(default_factory=list)  # whole-record upserts
    submissions: list[Submission] = field(default_factory=list)  # whole-record upserts
    doc_creates: list[DocCreate] = field(default_factory=list)
    doc_changes: list[DocChange] = field(default_factory=list)  # content applied before any retire
    doc_retires: list[int] = field(default_factory=list)  # retired_seq = seq
    # Ingress records this commit took in: marked finished by the same commit (stores that keep them only,
    # `finishes_ingress`), so a record is finished exactly when what it brought in is stored.
    ingress_finished: list[int] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (
            self.conversations
            or self.entries
            or self.tasks
            or self.submissions
            or self.doc_creates
            or self.doc_changes
            or self.doc_retires
            or self.ingress_finished
        )


@dataclass(frozen=True)
class StorageMeta:
    next_id: int
    last_seq: int
    # A partition of a shared store mints only ids with `id % id_stride == id_offset` (from `next_id` on), so
    # ids are unique across the store and say their partition. One-process backends: stride 1, offset 0.
    id_stride: int = 1
    id_offset: int = 0


@runtime_checkable
class Storage(Protocol):
    """What the harness needs from a backend. See the module docstring for the rules."""

    @property
    def description(self) -> str:
        """Where the data lives, for messages (a path, or "memory")."""
        ...

    async def meta(self) -> StorageMeta: ...

    async def commit(self, batches: Sequence[CommitBatch]) -> None:
        """Apply the batches in order, all in one atomic transaction."""
        ...

    # conversations
    async def conversation(self, conversation_id: int) -> Conversation | None: ...

    async def scan_conversations(
        self,
        *,
        owner_task_id: int | None = None,
        order: Order = "asc",
        limit: int = 100,
        cursor: dict[str, Any] | None = None,
    ) -> Page[Conversation]: ...

    # entries (one conversation; the harness composes fork ancestry)
    async def entry(self, entry_id: int) -> Entry | None: ...

    async def scan_entries(
        self,
        conversation_id: int,
        *,
        min_id: int | None = None,
        max_id: int | None = None,
        order: Order = "desc",
        limit: int = 100,
        cursor: dict[str, Any] | None = None,
    ) -> Page[Entry]: ...

    async def latest_head(self, conversation_id: int, *, at_or_before: int | None = None) -> Entry | None:
        """The newest entry of this conversation with `head` set, at or before the given entry id."""
        ...

    # tasks
    async def task(self, task_id: int) -> Task | None: ...

    async def scan_tasks(
        self,
        *,
        live: bool | None = None,
        conversation_id: int | None = None,
        kind: str | None = None,
        order: Order = "asc",
        limit: int = 100,
        cursor: dict[str, Any] | None = None,
    ) -> Page[Task]: ...

    # submissions
    async def submission(self, submission_id: int) -> Submission | None: ...

    async def submission_by_request(self, conversation_id: int, request_id: str) -> Submission | None: ...

    async def scan_submissions(
        self,
        *,
        conversation_id: int | None = None,
        status: SubmissionStatus | None = None,
        order: Order = "asc",
        limit: int = 100,
        cursor: dict[str, Any] | None = None,
    ) -> Page[Submission]: ...

    # documents
    async def find_document(
        self,
        kind: str,
        scope: DocScope,
        scope_id: int | None,
        key: str | None = None,
        *,
        at_seq: int | None = None,
    ) -> DocumentRecord | None:
        """The incarnation at this address that is alive now (at_seq None) or was alive at `at_seq`."""
        ...

    async def document(self, doc_id: int, *, at_seq: int | None = None) -> DocumentValue | None:
        """Materialize an incarnation: now (None if retired), or as of `at_seq` (rewindable documents only;
        None outside its lifetime; a current-only document raises StorageRequestError)."""
        ...

    async def document_contents(self, doc_id: int) -> list[DocumentContent]:
        """Every stored revision of an incarnation, oldest first (diagnostics and tests)."""
        ...

    async def scan_documents(
        self,
        *,
        scope: DocScope,
        scope_id: int | None = None,
        kind: str | None = None,
        alive_only: bool = True,
    ) -> list[DocumentRecord]: ...

    async def close(self) -> None: ...
