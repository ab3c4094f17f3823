"""Record reads shared by the SQL backends (SQLite, PostgreSQL): rows back into records, paged scans, and the
assembly of a document from its record row and its revisions.

Each table holds one row per record with its JSON in `record`; the backends differ only in how a statement is
run and in placeholders (`?` for SQLite, `$1`, `$2`, ... for PostgreSQL). Document lookups whose SQL differs
(`IS ?` against `IS NULL`, index hints) stay in each backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ValidationError

from harness_core.errors import StorageCorrupt, StorageRequestError
from harness_core.records import (
    Conversation,
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
from harness_core.storage._protocol import Order

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R", Conversation, Entry, Task, Submission)

MAX_SEQ = 2**63 - 1


def parse_stored(model: type[M], raw: str | bytes, description: str, what: str) -> M:
    """A record read back from its JSON; JSON that does not make one is a corrupt store."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise StorageCorrupt(f"storage {description} holds an unreadable {what}: {exc}") from exc


def wants_contents(rewindable: Any, created_seq: int, retired_seq: int | None, at_seq: int | None) -> bool:
    """Whether a document read (now, or as of `at_seq`) needs its revisions, judged from its record row."""
    if at_seq is None:
        return retired_seq is None
    return bool(rewindable) and created_seq <= at_seq and (retired_seq is None or at_seq < retired_seq)


class SqlRecordReads:
    """The record reads of `Storage` over a backend's `_rows`/`_scan_rows`. A subclass sets `_numbered`."""

    _numbered: ClassVar[bool]  # placeholders `$1`, `$2`, ... (PostgreSQL) instead of `?` (SQLite)
    _LATEST_HEAD: ClassVar[str]  # the newest entry with a head marker in a conversation at or before an id

    @property
    def description(self) -> str:
        raise NotImplementedError

    async def _rows(self, sql: str, params: Sequence[Any], action: str) -> list[Any]:
        """Rows of a point read."""
        raise NotImplementedError

    async def _scan_rows(self, sql: str, params: Sequence[Any], action: str) -> list[Any]:
        """Rows of a scan (a backend may run scans on a connection of their own)."""
        raise NotImplementedError

    def _own(self) -> list[tuple[str, Any]]:
        """Filters that keep a scan to this handle's own rows (a partition of a shared store), for scans not
        already narrowed by an id: recovery must see only what this handle owns; reads by id see all."""
        return []

    def _mark(self, n: int) -> str:
        return f"${n}" if self._numbered else "?"

    def _parse(self, model: type[M], raw: str | bytes, what: str) -> M:
        return parse_stored(model, raw, self.description, what)

    async def _one(self, model: type[M], table: str, record_id: int) -> M | None:
        sql = f"SELECT record FROM {table} WHERE id = {self._mark(1)}"
        rows = await self._rows(sql, (record_id,), f"read {table}")
        return None if not rows else self._parse(model, rows[0][0], f"{table} row {record_id}")

    async def _scan(
        self,
        model: type[R],
        table: str,
        scan: str,
        filters: list[tuple[str, Any]],
        order: Order,
        limit: int,
        cursor: dict[str, Any] | None,
    ) -> Page[R]:
        """A page of a table in id order. `filters` are `("column = ?", value)` pairs (placeholders are
        numbered here when the backend wants them numbered)."""
        order, after = check_cursor(cursor, order, scan)
        params: list[Any] = []
        clauses: list[str] = []
        for clause, value in filters:
            params.append(value)
            clauses.append(clause.replace("?", self._mark(len(params))) if self._numbered else clause)
        if after is not None:
            params.append(after)
            clauses.append(f"id {'>' if order == 'asc' else '<'} {self._mark(len(params))}")
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        direction = "ASC" if order == "asc" else "DESC"
        limit = max(limit, 0)
        params.append(limit + 1)  # one extra row says whether there is a next page
        sql = f"SELECT record FROM {table}{where} ORDER BY id {direction} LIMIT {self._mark(len(params))}"
        rows = await self._scan_rows(sql, params, f"scan {table}")
        items = [self._parse(model, row[0], f"{table} row") for row in rows[:limit]]
        more = len(rows) > limit
        return Page(items=items, cursor=make_cursor(scan, order, items[-1].id) if more and items else None)

    async def conversation(self, conversation_id: int) -> Conversation | None:
        return await self._one(Conversation, "conversations", conversation_id)

    async def scan_conversations(
        self,
        *,
        owner_task_id: int | None = None,
        order: Order = "asc",
        limit: int = 100,
        cursor: dict[str, Any] | None = None,
    ) -> Page[Conversation]:
        filters = self._own() if owner_task_id is None else [("owner_task_id = ?", owner_task_id)]
        return await self._scan(Conversation, "conversations", "conversations", filters, order, limit, cursor)

    async def entry(self, entry_id: int) -> Entry | None:
        return await self._one(Entry, "entries", entry_id)

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
        filters: list[tuple[str, Any]] = [("conversation_id = ?", conversation_id)]
        if min_id is not None:
            filters.append(("id >= ?", min_id))
        if max_id is not None:
            filters.append(("id <= ?", max_id))
        return await self._scan(Entry, "entries", f"entries:{conversation_id}", filters, order, limit, cursor)

    async def latest_head(self, conversation_id: int, *, at_or_before: int | None = None) -> Entry | None:
        rows = await self._rows(
            self._LATEST_HEAD,
            (conversation_id, MAX_SEQ if at_or_before is None else at_or_before),
            "read head marker",
        )
        return None if not rows else self._parse(Entry, rows[0][0], "entries row")

    async def task(self, task_id: int) -> Task | None:
        return await self._one(Task, "tasks", task_id)

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
        filters: list[tuple[str, Any]] = []
        if live is not None:
            filters.append(("live = ?", live))  # SQLite binds a bool as 0/1
        if conversation_id is not None:
            filters.append(("conversation_id = ?", conversation_id))
        else:
            filters.extend(self._own())
        if kind is not None:
            filters.append(("kind = ?", kind))
        return await self._scan(Task, "tasks", "tasks", filters, order, limit, cursor)

    async def submission(self, submission_id: int) -> Submission | None:
        return await self._one(Submission, "submissions", submission_id)

    async def submission_by_request(self, conversation_id: int, request_id: str) -> Submission | None:
        rows = await self._rows(
            f"SELECT record FROM submissions WHERE conversation_id = {self._mark(1)} "
            f"AND request_id = {self._mark(2)}",
            (conversation_id, request_id),
            "read submission",
        )
        return None if not rows else self._parse(Submission, rows[0][0], "submissions row")

    async def scan_submissions(
        self,
        *,
        conversation_id: int | None = None,
        status: SubmissionStatus | None = None,
        order: Order = "asc",
        limit: int = 100,
        cursor: dict[str, Any] | None = None,
    ) -> Page[Submission]:
        filters: list[tuple[str, Any]] = []
        if conversation_id is not None:
            filters.append(("conversation_id = ?", conversation_id))
        else:
            filters.extend(self._own())
        if status is not None:
            filters.append(("status = ?", status))
        return await self._scan(Submission, "submissions", "submissions", filters, order, limit, cursor)

    # --- documents ----------------------------------------------------------------------------------------

    def _doc_record(self, raw: str | bytes, retired_seq: int | None) -> DocumentRecord:
        # The retired_seq column is authoritative: retiring updates one column instead of rewriting the JSON.
        record = self._parse(DocumentRecord, raw, "document record")
        record.retired_seq = retired_seq
        return record

    def _document_value(
        self, doc_id: int, row: Sequence[Any] | None, content_rows: Sequence[Any], at_seq: int | None
    ) -> DocumentValue | None:
        """The document from its record row `(rewindable, created_seq, retired_seq, record, kind)` and the
        revision rows `wants_contents` asked for (read in one snapshot with the row)."""
        if row is None:
            return None
        rewindable, _, retired, raw, kind = row
        if at_seq is not None and not rewindable:
            raise StorageRequestError(f"document {doc_id} ({kind}) keeps no history; read it without at_seq")
        record = self._doc_record(raw, retired)
        if (retired is not None) if at_seq is None else not record.alive_at(at_seq):
            return None
        contents = [self._parse(DocumentContent, r[0], f"content of document {doc_id}") for r in content_rows]
        return materialize(record, contents, at_seq)

    async def document_contents(self, doc_id: int) -> list[DocumentContent]:
        rows = await self._rows(
            f"SELECT content FROM doc_contents WHERE doc_id = {self._mark(1)} ORDER BY seq, part",
            (doc_id,),
            "read document contents",
        )
        return [self._parse(DocumentContent, r[0], f"content of document {doc_id}") for r in rows]
