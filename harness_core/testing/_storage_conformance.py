"""The storage conformance suite. Public entry point: `harness_core.testing.register_storage_conformance`.

The expected values are those of `MemoryStorage`, the reference semantics.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from harness_core.errors import StorageClosed, StorageCorrupt, StorageRequestError, StrictJsonError
from harness_core.messages import AssistantMessage, TextContent, ToolCall, Usage, UserMessage
from harness_core.records import (
    ContextEdit,
    Conversation,
    DocHistory,
    DocScope,
    DocumentContent,
    DocumentRecord,
    Entry,
    Outcome,
    ParentRef,
    Submission,
    SubmissionStatus,
    Task,
    TaskState,
    TaskStatus,
)
from harness_core.storage._protocol import CommitBatch, DocChange, DocCreate, Storage, StorageMeta

StorageFactory = Callable[[Path], Awaitable[Storage]]
"""Makes a fresh, empty storage whose files (if any) live under the given per-test directory."""

StorageReopen = Callable[[Storage, Path], Awaitable[Storage]]
"""Closes the given storage and opens the same data again."""


def marks(meta: StorageMeta) -> tuple[int, int]:
    """The counters a commit moves (`next_id`, `last_seq`), without the store's id layout."""
    return (meta.next_id, meta.last_seq)


class StoreUnderTest:
    """What a conformance test works with: the current storage, and `commit()`, which in the reopen variant
    closes and reopens the storage after every successful commit."""

    def __init__(
        self, storage: Storage, tmp_path: Path, reopen: StorageReopen | None, reopen_each: bool
    ) -> None:
        self.storage = storage
        self._tmp_path = tmp_path
        self._reopen = reopen
        self._reopen_each = reopen_each

    @property
    def s(self) -> Storage:
        return self.storage

    async def commit(self, *batches: CommitBatch) -> None:
        await self.storage.commit(list(batches))
        if self._reopen_each:
            await self.reopen()

    async def reopen(self) -> bool:
        """Reopen when the backend can; returns whether it did."""
        if self._reopen is None:
            return False
        self.storage = await self._reopen(self.storage, self._tmp_path)
        return True

    async def close(self) -> None:
        await self.storage.close()


# --- record builders ----------------------------------------------------------------------------------------


def batch(seq: int, *, next_id: int = 1000, **writes: Any) -> CommitBatch:
    return CommitBatch(seq=seq, next_id=next_id, **writes)


def conv(conversation_id: int, *, owner: int | None = None, parent: ParentRef | None = None) -> Conversation:
    return Conversation(id=conversation_id, owner_task_id=owner, parent=parent)


def entry(entry_id: int, conversation_id: int, *, head: int | None = None, seq: int = 0) -> Entry:
    return Entry(
        id=entry_id,
        conversation_id=conversation_id,
        kind="test.note",
        data={"n": entry_id},
        head=head,
        seq=seq,
    )


def task(
    task_id: int,
    conversation_id: int,
    *,
    kind: str = "test.work",
    status: TaskStatus = "pending",
    seq: int = 0,
) -> Task:
    if status == "terminal":
        state = TaskState(status=status, outcome=Outcome(status="completed", result={"ok": True}))
    else:
        state = TaskState(status=status, checkpoint={"phase": "start"})
    return Task(id=task_id, conversation_id=conversation_id, kind=kind, state=state, seq=seq)


def sub(
    submission_id: int,
    conversation_id: int,
    *,
    request_id: str | None = None,
    status: SubmissionStatus = "queued",
) -> Submission:
    return Submission(
        id=submission_id, conversation_id=conversation_id, request_id=request_id, type="input", status=status
    )


def doc(
    doc_id: int,
    created_seq: int,
    *,
    kind: str = "test.doc",
    scope: DocScope = "session",
    scope_id: int | None = None,
    key: str | None = None,
    history: DocHistory = "latest",
) -> DocumentRecord:
    return DocumentRecord(
        id=doc_id,
        kind=kind,
        key=key,
        scope=scope,
        scope_id=scope_id,
        history=history,
        created_seq=created_seq,
    )


def create(record: DocumentRecord, value: Any, version: int = 1) -> DocCreate:
    return DocCreate(record=record, version=version, value=value)


def base(doc_id: int, seq: int, value: Any, version: int = 1) -> DocChange:
    return DocChange(id=doc_id, content=DocumentContent(seq=seq, version=version, base=value))


def delta(doc_id: int, seq: int, *ops: dict[str, Any], version: int = 1) -> DocChange:
    return DocChange(id=doc_id, content=DocumentContent(seq=seq, version=version, delta=list(ops)))


def add(path: str, value: Any) -> dict[str, Any]:
    return {"op": "add", "path": path, "value": value}


async def _page_ids(fetch: Callable[[dict[str, Any] | None], Awaitable[Any]]) -> list[list[int]]:
    """Follow cursors to the end; returns the ids of each page."""
    pages: list[list[int]] = []
    cursor: dict[str, Any] | None = None
    while True:
        page = await fetch(cursor)
        pages.append([item.id for item in page.items])
        cursor = page.cursor
        if cursor is None:
            return pages
        assert len(pages) < 100, "a scan never stopped returning cursors"


# --- the suite ----------------------------------------------------------------------------------------------


class _StorageConformance:
    """The tests. `register_storage_conformance` subclasses this with a `store` fixture per backend."""

    # --- basics -------------------------------------------------------------------------------------------

    async def test_fresh_store_is_empty(self, store: StoreUnderTest) -> None:
        s = store.s
        assert isinstance(s, Storage)
        assert isinstance(s.description, str)
        assert s.description
        meta = await s.meta()
        # A fresh store mints from its first id: 1, or in a partition of a shared store (`id_stride` > 1) the
        # partition's first id.
        assert meta.last_seq == 0
        assert 0 <= meta.id_offset < meta.id_stride
        assert meta.next_id == (1 if meta.id_stride == 1 else meta.id_offset or meta.id_stride)
        assert await s.conversation(1) is None
        assert await s.entry(1) is None
        assert await s.task(1) is None
        assert await s.submission(1) is None
        assert await s.submission_by_request(1, "r") is None
        assert await s.latest_head(1) is None
        assert (await s.scan_conversations()).items == []
        assert (await s.scan_entries(1)).items == []
        assert (await s.scan_tasks()).items == []
        assert (await s.scan_submissions()).items == []
        assert await s.find_document("test.doc", "session", None) is None
        assert await s.document(1) is None
        assert await s.document_contents(1) == []
        assert await s.scan_documents(scope="session") == []

    async def test_commit_group_applies_every_batch_in_order(self, store: StoreUnderTest) -> None:
        await store.commit(
            batch(
                1,
                next_id=10,
                conversations=[conv(1)],
                entries=[entry(2, 1, seq=1)],
                tasks=[task(3, 1, seq=1)],
            ),
            batch(2, next_id=12, entries=[entry(4, 1, seq=2)], tasks=[task(3, 1, status="running", seq=2)]),
            batch(
                3, next_id=11, entries=[entry(5, 1, head=5, seq=3)], submissions=[sub(6, 1, request_id="r")]
            ),
        )
        s = store.s
        assert marks(await s.meta()) == (12, 3)
        assert [e.id for e in (await s.scan_entries(1, order="asc")).items] == [2, 4, 5]
        assert [e.seq for e in (await s.scan_entries(1, order="asc")).items] == [1, 2, 3]
        found = await s.task(3)
        assert found is not None
        assert found.state.status == "running"
        assert found.seq == 2
        assert await s.submission_by_request(1, "r") == sub(6, 1, request_id="r")

    async def test_seq_must_increase_and_a_rejected_group_writes_nothing(self, store: StoreUnderTest) -> None:
        await store.commit(batch(5, next_id=10, conversations=[conv(1)]))
        for bad in (
            [batch(5)],
            [batch(4)],
            [batch(6, entries=[entry(2, 1)]), batch(6, entries=[entry(3, 1)])],
        ):
            with pytest.raises(StorageRequestError):
                await store.s.commit(bad)
        s = store.s
        assert marks(await s.meta()) == (10, 5)
        assert await s.entry(2) is None
        assert await s.entry(3) is None
        await store.commit(batch(6, next_id=10, entries=[entry(2, 1)]))
        assert await store.s.entry(2) == entry(2, 1)
        assert (await store.s.meta()).last_seq == 6

    async def test_meta_never_goes_back_and_survives_reopen(self, store: StoreUnderTest) -> None:
        await store.commit(batch(1, next_id=10, conversations=[conv(1)]))
        await store.commit(batch(2, next_id=5))  # an older next_id does not lower the mark
        await store.commit(batch(7, next_id=11))  # seqs may skip; an empty batch still advances last_seq
        expected = (11, 7)
        assert marks(await store.s.meta()) == expected
        await store.reopen()
        assert marks(await store.s.meta()) == expected
        assert await store.s.conversation(1) == conv(1)
        with pytest.raises(StorageRequestError):
            await store.s.commit([batch(7)])

    async def test_empty_commit_changes_nothing(self, store: StoreUnderTest) -> None:
        await store.commit(batch(1, next_id=30, conversations=[conv(1)]))
        await store.s.commit([])
        assert marks(await store.s.meta()) == (30, 1)

    # --- records ------------------------------------------------------------------------------------------

    async def test_records_round_trip(self, store: StoreUnderTest) -> None:
        child = Conversation(
            id=2, parent=ParentRef(conversation_id=1, at=4), owner_task_id=3, owner_conversation_id=1, seq=1
        )
        rich_entry = Entry(
            id=4,
            conversation_id=1,
            kind="core.assistant",
            model=[
                UserMessage(content='héllo ✓ "quoted"\nnew line', timestamp=1),
                AssistantMessage(
                    content=[
                        TextContent(text="hi"),
                        ToolCall(id="c1", name="lookup", arguments={"q": [1, 2.5, None, {"deep": True}]}),
                    ],
                    stop_reason="toolUse",
                    usage=Usage(input=3, output=4, cost=0.125),
                    provider="p",
                    model="m",
                    timestamp=2,
                ),
            ],
            data={"nested": {"list": [1, "two", 3.5, False, None]}, "empty": {}, "unicode": "日本"},
            head=4,
            edits=[ContextEdit(target=2, action="omit")],
            by_task_id=3,
            seq=1,
        )
        rich_task = Task(
            id=3,
            conversation_id=1,
            kind="test.work",
            version=2,
            input={"x": [1, 2]},
            owner_task_id=9,
            background=True,
            abort_requested=True,
            abort_reason="stop",
            state=TaskState(status="waiting", checkpoint={"phase": "wait", "n": 1}, on=[7, 8], deadline=123),
            memos={"m": {"v": 1}},
            restarts=2,
            parked=True,
            started_at=10,
            ended_at=None,
            seq=1,
        )
        rich_sub = Submission(
            id=5,
            conversation_id=1,
            request_id="req-1",
            type="write",
            status="done",
            payload_hash="abc",
            entry=4,
            answer=4,
            reason="r",
            detail="d",
            seq=1,
        )
        await store.commit(
            batch(
                1,
                conversations=[conv(1), child],
                entries=[rich_entry],
                tasks=[rich_task],
                submissions=[rich_sub],
            )
        )
        s = store.s
        assert await s.conversation(2) == child
        assert await s.entry(4) == rich_entry
        assert await s.task(3) == rich_task
        assert await s.submission(5) == rich_sub
        assert await s.submission_by_request(1, "req-1") == rich_sub

    async def test_values_are_detached(self, store: StoreUnderTest) -> None:
        written = entry(2, 1)
        record = doc(3, 1)
        committed = batch(
            1, conversations=[conv(1)], entries=[written], doc_creates=[create(record, {"a": [1]})]
        )
        await store.commit(committed)
        written.data["n"] = "changed by the caller after commit"
        record.kind = "changed"
        s = store.s
        got = await s.entry(2)
        assert got == entry(2, 1)
        assert got is not None
        got.data["n"] = "changed by a reader"
        value = await s.document(3)
        assert value is not None
        value.value["a"].append(2)
        value.record.kind = "changed by a reader"
        contents = await s.document_contents(3)
        contents[0].base["a"].append(3)
        found = await s.find_document("test.doc", "session", None)
        assert found is not None
        found.retired_seq = 99
        assert await s.entry(2) == entry(2, 1)
        again = await s.document(3)
        assert again is not None
        assert again.value == {"a": [1]}
        assert again.record == doc(3, 1)
        assert await s.document_contents(3) == [DocumentContent(seq=1, version=1, base={"a": [1]})]
        assert await s.find_document("test.doc", "session", None) == doc(3, 1)

    async def test_scan_conversations_by_owner(self, store: StoreUnderTest) -> None:
        owners = {1: None, 2: 10, 3: 11, 4: 10, 5: 10}
        await store.commit(batch(1, conversations=[conv(i, owner=o) for i, o in owners.items()]))
        s = store.s
        assert [c.id for c in (await s.scan_conversations()).items] == [1, 2, 3, 4, 5]
        assert [c.id for c in (await s.scan_conversations(owner_task_id=11)).items] == [3]
        assert (await s.scan_conversations(owner_task_id=99)).items == []

        async def owned(order: Any, cursor: dict[str, Any] | None) -> Any:
            return await s.scan_conversations(owner_task_id=10, order=order, limit=2, cursor=cursor)

        assert await _page_ids(lambda c: owned("asc", c)) == [[2, 4], [5]]
        assert await _page_ids(lambda c: owned("desc", c)) == [[5, 4], [2]]

    # --- entries ------------------------------------------------------------------------------------------

    async def test_scan_entries_bounds_order_and_paging(self, store: StoreUnderTest) -> None:
        # Conversation 1 has the even ids 2..20, conversation 2 the odd ids 3..21.
        await store.commit(batch(1, conversations=[conv(1), conv(2)]))
        await store.commit(batch(2, entries=[entry(i, 1 if i % 2 == 0 else 2) for i in range(2, 22)]))
        s = store.s
        assert [e.id for e in (await s.scan_entries(1)).items] == list(
            range(20, 1, -2)
        )  # default: newest first
        assert [e.id for e in (await s.scan_entries(2, order="asc")).items] == list(range(3, 22, 2))
        assert [e.id for e in (await s.scan_entries(1, min_id=6, max_id=12, order="asc")).items] == [
            6,
            8,
            10,
            12,
        ]
        assert [e.id for e in (await s.scan_entries(1, min_id=7, max_id=11)).items] == [10, 8]
        assert [e.id for e in (await s.scan_entries(1, max_id=6, limit=2)).items] == [6, 4]
        assert (await s.scan_entries(3)).items == []

        def scan(order: Any, limit: int, **bounds: Any) -> Callable[[dict[str, Any] | None], Awaitable[Any]]:
            return lambda c: s.scan_entries(1, order=order, limit=limit, cursor=c, **bounds)

        assert await _page_ids(scan("asc", 4)) == [[2, 4, 6, 8], [10, 12, 14, 16], [18, 20]]
        assert await _page_ids(scan("desc", 4)) == [[20, 18, 16, 14], [12, 10, 8, 6], [4, 2]]
        assert await _page_ids(scan("asc", 5)) == [
            [2, 4, 6, 8, 10],
            [12, 14, 16, 18, 20],
        ]  # no empty last page
        assert await _page_ids(scan("desc", 2, min_id=5, max_id=14)) == [[14, 12], [10, 8], [6]]

        first = await s.scan_entries(1, order="desc", limit=3)
        assert first.cursor is not None
        with pytest.raises(StorageRequestError):
            await s.scan_entries(1, order="asc", limit=3, cursor=first.cursor)
        with pytest.raises(StorageRequestError):
            await s.scan_entries(2, order="desc", limit=3, cursor=first.cursor)
        with pytest.raises(StorageRequestError):
            await s.scan_tasks(cursor=first.cursor, order="desc")
        with pytest.raises(StorageRequestError):
            await s.scan_entries(1, cursor={"bogus": 1})
        resumed = await s.scan_entries(1, order="desc", limit=3, cursor=first.cursor)
        assert [e.id for e in resumed.items] == [14, 12, 10]

    async def test_latest_head_with_cutoff(self, store: StoreUnderTest) -> None:
        await store.commit(batch(1, conversations=[conv(1), conv(2)]))
        await store.commit(
            batch(
                2,
                entries=[
                    entry(3, 1),
                    entry(4, 1, head=4),
                    entry(5, 1),
                    entry(6, 2, head=6),
                    entry(7, 1, head=4),
                    entry(8, 1),
                    entry(9, 2),
                ],
            )
        )
        s = store.s

        async def head_id(conversation_id: int, at: int | None = None) -> int | None:
            found = await s.latest_head(conversation_id, at_or_before=at)
            return None if found is None else found.id

        assert await head_id(1) == 7
        assert await head_id(1, 7) == 7
        assert await head_id(1, 6) == 4
        assert await head_id(1, 4) == 4
        assert await head_id(1, 3) is None
        assert await head_id(2) == 6
        assert await head_id(2, 5) is None
        assert await head_id(3) is None
        assert await s.latest_head(1) == entry(7, 1, head=4)

    # --- tasks and submissions ----------------------------------------------------------------------------

    async def test_task_filters_and_replacement(self, store: StoreUnderTest) -> None:
        await store.commit(batch(1, conversations=[conv(1), conv(2)]))
        await store.commit(
            batch(
                2,
                tasks=[
                    task(3, 1, kind="a"),
                    task(4, 1, kind="b", status="terminal"),
                    task(5, 2, kind="a", status="waiting"),
                    task(6, 2, kind="b"),
                    task(7, 1, kind="a", status="running"),
                ],
            )
        )
        s = store.s

        async def ids(**filters: Any) -> list[int]:
            return [t.id for t in (await s.scan_tasks(**filters)).items]

        assert await ids() == [3, 4, 5, 6, 7]
        assert await ids(live=True) == [3, 5, 6, 7]
        assert await ids(live=False) == [4]
        assert await ids(conversation_id=1) == [3, 4, 7]
        assert await ids(kind="a") == [3, 5, 7]
        assert await ids(kind="a", conversation_id=1, live=True, order="desc") == [7, 3]
        assert await ids(kind="c") == []
        assert await _page_ids(lambda c: s.scan_tasks(live=True, order="desc", limit=3, cursor=c)) == [
            [7, 6, 5],
            [3],
        ]

        await store.commit(batch(3, tasks=[task(3, 1, kind="a", status="terminal", seq=3)]))
        s = store.s
        assert await ids(live=True) == [5, 6, 7]
        assert await ids(live=False) == [3, 4]
        assert await s.task(3) == task(3, 1, kind="a", status="terminal", seq=3)
        assert await s.task(99) is None

    async def test_submissions_by_id_request_and_filters(self, store: StoreUnderTest) -> None:
        await store.commit(batch(1, conversations=[conv(1), conv(2)]))
        await store.commit(
            batch(
                2,
                submissions=[
                    sub(3, 1, request_id="r1"),
                    sub(4, 2, request_id="r1"),
                    sub(5, 1, request_id=None, status="placed"),
                    sub(6, 1, request_id="r2", status="done"),
                    sub(7, 2, status="queued"),
                ],
            )
        )
        s = store.s
        assert await s.submission(5) == sub(5, 1, status="placed")
        assert await s.submission(99) is None
        assert await s.submission_by_request(1, "r1") == sub(3, 1, request_id="r1")
        assert await s.submission_by_request(2, "r1") == sub(4, 2, request_id="r1")
        assert await s.submission_by_request(1, "nope") is None
        assert await s.submission_by_request(3, "r1") is None

        async def ids(**filters: Any) -> list[int]:
            return [x.id for x in (await s.scan_submissions(**filters)).items]

        assert await ids() == [3, 4, 5, 6, 7]
        assert await ids(conversation_id=1) == [3, 5, 6]
        assert await ids(status="queued") == [3, 4, 7]
        assert await ids(conversation_id=2, status="queued", order="desc") == [7, 4]
        assert await _page_ids(lambda c: s.scan_submissions(order="asc", limit=2, cursor=c)) == [
            [3, 4],
            [5, 6],
            [7],
        ]

        await store.commit(batch(3, submissions=[sub(3, 1, request_id="r1", status="done")]))
        s = store.s
        assert await ids(status="done") == [3, 6]
        assert await ids(status="queued") == [4, 7]
        assert await s.submission_by_request(1, "r1") == sub(3, 1, request_id="r1", status="done")

    # --- documents ----------------------------------------------------------------------------------------

    async def test_document_create_and_delta_chain(self, store: StoreUnderTest) -> None:
        await store.commit(batch(1, doc_creates=[create(doc(10, 1), {"items": []})]))
        await store.commit(batch(2, doc_changes=[delta(10, 2, add("/items/-", "a"))]))
        await store.commit(batch(3, doc_changes=[delta(10, 3, add("/items/-", "b"), add("/n", 2))]))
        s = store.s
        assert await s.find_document("test.doc", "session", None) == doc(10, 1)
        value = await s.document(10)
        assert value is not None
        assert value.record == doc(10, 1)
        assert (value.version, value.value, value.deltas_since_base) == (1, {"items": ["a", "b"], "n": 2}, 2)
        assert [(c.seq, c.is_base) for c in await s.document_contents(10)] == [
            (1, True),
            (2, False),
            (3, False),
        ]
        assert (await s.document_contents(10))[1] == delta(10, 2, add("/items/-", "a")).content

    async def test_base_replaces_older_content_of_current_only_documents(self, store: StoreUnderTest) -> None:
        await store.commit(batch(1, conversations=[conv(1)], tasks=[task(2, 1)]))
        records = [
            doc(10, 2),
            doc(11, 2, scope="conversation", scope_id=1, history="latest"),
            doc(12, 2, scope="task", scope_id=2),
        ]
        await store.commit(batch(2, doc_creates=[create(r, {"v": 0}) for r in records]))
        await store.commit(batch(3, doc_changes=[delta(r.id, 3, add("/v", 1)) for r in records]))
        await store.commit(batch(4, doc_changes=[base(r.id, 4, {"v": 2, "fresh": True}) for r in records]))
        await store.commit(batch(5, doc_changes=[delta(r.id, 5, add("/v", 3)) for r in records]))
        s = store.s
        for r in records:
            assert [(c.seq, c.is_base) for c in await s.document_contents(r.id)] == [(4, True), (5, False)]
            value = await s.document(r.id)
            assert value is not None
            assert (value.value, value.deltas_since_base) == ({"v": 3, "fresh": True}, 1)

    async def test_version_bump_through_a_base(self, store: StoreUnderTest) -> None:
        await store.commit(batch(1, doc_creates=[create(doc(10, 1), {"old": 1})]))
        await store.commit(batch(2, doc_changes=[delta(10, 2, add("/old", 2))]))
        await store.commit(batch(3, doc_changes=[base(10, 3, {"new": 1}, version=2)]))
        await store.commit(batch(4, doc_changes=[delta(10, 4, add("/new", 2), version=2)]))
        value = await store.s.document(10)
        assert value is not None
        assert (value.version, value.value, value.deltas_since_base) == (2, {"new": 2}, 1)

    async def test_several_revisions_of_a_document_in_one_commit(self, store: StoreUnderTest) -> None:
        # A fork copies a document and changes it in the same commit: a create and a change share one seq.
        rewindable = doc(10, 2, scope="conversation", scope_id=1, history="rewindable")
        latest = doc(11, 2, kind="test.latest", scope="conversation", scope_id=1)
        await store.commit(batch(1, conversations=[conv(1)]))
        await store.commit(
            batch(
                2,
                doc_creates=[create(rewindable, {"n": 0}), create(latest, {"n": 0})],
                doc_changes=[delta(10, 2, add("/n", 1)), base(11, 2, {"n": 1})],
            )
        )
        s = store.s

        async def read(doc_id: int, at_seq: int | None = None) -> tuple[Any, int] | None:
            found = await s.document(doc_id, at_seq=at_seq)
            return None if found is None else (found.value, found.deltas_since_base)

        assert await read(10) == ({"n": 1}, 1)
        assert await read(10, 2) == ({"n": 1}, 1)
        assert [(c.seq, c.is_base) for c in await s.document_contents(10)] == [(2, True), (2, False)]
        assert await read(11) == ({"n": 1}, 0)
        assert await s.document_contents(11) == [base(11, 2, {"n": 1}).content]
        # One commit group may also change a document in consecutive batches.
        await store.commit(
            batch(3, doc_changes=[delta(10, 3, add("/m", 3))]),
            batch(4, doc_changes=[base(10, 4, {"b": 4})]),
            batch(5, doc_changes=[delta(10, 5, add("/c", 5))]),
        )
        s = store.s
        assert await read(10) == ({"b": 4, "c": 5}, 1)
        assert await read(10, 3) == ({"n": 1, "m": 3}, 2)
        assert [c.seq for c in await s.document_contents(10)] == [2, 2, 3, 4, 5]

    async def test_rewindable_history_reads(self, store: StoreUnderTest) -> None:
        record = doc(10, 2, kind="test.agent", scope="conversation", scope_id=1, history="rewindable")
        await store.commit(batch(1, conversations=[conv(1)]))
        await store.commit(batch(2, doc_creates=[create(record, {"n": 0})]))
        await store.commit(batch(3, doc_changes=[delta(10, 3, add("/n", 1))]))
        await store.commit(batch(4, doc_changes=[base(10, 4, {"n": 2, "b": True})]))
        await store.commit(batch(5, doc_changes=[delta(10, 5, add("/n", 3))]))
        s = store.s
        assert [c.seq for c in await s.document_contents(10)] == [2, 3, 4, 5]  # history is never reclaimed

        async def at(seq: int | None) -> tuple[Any, int] | None:
            found = await s.document(10, at_seq=seq)
            return None if found is None else (found.value, found.deltas_since_base)

        assert await at(1) is None  # before it was created
        assert await at(2) == ({"n": 0}, 0)
        assert await at(3) == ({"n": 1}, 1)
        assert await at(4) == ({"n": 2, "b": True}, 0)
        assert await at(5) == ({"n": 3, "b": True}, 1)
        assert await at(50) == ({"n": 3, "b": True}, 1)
        assert await at(None) == ({"n": 3, "b": True}, 1)

    async def test_retire_and_recreate_make_a_new_incarnation(self, store: StoreUnderTest) -> None:
        address: dict[str, Any] = {"kind": "test.agent", "scope": "conversation", "scope_id": 1}
        first = doc(10, 2, history="rewindable", **address)
        second = doc(11, 4, history="rewindable", **address)
        await store.commit(batch(1, conversations=[conv(1)]))
        await store.commit(batch(2, doc_creates=[create(first, {"gen": 1})]))
        await store.commit(batch(3, doc_changes=[delta(10, 3, add("/x", 1))]))
        # Retire and recreate in one commit: the new incarnation is current from that seq on.
        await store.commit(
            batch(
                4,
                doc_changes=[delta(10, 4, add("/last", True))],
                doc_retires=[10],
                doc_creates=[create(second, {"gen": 2})],
            )
        )
        s = store.s
        retired = first.model_copy(update={"retired_seq": 4})
        assert await s.find_document("test.agent", "conversation", 1) == second
        assert await s.find_document("test.agent", "conversation", 1, at_seq=3) == retired
        assert await s.find_document("test.agent", "conversation", 1, at_seq=4) == second
        assert await s.find_document("test.agent", "conversation", 1, at_seq=1) is None
        assert await s.document(10) is None  # never follows the replacement
        old = await s.document(10, at_seq=3)
        assert old is not None
        assert old.record == retired
        assert old.value == {"gen": 1, "x": 1}
        assert await s.document(10, at_seq=4) is None  # the lifetime is half-open
        new = await s.document(11)
        assert new is not None
        assert new.value == {"gen": 2}
        assert await s.scan_documents(scope="conversation", scope_id=1) == [second]
        assert await s.scan_documents(scope="conversation", scope_id=1, alive_only=False) == [retired, second]

    async def test_retired_current_only_document(self, store: StoreUnderTest) -> None:
        record = doc(10, 1, scope="session")
        await store.commit(batch(1, doc_creates=[create(record, {"a": 1})]))
        await store.commit(batch(2, doc_changes=[delta(10, 2, add("/b", 2))]))
        before = await store.s.document_contents(10)
        await store.commit(batch(3, doc_changes=[delta(10, 3, add("/c", 3))], doc_retires=[10]))
        s = store.s
        assert await s.document(10) is None
        assert await s.find_document("test.doc", "session", None) is None
        assert await s.find_document("test.doc", "session", None, at_seq=2) == record.model_copy(
            update={"retired_seq": 3}
        )
        with pytest.raises(StorageRequestError):
            await s.document(10, at_seq=2)
        # Nothing can read a retired current-only document's content, so a backend may reclaim it.
        assert await s.document_contents(10) in ([], [*before, delta(10, 3, add("/c", 3)).content])
        # A new incarnation at the address gets a new id.
        await store.commit(batch(4, doc_creates=[create(doc(11, 4), {"fresh": 1})]))
        assert await store.s.find_document("test.doc", "session", None) == doc(11, 4)

    async def test_current_only_documents_refuse_reads_by_seq(self, store: StoreUnderTest) -> None:
        await store.commit(batch(1, conversations=[conv(1)], tasks=[task(2, 1)]))
        records = [
            doc(10, 2),
            doc(11, 2, scope="conversation", scope_id=1, history="latest"),
            doc(12, 2, scope="task", scope_id=2),
        ]
        await store.commit(batch(2, doc_creates=[create(r, {"v": 0}) for r in records]))
        for r in records:
            with pytest.raises(StorageRequestError):
                await store.s.document(r.id, at_seq=2)
            assert await store.s.find_document(r.kind, r.scope, r.scope_id, at_seq=2) == r
        assert await store.s.document(99, at_seq=2) is None  # an unknown id is absent, not refused

    async def test_create_and_retire_in_one_commit_has_an_empty_lifetime(self, store: StoreUnderTest) -> None:
        record = doc(10, 1, scope="conversation", scope_id=1, history="rewindable")
        await store.commit(
            batch(1, conversations=[conv(1)], doc_creates=[create(record, {})], doc_retires=[10])
        )
        s = store.s
        retired = record.model_copy(update={"retired_seq": 1})
        assert await s.find_document("test.doc", "conversation", 1) is None
        assert await s.find_document("test.doc", "conversation", 1, at_seq=1) is None
        assert await s.document(10) is None
        assert await s.document(10, at_seq=1) is None
        assert await s.scan_documents(scope="conversation", scope_id=1, alive_only=False) == [retired]

    async def test_addresses_keys_and_scopes(self, store: StoreUnderTest) -> None:
        await store.commit(batch(1, conversations=[conv(1), conv(2)]))
        records = [
            doc(10, 2, kind="test.fam", scope="conversation", scope_id=1, key="a"),
            doc(11, 2, kind="test.fam", scope="conversation", scope_id=1, key="b"),
            doc(12, 2, kind="test.fam", scope="conversation", scope_id=1),
            doc(13, 2, kind="test.fam", scope="conversation", scope_id=2, key="a"),
            doc(14, 2, kind="test.other", scope="conversation", scope_id=1),
            doc(15, 2, kind="test.fam", scope="session", key="a"),
        ]
        await store.commit(batch(2, doc_creates=[create(r, {"id": r.id}) for r in records]))
        s = store.s
        for r in records:
            assert await s.find_document(r.kind, r.scope, r.scope_id, r.key) == r
            value = await s.document(r.id)
            assert value is not None
            assert value.value == {"id": r.id}
        assert await s.find_document("test.fam", "conversation", 1, "c") is None
        assert await s.find_document("test.fam", "conversation", 3, "a") is None
        assert await s.find_document("test.fam", "task", 1, "a") is None
        assert [r.id for r in await s.scan_documents(scope="conversation", scope_id=1)] == [10, 11, 12, 14]
        assert [r.id for r in await s.scan_documents(scope="conversation", scope_id=1, kind="test.fam")] == [
            10,
            11,
            12,
        ]
        assert [r.id for r in await s.scan_documents(scope="conversation", scope_id=2)] == [13]
        assert [r.id for r in await s.scan_documents(scope="session")] == [15]
        assert await s.scan_documents(scope="task", scope_id=1) == []

    async def test_broken_history_is_corruption_not_absence(self, store: StoreUnderTest) -> None:
        await store.commit(
            batch(1, doc_creates=[create(doc(10, 1), {"a": 1}), create(doc(11, 1, kind="t.b"), {})])
        )
        await store.commit(
            batch(2, doc_changes=[delta(10, 2, add("/b", 1), version=2)])
        )  # version change in tail
        await store.commit(batch(3, doc_changes=[delta(11, 3, {"op": "remove", "path": "/missing"})]))
        with pytest.raises(StorageCorrupt):
            await store.s.document(10)
        with pytest.raises(StorageCorrupt):
            await store.s.document(11)

    async def test_document_contents_of_unknown_document(self, store: StoreUnderTest) -> None:
        await store.commit(batch(1, doc_creates=[create(doc(10, 1), None)]))
        assert await store.s.document_contents(99) == []
        value = await store.s.document(10)
        assert value is not None
        assert value.value is None
        assert value.version == 1

    # --- preparing a commit is never uncertain -----------------------------------------------------------

    async def test_a_value_it_cannot_serialize_is_refused_before_anything_is_written(
        self, store: StoreUnderTest
    ) -> None:
        # The harness never hands over such a value (it checks strict JSON first); a backend that meets one
        # anyway must either keep it exactly or refuse the whole group with StrictJsonError before writing, so
        # the harness knows nothing was stored instead of closing on an "uncertain" failure.
        await store.commit(batch(1, next_id=10, conversations=[conv(1)]))
        odd = Entry(
            id=2,
            conversation_id=1,
            kind="test.note",
            model=[UserMessage(content="broken \ud83d emoji")],
            data={"text": "lone \udc00"},
            seq=2,
        )
        try:
            await store.s.commit([batch(2, next_id=11, entries=[odd])])
        except StrictJsonError:
            assert marks(await store.s.meta()) == (10, 1)
            assert await store.s.entry(2) is None
            if await store.reopen():
                assert await store.s.entry(2) is None
        else:
            assert await store.s.entry(2) == odd
            return
        await store.commit(batch(2, next_id=11, entries=[entry(2, 1)]))  # the store is still usable
        assert await store.s.entry(2) == entry(2, 1)

    # --- lifecycle ----------------------------------------------------------------------------------------

    async def test_closed_storage_refuses_use(self, store: StoreUnderTest) -> None:
        await store.commit(batch(1, conversations=[conv(1)]))
        s = store.s
        await s.close()
        await s.close()  # idempotent
        with pytest.raises(StorageClosed):
            await s.conversation(1)
        with pytest.raises(StorageClosed):
            await s.meta()
        with pytest.raises(StorageClosed):
            await s.commit([batch(2)])


def _class_name(name: str) -> str:
    words = [w for w in re.split(r"[^0-9A-Za-z]+", name) if w]
    if not words:
        raise ValueError(f"storage conformance name {name!r} has no letters or digits")
    return "Test" + "".join(w[0].upper() + w[1:] for w in words) + "StorageConformance"


def register_storage_conformance(
    namespace: dict[str, Any],
    name: str,
    factory: StorageFactory,
    *,
    reopen: StorageReopen | None = None,
) -> type:
    """Add `Test<Name>StorageConformance` to `namespace` (pass `globals()` of a test module); return it.

    `factory(tmp_path)` returns a fresh, empty storage. `reopen(storage, tmp_path)`, when given, closes the
    storage and opens the same data again; every test then also runs in a variant that reopens after each
    commit.
    """
    class_name = _class_name(name)
    variants = ["direct", "reopen-every-commit"] if reopen is not None else ["direct"]

    # pytest_asyncio's own decorator and mark, so the suite also runs under asyncio_mode = "strict".
    @pytest_asyncio.fixture(params=variants)
    async def store(
        self: Any, request: pytest.FixtureRequest, tmp_path: Path
    ) -> AsyncIterator[StoreUnderTest]:
        handle = StoreUnderTest(await factory(tmp_path), tmp_path, reopen, request.param != "direct")
        try:
            yield handle
        finally:
            await handle.close()

    attributes: dict[str, Any] = {
        "store": store,
        "pytestmark": [pytest.mark.asyncio],
        "__module__": namespace.get("__name__", __name__),
        "__qualname__": class_name,
        "__doc__": f"The storage conformance suite for {name}.",
    }
    cls = type(class_name, (_StorageConformance,), attributes)
    namespace[class_name] = cls
    return cls
