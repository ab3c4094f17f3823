"""The commit line (DESIGN.md §2.1): atomic commits, nothing published before storage, failures."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from harness_core import (
    DraftRevoked,
    EntryDraft,
    Harness,
    HarnessClosed,
    NotFound,
    Ownerless,
    StrictJsonError,
    Tx,
    define_doc,
)
from harness_core.storage import CommitBatch, MemoryStorage, SqliteStorage

Notes = define_doc("test.notes", initial=lambda: {"items": []})


class FlakyStorage(MemoryStorage):
    """Memory storage whose next commit can fail after (uncertain) or hang until released."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next = False
        self.gate: asyncio.Event | None = None
        self.commit_calls: list[int] = []

    async def commit(self, batches: Sequence[CommitBatch]) -> None:
        self.commit_calls.append(len(batches))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next:
            raise OSError("disk went away")
        await super().commit(batches)


async def append_note(tx: Tx, conversation_id: int, text: str) -> int:
    entry = tx.append_entry(conversation_id, EntryDraft(kind="test.note", data={"text": text}))
    doc = await tx.doc(Notes, conversation_id)
    doc.value["items"].append(text)
    return entry.id


async def test_commit_writes_entry_and_document_together() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root()
    entry_id = await harness.commit(lambda tx: append_note(tx, root.id, "one"))
    entry = await harness.session.storage.entry(entry_id)
    assert entry is not None and entry.data == {"text": "one"}
    assert await harness.snapshot(Notes, root.id) == {"items": ["one"]}
    await harness.close()


async def test_a_commit_reads_the_clock_once_so_every_time_it_writes_agrees() -> None:
    # A clock that moves on every read, as a real one does between two lines of a callback: an approval wrote
    # one millisecond into the gate and reported the next to the clicker ("approved at 14:02:03.951" vs .952).
    ticks = iter(range(1_000, 2_000))
    harness = await Harness.open(await MemoryStorage.open(), now=lambda: next(ticks))
    root = await harness.root()

    async def stamp(tx: Tx) -> tuple[int, int]:
        doc = await tx.doc(Notes, root.id)
        doc.value["at"] = tx.now
        return doc.value["at"], tx.now

    written, reported = await harness.commit(stamp)
    assert written == reported
    later, _ = await harness.commit(stamp)
    assert later > written  # the next commit reads the clock again
    await harness.close()


async def test_exception_in_callback_writes_nothing_and_harness_stays_healthy() -> None:
    storage = await MemoryStorage.open()
    harness = await Harness.open(storage)
    root = await harness.root()
    before = await storage.meta()

    async def broken(tx: Tx) -> None:
        await append_note(tx, root.id, "lost")
        raise ValueError("changed my mind")

    with pytest.raises(ValueError, match="changed my mind"):
        await harness.commit(broken)
    assert (await storage.meta()).last_seq == before.last_seq
    assert await harness.snapshot(Notes, root.id) is None
    # Still healthy: the next commit lands.
    await harness.commit(lambda tx: append_note(tx, root.id, "kept"))
    assert await harness.snapshot(Notes, root.id) == {"items": ["kept"]}
    await harness.close()


async def test_invalid_json_is_rejected_before_storage() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root()

    async def nan(tx: Tx) -> None:
        doc = await tx.doc(Notes, root.id)
        doc.value["items"].append(float("nan"))

    with pytest.raises(StrictJsonError, match="NaN"):
        await harness.commit(nan)

    async def assign_set(tx: Tx) -> None:
        doc = await tx.doc(Notes, root.id)
        doc.value = {"items": {1, 2}}

    with pytest.raises(StrictJsonError, match="set"):
        await harness.commit(assign_set)

    with pytest.raises(StrictJsonError, match="function"):
        await harness.commit(lambda tx: tx.append_entry(root.id, EntryDraft(kind="test.x", data={"f": len})))
    assert await harness.snapshot(Notes, root.id) is None
    await harness.close()


async def test_draft_is_revoked_after_the_callback() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root()
    kept: list[Any] = []

    async def keep(tx: Tx) -> None:
        kept.append(await tx.doc(Notes, root.id))

    await harness.commit(keep)
    with pytest.raises(DraftRevoked):
        kept[0].value["items"].append("late")
    await harness.close()


async def test_nothing_is_published_before_storage_acknowledges() -> None:
    storage = FlakyStorage()
    harness = await Harness.open(storage)
    root = await harness.root()
    seen: list[int] = []
    harness.add_publication_listener(lambda publication: seen.append(publication.seq))
    storage.gate = asyncio.Event()
    pending = asyncio.ensure_future(harness.commit(lambda tx: append_note(tx, root.id, "slow")))
    await asyncio.sleep(0.05)
    assert seen == []
    assert not pending.done()
    assert await harness.snapshot(Notes, root.id) is None  # readers see only stored state
    storage.gate.set()
    await pending
    assert len(seen) == 1
    assert await harness.snapshot(Notes, root.id) == {"items": ["slow"]}
    await harness.close()


@pytest.mark.parametrize("written", [False, True], ids=["failed-before-writing", "failed-after-writing"])
async def test_uncertain_storage_failure_closes_harness_failed_and_reopen_is_consistent(
    tmp_path: Path, written: bool
) -> None:
    path = tmp_path / "agent.sqlite"

    class FailingSqlite(SqliteStorage):
        fail = False

        async def commit(self, batches: Sequence[CommitBatch]) -> None:
            if self.fail and not written:
                raise OSError("I/O error before the write")
            await super().commit(batches)
            if self.fail:  # stored, but the caller cannot know: the outcome is uncertain
                raise OSError("I/O error after the write")

    storage = await FailingSqlite.open(path)
    harness = await Harness.open(storage)
    root = await harness.root()
    await harness.commit(lambda tx: append_note(tx, root.id, "durable"))
    published: list[int] = []
    harness.add_publication_listener(lambda p: published.append(p.seq))
    storage.fail = True
    with pytest.raises(HarnessClosed) as raised:
        await harness.commit(lambda tx: append_note(tx, root.id, "uncertain"))
    assert raised.value.reason == "failed"
    assert published == []
    info = await asyncio.wait_for(asyncio.shield(harness.closed), 1)
    assert info.reason == "failed"
    with pytest.raises(HarnessClosed):
        await harness.commit(lambda tx: append_note(tx, root.id, "after"))
    await harness.close()

    # Reopened, the uncertain commit is either wholly there (entry and document) or wholly absent.
    expected = ["durable", "uncertain"] if written else ["durable"]
    reopened = await Harness.open(await SqliteStorage.open(path))
    assert await reopened.snapshot(Notes, 1) == {"items": expected}
    page = await (await reopened.root()).entries(limit=10, order="asc")
    assert [e.data for e in page.items if e.kind == "test.note"] == [{"text": t} for t in expected]
    await reopened.close()


async def test_concurrent_commits_share_one_storage_transaction() -> None:
    storage = FlakyStorage()
    harness = await Harness.open(storage)
    root = await harness.root()
    storage.commit_calls.clear()
    storage.gate = asyncio.Event()
    first = asyncio.ensure_future(harness.commit(lambda tx: append_note(tx, root.id, "a")))
    await asyncio.sleep(0.01)  # the first group is now waiting in storage
    rest = [
        asyncio.ensure_future(harness.commit(lambda tx, i=i: append_note(tx, root.id, f"b{i}")))
        for i in range(5)
    ]
    await asyncio.sleep(0.01)
    storage.gate.set()
    await asyncio.gather(first, *rest)
    assert storage.commit_calls == [1, 5]
    # Each commit kept its own seq and saw the previous one's document state.
    assert await harness.snapshot(Notes, root.id) == {"items": ["a", "b0", "b1", "b2", "b3", "b4"]}
    await harness.close()


async def test_failed_commit_in_a_group_does_not_affect_the_others() -> None:
    storage = FlakyStorage()
    harness = await Harness.open(storage)
    root = await harness.root()
    storage.gate = asyncio.Event()
    blocker = asyncio.ensure_future(harness.commit(lambda tx: append_note(tx, root.id, "first")))
    await asyncio.sleep(0.01)

    async def bad(tx: Tx) -> None:
        await append_note(tx, root.id, "bad")
        raise RuntimeError("no")

    good = asyncio.ensure_future(harness.commit(lambda tx: append_note(tx, root.id, "good")))
    failing = asyncio.ensure_future(harness.commit(bad))
    after = asyncio.ensure_future(harness.commit(lambda tx: append_note(tx, root.id, "after")))
    storage.gate.set()
    await asyncio.gather(blocker, good, after)
    with pytest.raises(RuntimeError):
        await failing
    assert await harness.snapshot(Notes, root.id) == {"items": ["first", "good", "after"]}
    await harness.close()


async def test_ids_are_monotone_and_never_reused_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "ids.sqlite"
    harness = await Harness.open(await SqliteStorage.open(path))
    root = await harness.root()
    first = [await harness.commit(lambda tx, i=i: append_note(tx, root.id, str(i))) for i in range(3)]
    conversation = await harness.create_conversation(Ownerless())
    await harness.close()
    harness = await Harness.open(await SqliteStorage.open(path))
    later = await harness.commit(lambda tx: append_note(tx, root.id, "later"))
    assert first == sorted(first)
    assert later > max(*first, conversation.id)
    await harness.close()


async def test_cancelling_the_caller_does_not_cancel_an_admitted_commit() -> None:
    storage = FlakyStorage()
    harness = await Harness.open(storage)
    root = await harness.root()
    storage.gate = asyncio.Event()
    caller = asyncio.ensure_future(harness.commit(lambda tx: append_note(tx, root.id, "lands anyway")))
    await asyncio.sleep(0.01)
    caller.cancel()
    storage.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await harness.commit(lambda tx: None)  # a barrier: everything admitted before it is stored
    assert await harness.snapshot(Notes, root.id) == {"items": ["lands anyway"]}
    await harness.close()


async def test_read_your_writes_inside_a_commit() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root()

    async def both(tx: Tx) -> tuple[Any, Any]:
        entry_id = await append_note(tx, root.id, "x")
        return await tx.entry(entry_id), await tx.snapshot(Notes, root.id)

    entry, notes = await harness.commit(both)
    assert entry.data == {"text": "x"} and notes == {"items": ["x"]}
    await harness.close()


async def test_append_to_missing_conversation_is_refused() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    with pytest.raises(NotFound, match="conversation 999"):
        await harness.commit(lambda tx: tx.append_entry(999, EntryDraft(kind="test.x")))
    await harness.close()
