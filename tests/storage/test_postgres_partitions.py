"""A PostgreSQL store split into partitions (issue 16): handles bound to one partition each, their own fencing,
ids and recovery scans; one renewal connection for many leases; the partition count fixed per store; a v2 store
with data migrated as one partition; resource leases. Real cluster (tests/pg_cluster.py), no mocks."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from pg_partition_support import expire, open_handle

from harness_core import EntryDraft, Harness, InvalidOperation, Tx, partition_of_id, partition_of_key
from harness_core.errors import LeaseLost, StorageError, StorageLocked, StorageRequestError
from harness_core.records import Conversation, DocumentRecord, Submission, Task, TaskState
from harness_core.storage import (
    CommitBatch,
    DocCreate,
    Lease,
    LeaseHolder,
    PostgresStorage,
    PostgresStore,
)
from harness_core.storage._postgres_schema import migrate


def live_task(task_id: int, conversation_id: int) -> Task:
    return Task(
        id=task_id, conversation_id=conversation_id, kind="t.work", state=TaskState(status="pending"), seq=1
    )


def global_doc(doc_id: int) -> DocCreate:
    record = DocumentRecord(id=doc_id, kind="t.doc", scope="session", created_seq=1)
    return DocCreate(record=record, version=1, value={"owner": doc_id})


def work(conversation_id: int, task_id: int, submission_id: int, doc_id: int) -> CommitBatch:
    return CommitBatch(
        seq=1,
        next_id=doc_id + 8,
        conversations=[Conversation(id=conversation_id)],
        tasks=[live_task(task_id, conversation_id)],
        submissions=[
            Submission(
                id=submission_id,
                conversation_id=conversation_id,
                request_id="r",
                type="input",
                status="queued",
                seq=1,
            )
        ],
        doc_creates=[global_doc(doc_id)],
    )


def test_partition_helpers_are_stable_and_public() -> None:
    # Fixed values: the hash must never change between releases (places would move partitions).
    assert [partition_of_key(k, 64) for k in ("slack:T1:C1", "discord:9:8", "")] == [
        partition_of_key("slack:T1:C1", 64),
        partition_of_key("discord:9:8", 64),
        partition_of_key("", 64),
    ]
    import hashlib

    expected = int.from_bytes(hashlib.blake2b(b"slack:T1:C1", digest_size=8).digest(), "big") % 64
    assert partition_of_key("slack:T1:C1", 64) == expected
    assert partition_of_key("lone \udc00", 7) == (
        int.from_bytes(
            hashlib.blake2b("lone \udc00".encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big"
        )
        % 7
    )
    assert partition_of_key("anything", 1) == 0
    assert partition_of_id(13, 8) == 5 and partition_of_id(1, 8) == 1 and partition_of_id(16, 8) == 0
    with pytest.raises(ValueError, match="positive"):
        partition_of_id(3, 0)


async def test_two_partitions_commit_concurrently_and_recover_only_their_own(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=8)
    try:
        three, five = await open_handle(store, 3), await open_handle(store, 5)
        assert (three.partition, five.partition, three.partitions) == (3, 5, 8)
        await asyncio.gather(three.commit([work(11, 19, 27, 35)]), five.commit([work(13, 21, 29, 37)]))
        for handle, own, other in ((three, 11, 13), (five, 13, 11)):
            # Recovery scans see only the partition's rows...
            assert [t.conversation_id for t in (await handle.scan_tasks(live=True)).items] == [own]
            assert [c.id for c in (await handle.scan_conversations()).items] == [own]
            assert [s.conversation_id for s in (await handle.scan_submissions(status="queued")).items] == [
                own
            ]
            docs = await handle.scan_documents(scope="session")
            assert [d.id for d in docs] == [own + 24]
            found = await handle.find_document("t.doc", "session", None)
            assert found is not None and found.id == own + 24
            # ...reads by id see the whole store.
            assert await handle.conversation(other) is not None
            assert (await handle.scan_tasks(conversation_id=other)).items != []
            assert await handle.submission_by_request(other, "r") is not None
        rows = await store.pool.fetch("SELECT partition, count(*) FROM conversations GROUP BY 1 ORDER BY 1")
        assert [tuple(r) for r in rows] == [(3, 1), (5, 1)]
        await three.close()
        await five.close()
    finally:
        await store.close()


async def test_harness_ids_of_a_partition_are_its_own_and_root_lives_in_one_partition(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=8)
    try:
        seen: dict[int, list[int]] = {}
        for partition in (1, 0, 6):
            harness = await Harness.open(await open_handle(store, partition))
            conversation = await harness.create_conversation()

            async def notes(tx: Tx, conversation_id: int = conversation.id) -> None:
                for n in range(3):
                    tx.append_entry(conversation_id, EntryDraft(kind="t.note", data={"n": n}))

            await harness.commit(notes)
            if partition == 1:
                root = await harness.root()
                assert root.id == 1
            else:
                with pytest.raises(InvalidOperation, match="partition 1 of 8"):
                    await harness.root()
            await harness.close()
            entries = await store.pool.fetch("SELECT id FROM entries WHERE partition = $1", partition)
            seen[partition] = [conversation.id, *(int(r[0]) for r in entries)]
        for partition, ids in seen.items():
            assert len(ids) >= 4
            assert all(i % 8 == partition for i in ids), (partition, ids)
        # Reopened: minting goes on from the partition's meta, still in the partition.
        harness = await Harness.open(await open_handle(store, 6))
        later = await harness.create_conversation()
        assert later.id % 8 == 6 and later.id > max(seen[6])
        await harness.close()
    finally:
        await store.close()


async def test_a_successor_after_the_expiry_fences_the_old_handle(pg_url: str) -> None:
    old_store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=30)
    new_store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=30)
    try:
        old = await open_handle(old_store, 2)
        other = await open_handle(old_store, 3)
        await old.commit([CommitBatch(seq=1, next_id=10, conversations=[Conversation(id=6)])])
        taken = await new_store.open_partition(2)
        assert isinstance(taken, LeaseHolder) and taken.holder == old_store.holder
        await expire(pg_url, 2)  # as if the old worker had been paused past its ttl
        new = await open_handle(new_store, 2)
        with pytest.raises(LeaseLost, match="partition 2"):
            await old.commit([CommitBatch(seq=2, next_id=20, conversations=[Conversation(id=10)])])
        assert await new.conversation(10) is None
        meta = await new.meta()
        assert meta.next_id >= 10 and (meta.id_stride, meta.id_offset) == (4, 2)
        await new.commit([CommitBatch(seq=meta.last_seq + 1, next_id=meta.next_id + 4)])
        # The old worker's other partition is untouched by the takeover.
        await other.commit([CommitBatch(seq=1, next_id=8, conversations=[Conversation(id=7)])])
        await old.close()  # does not release the successor's lease
        assert isinstance(await old_store.open_partition(2), LeaseHolder)
        await new.close()
        await other.close()
    finally:
        await old_store.close()
        await new_store.close()


async def test_one_renewal_connection_renews_many_partitions(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=32, lease_ttl=1.5, pool_size=3)
    admin = await asyncpg.connect(pg_url)
    try:
        handles = [await open_handle(store, p) for p in range(32)]
        await asyncio.sleep(3.5)  # more than two ttls: every lease renewed meanwhile
        assert all(h.lease is not None and h.lease.valid() for h in handles)
        for h in handles[:4]:
            meta = await h.meta()
            await h.commit([CommitBatch(seq=1, next_id=meta.next_id)])
        counts = dict(
            await admin.fetch(
                "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name LIKE 'durable-bots%' GROUP BY 1"
            )
        )
        assert counts.get("durable-bots lease renewal") == 1
        assert counts.get("durable-bots", 0) <= 3  # the pool; no writer per partition
        holders = await store.leases()
        assert all(holders[p] is not None and holders[p].holder == store.holder for p in range(32))  # type: ignore[union-attr]
        for h in handles:
            await h.close()
        assert all(v is None for v in (await store.leases()).values())
    finally:
        await admin.close()
        await store.close()


async def test_the_partition_count_is_fixed_per_store(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=8)
    await store.close()
    with pytest.raises(StorageError) as info:
        await PostgresStore.open(pg_url, partitions=4)
    text = str(info.value)
    assert "has 8 partitions, not 4 as configured" in text and "[storage] partitions = 8" in text
    with pytest.raises(StorageError, match="has 8 partitions"):
        await PostgresStorage.open(pg_url)  # the one-partition shape is a count too
    store = await PostgresStore.open(pg_url, partitions=8)
    try:
        with pytest.raises(StorageRequestError, match="0 to 7"):
            await store.open_partition(8)
        handle = await open_handle(store, 0)
        with pytest.raises(StorageRequestError, match="already open"):
            await store.open_partition(0)
        await handle.close()
    finally:
        await store.close()


async def test_a_v2_store_with_data_migrates_to_one_partition_and_keeps_working(pg_empty_url: str) -> None:
    conn = await asyncpg.connect(pg_empty_url)
    try:
        await migrate(conn, "test", upto=2)
        # What the v2 code left: a conversation in partition 0 and its counters.
        record = Conversation(id=1).model_dump_json(exclude_none=True).encode()
        await conn.execute("INSERT INTO conversations (id, partition, record) VALUES (1, 0, $1)", record)
        await conn.execute("UPDATE meta SET next_id = 4096, last_seq = 3 WHERE partition = 0")
    finally:
        await conn.close()
    harness = await Harness.open(await PostgresStorage.open(pg_empty_url))
    try:
        assert await harness.conversation(1) is not None
        made = await harness.create_conversation()
        assert made.id >= 4096
    finally:
        await harness.close()
    with pytest.raises(StorageError, match="has 1 partitions"):
        await PostgresStore.open(pg_empty_url, partitions=8)


async def test_an_empty_v2_store_takes_the_count_of_its_first_open(pg_empty_url: str) -> None:
    conn = await asyncpg.connect(pg_empty_url)
    try:
        await migrate(conn, "test", upto=2)
    finally:
        await conn.close()
    store = await PostgresStore.open(pg_empty_url, partitions=8)
    try:
        assert store.partitions == 8
        handle = await open_handle(store, 0)
        assert (await handle.meta()).next_id == 8
        await handle.close()
    finally:
        await store.close()


async def test_closing_a_handle_releases_its_partition_at_once_and_keeps_the_store(pg_url: str) -> None:
    first = await PostgresStore.open(pg_url, partitions=4)
    second = await PostgresStore.open(pg_url, partitions=4)
    try:
        handle = await open_handle(first, 1)
        changed = asyncio.Event()
        stop = second.on_change(changed.set)
        await second.listening()
        assert isinstance(await second.open_partition(1), LeaseHolder)
        await handle.close()
        await asyncio.wait_for(changed.wait(), 5)  # the release NOTIFYs the other workers
        stop()
        taken = await open_handle(second, 1)
        again = await open_handle(first, 2)  # the first store's pool is still open
        await again.commit([CommitBatch(seq=1, next_id=6)])
        await taken.close()
        await again.close()
    finally:
        await first.close()
        await second.close()


async def test_a_standby_of_the_one_partition_shape_waits_for_the_release(pg_url: str) -> None:
    leader = await PostgresStorage.open(pg_url)
    try:
        with pytest.raises(StorageLocked):
            await PostgresStorage.open(pg_url)
        waiting: list[LeaseHolder] = []
        standby = asyncio.create_task(PostgresStorage.open(pg_url, on_standby=waiting.append))
        await asyncio.sleep(0.5)
        assert len(waiting) == 1 and not standby.done()
    finally:
        await leader.close()
    successor = await asyncio.wait_for(standby, 5)
    assert successor.partition == 0 and successor.partitions == 1
    await successor.close()


async def test_resource_leases_are_taken_renewed_and_released(pg_url: str) -> None:
    a = await PostgresStore.open(pg_url, partitions=2, lease_ttl=1.5)
    b = await PostgresStore.open(pg_url, partitions=2, lease_ttl=1.5)
    try:
        shard = await a.take_resource(-1 - 0)
        assert isinstance(shard, Lease)
        assert isinstance(await b.take_resource(-1), LeaseHolder)
        with pytest.raises(StorageRequestError, match="negative"):
            await a.take_resource(0)
        await asyncio.sleep(3.5)  # renewed with the store's other leases
        assert shard.valid()
        holders = await b.leases()
        assert holders[-1] is not None and holders[-1].holder == a.holder
        assert holders[0] is None and holders[1] is None
        await shard.release()
        assert not shard.valid()
        taken = await b.take_resource(-1)
        assert isinstance(taken, Lease)
        await taken.release()
    finally:
        await a.close()
        await b.close()


async def test_operator_requests_go_to_the_partition_of_their_target(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=8)
    try:
        five, three = await open_handle(store, 5), await open_handle(store, 3)
        reader = await PostgresStorage.open_read_only(pg_url)
        try:
            assert reader.partitions == 8 and reader.partition is None
            retry = await reader.put_operator_request("retry", {"task": 13})
            decide = await reader.put_operator_request("decide", {"gate": 11, "approve": True, "name": "ops"})
        finally:
            await reader.close()
        assert [r.id for r in await five.pending_operator_requests()] == [retry]
        assert [r.id for r in await three.pending_operator_requests()] == [decide]
        await five.close()
        await three.close()
    finally:
        await store.close()


async def test_the_shared_renewal_notices_one_takeover_and_keeps_the_other_partitions(pg_url: str) -> None:
    old_store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=1.5)
    new_store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=1.5)
    try:
        taken, kept = await open_handle(old_store, 2), await open_handle(old_store, 3)
        await expire(pg_url, 2)
        successor = await open_handle(new_store, 2)
        assert taken.lease is not None and kept.lease is not None
        reason = await asyncio.wait_for(taken.lease.lost, 5)
        assert "taken over by pid" in reason
        assert taken.not_ready() == "storage lease lost"
        await asyncio.sleep(1.0)
        assert kept.lease.valid() and kept.not_ready() is None
        assert set(old_store.held()) == {2, 3}  # lost is not released: the owner closes it
        await taken.close()
        await kept.close()
        await successor.close()
        assert old_store.held() == {}
    finally:
        await old_store.close()
        await new_store.close()


async def test_the_store_reader_sees_every_partition_and_never_commits(pg_url: str) -> None:
    # Cross-partition reads (search_history over other channels) go through it: no lease, no fence.
    store = await PostgresStore.open(pg_url, partitions=8)
    try:
        three, five = await open_handle(store, 3), await open_handle(store, 5)
        await asyncio.gather(three.commit([work(11, 19, 27, 35)]), five.commit([work(13, 21, 29, 37)]))
        reader = store.reader()
        assert reader.read_only and reader.partition is None
        assert [c.id for c in (await reader.scan_conversations()).items] == [11, 13]
        assert [c.id for c in (await three.scan_conversations()).items] == [11]
        with pytest.raises(StorageError):
            await reader.commit([work(43, 51, 59, 67)])
        await reader.close()  # the store and its handles go on
        await three.commit([CommitBatch(seq=2, next_id=75, conversations=[Conversation(id=75)])])
        await three.close()
        await five.close()
    finally:
        await store.close()
