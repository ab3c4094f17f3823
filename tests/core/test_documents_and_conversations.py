"""Documents (bases + RFC 6902 deltas, fork policies, history) and conversations (root, ownership, forks)."""

from __future__ import annotations

from typing import Any

import pytest

from harness_core import (
    AgentChange,
    AgentDoc,
    DocumentVersionError,
    EntryDraft,
    Harness,
    InvalidOperation,
    LiveDoc,
    ModelRef,
    NotFound,
    Ownerless,
    ProviderDoc,
    StorageCorrupt,
    TaskOwned,
    Tx,
    define_doc,
)
from harness_core.documents import InboxDoc, UsageDoc, every_n_deltas
from harness_core.storage import MemoryStorage

Counter = define_doc("test.counter", initial=lambda: {"n": 0}, checkpoint_when=every_n_deltas(3))
Plan = define_doc("test.plan", initial=lambda: {"steps": []}, history="rewindable", fork="as_of")
Shared = define_doc("test.shared", initial=lambda: {"v": 0}, fork="current")
Fresh = define_doc("test.fresh", initial=lambda: {"v": 0}, fork="initial")
Settings = define_doc("test.settings", scope="session", initial=lambda: {"mode": "a"})
Family = define_doc("test.family", scope="session", family=True, initial=lambda seed: {"seed": seed})


async def bump(harness: Harness, conversation_id: int) -> None:
    async def run(tx: Tx) -> None:
        doc = await tx.doc(Counter, conversation_id)
        doc.value["n"] += 1

    await harness.commit(run)


async def note(harness: Harness, conversation_id: int, text: str) -> int:
    async def run(tx: Tx) -> int:
        return tx.append_entry(conversation_id, EntryDraft(kind="test.note", data={"text": text})).id

    return await harness.commit(run)


async def test_deltas_and_bases_follow_checkpoint_rule() -> None:
    storage = await MemoryStorage.open()
    harness = await Harness.open(storage)
    root = await harness.root()
    for _ in range(5):
        await bump(harness, root.id)
    record = await storage.find_document("test.counter", "conversation", root.id)
    assert record is not None
    contents = await storage.document_contents(record.id)
    # Creation base (n=1), then two deltas, then a base (every 3rd), then a delta; older revisions reclaimed.
    assert [c.is_base for c in contents] == [True, False]
    assert await harness.snapshot(Counter, root.id) == {"n": 5}
    assert contents[-1].delta == [{"op": "replace", "path": "/n", "value": 5}]
    await harness.close()


async def test_unchanged_draft_writes_nothing() -> None:
    storage = await MemoryStorage.open()
    harness = await Harness.open(storage)
    root = await harness.root()
    await bump(harness, root.id)
    before = await storage.meta()

    async def look(tx: Tx) -> None:
        await tx.doc(Counter, root.id)

    await harness.commit(look)
    record = await storage.find_document("test.counter", "conversation", root.id)
    assert record is not None
    assert len(await storage.document_contents(record.id)) == 1
    assert (await storage.meta()).last_seq == before.last_seq + 1  # an empty commit, no document write
    await harness.close()


async def test_session_scope_and_family_first_seed_wins() -> None:
    harness = await Harness.open(await MemoryStorage.open())

    async def run(tx: Tx) -> None:
        first = await tx.doc(Family, key="k", seed=1)
        second = await tx.doc(Family, key="k", seed=2)
        assert first is second
        settings = await tx.doc(Settings)
        settings.value["mode"] = "b"

    await harness.commit(run)
    assert await harness.snapshot(Family, key="k") == {"seed": 1}
    assert await harness.snapshot(Settings) == {"mode": "b"}
    await harness.close()


async def test_retire_then_recreate_makes_a_new_incarnation() -> None:
    storage = await MemoryStorage.open()
    harness = await Harness.open(storage)
    root = await harness.root()
    await bump(harness, root.id)
    old = await storage.find_document("test.counter", "conversation", root.id)

    async def recreate(tx: Tx) -> None:
        assert await tx.retire_doc(Counter, root.id)
        fresh = await tx.doc(Counter, root.id)
        fresh.value["n"] = 100

    await harness.commit(recreate)
    new = await storage.find_document("test.counter", "conversation", root.id)
    assert old is not None and new is not None and new.id != old.id
    assert await harness.snapshot(Counter, root.id) == {"n": 100}
    assert await storage.document(old.id) is None
    await harness.close()


async def test_migration_and_newer_stored_version() -> None:
    storage = await MemoryStorage.open()
    harness = await Harness.open(storage)
    root = await harness.root()
    v1 = define_doc("test.shape", initial=lambda: {"name": "x"})

    async def create(tx: Tx) -> None:
        await tx.doc(v1, root.id)

    await harness.commit(create)
    v2 = define_doc(
        "test.shape",
        version=2,
        initial=lambda: {"names": []},
        migrate=lambda value, _v: {"names": [value["name"]]},
    )
    assert await harness.snapshot(v2, root.id) == {"names": ["x"]}
    record = await storage.find_document("test.shape", "conversation", root.id)
    assert record is not None
    assert (await storage.document(record.id)).version == 1  # a read migrates in memory only

    async def touch(tx: Tx) -> None:
        await tx.doc(v2, root.id)

    await harness.commit(touch)
    assert (await storage.document(record.id)).version == 2  # the next draft writes a current-version base
    with pytest.raises(DocumentVersionError, match="newer"):
        await harness.snapshot(v1, root.id)
    await harness.close()


async def test_root_is_created_once() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    first = await harness.root(agent=AgentChange(instructions="A"))
    second = await harness.root(agent=AgentChange(instructions="B"))
    assert first.id == second.id == 1
    assert await harness.snapshot(AgentDoc, 1) == {"instructions": "A"}
    await harness.close()


async def test_every_conversation_gets_builtin_documents() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root()
    other = await harness.create_conversation(Ownerless())

    async def raw(tx: Tx) -> int:
        return (await tx.create_conversation(Ownerless())).id

    raw_id = await harness.commit(raw)
    for conversation_id in (root.id, other.id, raw_id):
        for doc in (LiveDoc, InboxDoc, UsageDoc, ProviderDoc, AgentDoc):
            assert await harness.snapshot(doc, conversation_id) is not None, (conversation_id, doc.kind)
    providers = {(await harness.snapshot(ProviderDoc, c))["session_id"] for c in (root.id, other.id, raw_id)}
    assert len(providers) == 3
    await harness.close()


async def test_task_owned_conversation_copies_owner_agent_once() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root(agent=AgentChange(model=ModelRef(provider="p", model_id="m")))
    from harness_core import Extension, define_task

    holder = define_task("test.holder", phases={"hold": _never})
    harness.registry.install(Extension("holder", tasks=[holder]))

    async def make(tx: Tx) -> tuple[int, int]:
        task = await harness.create_task_in(tx, "test.holder", conversation_id=root.id)
        child = await tx.create_conversation(TaskOwned(task_id=task.id))
        return task.id, child.id

    task_id, child_id = await harness.commit(make)
    await root.configure(AgentChange(model=ModelRef(provider="p", model_id="other")))
    assert (await harness.snapshot(AgentDoc, child_id))["model"] == {"provider": "p", "model_id": "m"}
    record = await harness.conversation_record(child_id)
    assert record is not None and record.owner_task_id == task_id and record.owner_conversation_id == root.id
    await harness.close()


async def _never(_task: Any, _runtime: Any) -> None:
    raise AssertionError("never scheduled in this test")


async def test_fork_sees_parent_only_up_to_fork_point() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root()
    ids = [await note(harness, root.id, f"p{i}") for i in range(5)]
    fork = await root.fork(ids[2])
    await note(harness, root.id, "parent later")
    await note(harness, fork.id, "child")
    page = await fork.entries(limit=20, order="asc")
    assert [e.data["text"] for e in page.items if e.kind == "test.note"] == ["p0", "p1", "p2", "child"]
    parent_page = await root.entries(limit=20, order="asc")
    assert "child" not in [e.data["text"] for e in parent_page.items if e.kind == "test.note"]
    assert (await harness.snapshot(ProviderDoc, fork.id))["session_id"] != (
        await harness.snapshot(ProviderDoc, root.id)
    )["session_id"]
    with pytest.raises(NotFound):
        await fork.fork(ids[4])  # not visible in the fork
    await harness.close()


async def test_fork_document_policies_and_snapshot_as_of() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root()

    async def set_all(tx: Tx, value: int) -> int:
        (await tx.doc(Plan, root.id)).value["steps"].append(value)
        (await tx.doc(Shared, root.id)).value["v"] = value
        (await tx.doc(Fresh, root.id)).value["v"] = value
        return tx.append_entry(root.id, EntryDraft(kind="test.mark", data={"v": value})).id

    first = await harness.commit(lambda tx: set_all(tx, 1))
    await harness.commit(lambda tx: set_all(tx, 2))
    fork = await root.fork(first)
    assert await harness.snapshot(Plan, fork.id) == {"steps": [1]}  # as of the fork entry
    assert await harness.snapshot(Shared, fork.id) == {"v": 2}  # the parent's current value
    assert await harness.snapshot(Fresh, fork.id) is None  # starts from its initializer on first access
    assert await harness.snapshot_as_of(Plan, root.id, first) == {"steps": [1]}
    assert await harness.snapshot_as_of(Plan, fork.id, first) == {"steps": [1]}  # through the fork ancestry
    await harness.close()


async def test_fork_commit_that_also_changes_a_current_document_is_refused() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root()
    entry = await note(harness, root.id, "x")

    async def both(tx: Tx) -> None:
        (await tx.doc(Shared, root.id)).value["v"] = 5
        await tx.fork_conversation(root.id, entry)

    with pytest.raises(InvalidOperation, match="ambiguous"):
        await harness.commit(both)
    await harness.close()


async def test_fork_agent_is_the_parent_agent_as_of_the_fork_entry() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root(agent=AgentChange(instructions="old"))
    entry = await note(harness, root.id, "x")
    await root.configure(AgentChange(instructions="new"))
    fork = await root.fork(entry)
    assert (await harness.snapshot(AgentDoc, fork.id))["instructions"] == "old"
    await harness.close()


async def test_entries_paging_with_cursor_and_order_check() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root()
    ids = [await note(harness, root.id, str(i)) for i in range(7)]
    fork = await root.fork(ids[3])
    child = [await note(harness, fork.id, f"c{i}") for i in range(3)]
    seen: list[int] = []
    cursor = None
    while True:
        page = await fork.entries(limit=2, cursor=cursor)
        seen.extend(e.id for e in page.items)
        cursor = page.cursor
        if cursor is None:
            break
    expected = sorted([*ids[:4], *child], reverse=True)
    assert [i for i in seen if i in expected] == expected
    first = await fork.entries(limit=2)
    from harness_core.errors import StorageRequestError

    with pytest.raises(StorageRequestError):
        await fork.entries(limit=2, cursor=first.cursor, order="asc")
    await harness.close()


async def test_corrupt_document_delta_is_reported_not_hidden() -> None:
    storage = await MemoryStorage.open()
    harness = await Harness.open(storage)
    root = await harness.root()
    await bump(harness, root.id)
    await bump(harness, root.id)
    record = await storage.find_document("test.counter", "conversation", root.id)
    assert record is not None
    storage._doc_contents[record.id][-1].delta = [{"op": "replace", "path": "/missing/deep", "value": 1}]
    harness.session.published.docs.discard(("test.counter", "conversation", root.id, None))
    with pytest.raises(StorageCorrupt, match="does not apply"):
        await harness.snapshot(Counter, root.id)
    await harness.close()


async def test_create_doc_makes_a_new_document_and_never_a_second_incarnation() -> None:
    storage = await MemoryStorage.open()
    harness = await Harness.open(storage)

    async def create(tx: Tx) -> None:
        draft = await tx.create_doc(Family, key="fresh", seed=7)
        draft.value["extra"] = True

    await harness.commit(create)
    assert await harness.snapshot(Family, key="fresh") == {"seed": 7, "extra": True}

    async def again(tx: Tx) -> None:  # the address is in use: behaves like doc()
        draft = await tx.create_doc(Family, key="fresh", seed=8)
        assert draft.value["seed"] == 7
        draft.value["again"] = True

    await harness.commit(again)
    records = await storage.scan_documents(scope="session", kind="test.family")
    assert len(records) == 1
    assert await harness.snapshot(Family, key="fresh") == {"seed": 7, "extra": True, "again": True}
    await harness.close()
