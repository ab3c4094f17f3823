"""The PostgreSQL partition layer under attack and bad luck (issue 16 review): dropped renewal and LISTEN
connections, a holder paused past its ttl, a takeover while the pool is busy, a close racing a commit, two
first opens disagreeing on the partition count, concurrent migrations, hostile ingress input, pool exhaustion
and passwords in DSNs. Real cluster (tests/pg_cluster.py), no mocks."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pg_commit_cutter import CommitCutter
from pg_partition_support import expire, open_handle

from harness_core.errors import LeaseLost, StorageClosed, StorageError, StorageRequestError, StrictJsonError
from harness_core.records import Conversation, Task, TaskState
from harness_core.storage import CommitBatch, PostgresStorage, PostgresStore, redact_url
from harness_core.storage._postgres_schema import SCHEMA_VERSION, migrate


async def waiting_on_locks(admin: asyncpg.Connection) -> int:
    return int(
        await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
    )


async def until(check: Any, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


# --- leases -------------------------------------------------------------------------------------------------


async def test_a_close_racing_a_commit_never_lowers_the_stored_next_id(pg_url: str) -> None:
    # close() writes the exact next id; a commit still in flight has already used ids above it. Had close
    # written its stale value after that commit, a successor would mint those ids again (and the task and
    # submission upserts would silently overwrite another record).
    store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=30)
    admin = await asyncpg.connect(pg_url)
    try:
        handle = await open_handle(store, 1)
        block = admin.transaction()
        await block.start()
        await admin.execute("SELECT * FROM meta WHERE partition = 1 FOR UPDATE")  # the commit waits here
        commit = asyncio.create_task(
            handle.commit([CommitBatch(seq=1, next_id=9, conversations=[Conversation(id=5)])])
        )
        await until(lambda: _at_least(admin, 1))
        close = asyncio.create_task(handle.close())
        await asyncio.sleep(0.3)  # let close get as far as it can
        await block.rollback()
        await asyncio.wait_for(asyncio.gather(commit, close), 10)
        meta = await store.read_meta(1)
        assert meta.next_id >= 9, meta
        successor = await open_handle(store, 1)
        assert (await successor.meta()).next_id >= 9
        await successor.close()
    finally:
        await admin.close()
        await store.close()


async def assert_landed_and_kept(url: str) -> None:
    """Conversation 5 (committed with next id 9 in partition 1 of 4) landed, and the stored next id stayed above
    it, so a successor can never mint it again."""
    check = await PostgresStore.open(url, partitions=4)
    try:
        assert (await check.read_meta(1)).next_id >= 9
        successor = await open_handle(check, 1)
        assert await successor.conversation(5) is not None
        assert (await successor.meta()).next_id >= 9
        await successor.close()
    finally:
        await check.close()


async def test_a_commit_whose_outcome_is_unknown_never_lowers_the_stored_next_id(pg_url: str) -> None:
    # The connection drops after the server committed but before the answer: the handle cannot know the
    # commit landed. Its close must not then store its stale exact next id below the ids that commit used
    # (the harness closes the storage after such a failure; a successor would mint those ids again).
    cutter = CommitCutter(pg_url)
    store = await PostgresStore.open(await cutter.start(), partitions=4, lease_ttl=30)
    try:
        handle = await open_handle(store, 1)
        cutter.armed = True
        with pytest.raises(StorageError, match="outcome unknown"):
            await handle.commit([CommitBatch(seq=1, next_id=9, conversations=[Conversation(id=5)])])
        assert cutter.cut == 1
        await handle.close()
        await assert_landed_and_kept(pg_url)
    finally:
        await store.close()
        await cutter.close()


async def test_a_cancelled_commit_that_lands_later_never_lowers_the_stored_next_id(pg_url: str) -> None:
    # Cancelled while its COMMIT is on the way: the handle drops the connection and reads the stored meta back,
    # but the COMMIT can still land after that read. Close must then keep the reservation, not the meta read.
    cutter = CommitCutter(pg_url)
    store = await PostgresStore.open(await cutter.start(), partitions=4, lease_ttl=30)
    try:
        handle = await open_handle(store, 1)
        cutter.armed, cutter.hold = True, 1.0
        commit = asyncio.create_task(
            handle.commit([CommitBatch(seq=1, next_id=9, conversations=[Conversation(id=5)])])
        )
        await asyncio.wait_for(cutter.holding.wait(), 5)
        commit.cancel()
        with pytest.raises(asyncio.CancelledError):
            await commit
        await asyncio.sleep(1.5)  # the held COMMIT lands now
        assert cutter.cut == 1
        await handle.close()
        await assert_landed_and_kept(pg_url)
    finally:
        await store.close()
        await cutter.close()


async def _at_least(admin: asyncpg.Connection, waiting: int) -> bool:
    return await waiting_on_locks(admin) >= waiting


async def test_a_takeover_seen_while_the_pool_is_busy_costs_only_that_partition(pg_url: str) -> None:
    # Noticing a takeover must not wait for a pool connection: with the pool busy (slow commits), the other
    # partitions' next renewal would come too late and they would be lost too.
    old_store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=1.5, pool_size=1)
    new_store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=1.5)
    try:
        taken, kept = await open_handle(old_store, 2), await open_handle(old_store, 3)
        assert taken.lease is not None and kept.lease is not None
        async with old_store.pool.acquire():  # every pooled connection busy
            await expire(pg_url, 2)
            successor = await open_handle(new_store, 2)
            reason = await asyncio.wait_for(taken.lease.lost, 3)
            assert "taken over by pid" in reason
            await asyncio.sleep(1.5)  # a ttl
            assert kept.lease.valid(), kept.lease.lost.result() if kept.lease.lost.done() else "expired"
        await kept.commit([CommitBatch(seq=1, next_id=7, conversations=[Conversation(id=3)])])
        await taken.close()
        await kept.close()
        await successor.close()
    finally:
        await old_store.close()
        await new_store.close()


async def test_a_slow_commit_on_one_partition_does_not_cost_the_others_their_leases(pg_url: str) -> None:
    # Each commit holds its lease row FOR SHARE (the fence) until it ends, and the one renewal statement
    # updates every row the store holds: it must not wait for a slow commit, or every partition of the worker
    # would run out because of one.
    store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=1.5)
    admin = await asyncpg.connect(pg_url)
    try:
        slow, other = await open_handle(store, 1), await open_handle(store, 2)
        block = admin.transaction()
        await block.start()
        await admin.execute("SELECT * FROM meta WHERE partition = 1 FOR UPDATE")  # the commit waits here
        commit = asyncio.create_task(
            slow.commit([CommitBatch(seq=1, next_id=9, conversations=[Conversation(id=5)])])
        )
        await until(lambda: _at_least(admin, 1))
        await asyncio.sleep(2.5)  # longer than the ttl
        assert other.lease is not None and other.lease.valid(), other.not_ready()
        await other.commit([CommitBatch(seq=1, next_id=10, conversations=[Conversation(id=6)])])
        await block.rollback()
        await asyncio.wait_for(commit, 5)  # the fence held the row: still ours, so the commit lands
        assert await other.conversation(5) is not None
        await slow.close()
        await other.close()
    finally:
        await admin.close()
        await store.close()


async def test_a_dropped_renewal_connection_is_replaced_and_the_leases_stay_ours(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=1.5)
    admin = await asyncpg.connect(pg_url)
    try:
        handles = [await open_handle(store, p) for p in range(4)]
        for _ in range(3):
            await until(lambda: _renewal_connected(admin))
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'durable-bots lease renewal' AND datname = current_database()"
            )
            await asyncio.sleep(0.6)
        await asyncio.sleep(1.5)  # a ttl after the last drop: renewed over a new connection meanwhile
        assert all(h.lease is not None and h.lease.valid() for h in handles)
        for n, h in enumerate(handles):
            meta = await h.meta()
            await h.commit([CommitBatch(seq=1, next_id=meta.next_id + 4 * (n + 1))])
        for h in handles:
            await h.close()
    finally:
        await admin.close()
        await store.close()


async def test_an_unexpected_renewal_error_is_retried_and_never_ends_the_renewal(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Only driver errors were expected: anything else ended the renewal task, and every lease of the store
    # then ran out with nothing but a late "not renewed in time".
    store = await PostgresStore.open(pg_url, partitions=2, lease_ttl=6)
    admin = await asyncpg.connect(pg_url)
    try:
        handle = await open_handle(store, 1)
        renewer = store._renewer
        real_connect = renewer._connect
        calls = 0

        async def flaky() -> asyncpg.Connection:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("a driver bug")
            return await real_connect()

        renewer._connect = flaky  # type: ignore[method-assign]
        await until(lambda: _renewal_connected(admin))
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'durable-bots lease renewal' AND datname = current_database()"
        )

        async def reconnected() -> bool:
            return calls >= 2 and await _renewal_connected(admin)

        await until(reconnected, timeout=8)
        assert "renewal failed unexpectedly" in caplog.text
        await asyncio.sleep(2.5)  # beyond the validity of the renewal before the drop
        assert handle.lease is not None and handle.lease.valid()
        await handle.commit([CommitBatch(seq=1, next_id=9)])
        await handle.close()
    finally:
        await admin.close()
        await store.close()


async def _renewal_connected(admin: asyncpg.Connection) -> bool:
    found = await admin.fetchval(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE application_name = 'durable-bots lease renewal' AND datname = current_database()"
    )
    return int(found) == 1


async def test_a_holder_whose_renewals_stall_stops_trusting_every_lease_within_the_ttl(pg_url: str) -> None:
    # The renewal statement waits on a row lock (as it would on a server that stopped answering): by its own
    # monotonic clock the holder stops trusting each lease within ttl - margin, and a commit is refused.
    store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=1.5)
    admin = await asyncpg.connect(pg_url)
    try:
        handles = [await open_handle(store, p) for p in (0, 3)]
        loop = asyncio.get_running_loop()
        block = admin.transaction()
        await block.start()
        await admin.execute("SELECT * FROM leases FOR UPDATE")
        started = loop.time()
        for h in handles:
            assert h.lease is not None
            await _untrusted(h)
        assert loop.time() - started <= 1.5
        with pytest.raises(LeaseLost, match="not renewed in time"):
            await handles[0].commit([CommitBatch(seq=1, next_id=8)])
        await block.rollback()
        for h in handles:
            await h.close()
    finally:
        await admin.close()
        await store.close()


async def _untrusted(handle: PostgresStorage, timeout: float = 3) -> None:
    async def untrusted() -> bool:
        return handle.not_ready() is not None

    await until(untrusted, timeout=timeout)


async def test_a_lease_lost_by_our_own_clock_is_freed_at_once_when_closed(pg_url: str) -> None:
    # A stalled renewal: by our clock the lease is lost, but the row still names us for a while (the server's
    # expiry is later). Closing must free it at once (the release is fenced by the epoch, so it never frees a
    # successor's lease), not leave the partition blocked for everyone until the row expires.
    store = await PostgresStore.open(pg_url, partitions=2, lease_ttl=6)
    other = await PostgresStore.open(pg_url, partitions=2, lease_ttl=6)
    admin = await asyncpg.connect(pg_url)
    try:
        handle = await open_handle(store, 1)
        block = admin.transaction()
        await block.start()
        await admin.execute("SELECT * FROM leases WHERE partition = 1 FOR UPDATE")
        await _untrusted(handle, timeout=8)
        with pytest.raises(LeaseLost, match="not renewed in time"):
            handle.check_owner()  # as the harness does before a platform write
        await block.rollback()
        assert (await other.leases())[1] is not None  # still ours by the server's clock
        await handle.close()
        assert (await other.leases())[1] is None
        successor = await open_handle(other, 1)
        await successor.close()
    finally:
        await admin.close()
        await store.close()
        await other.close()


async def test_a_partition_taken_while_the_store_closes_is_given_back(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=2, lease_ttl=30)
    other = await PostgresStore.open(pg_url, partitions=2, lease_ttl=30)
    admin = await asyncpg.connect(pg_url)
    try:
        await (await open_handle(store, 1)).close()  # the lease row exists now
        block = admin.transaction()
        await block.start()
        await admin.execute("SELECT * FROM leases WHERE partition = 1 FOR UPDATE")
        opening = asyncio.create_task(store.open_partition(1))  # waits on the row lock
        await until(lambda: _at_least(admin, 1))
        closing = asyncio.create_task(store.close())
        await asyncio.sleep(0.3)
        await block.rollback()
        with pytest.raises(StorageClosed):
            await asyncio.wait_for(opening, 10)
        await asyncio.wait_for(closing, 10)
        assert (await other.leases())[1] is None
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "postgres-lease-renewal"]
    finally:
        await admin.close()
        await store.close()
        await other.close()


async def test_a_standby_wait_ended_by_closing_the_store_leaves_no_listener(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=2, lease_ttl=30)
    other = await PostgresStore.open(pg_url, partitions=2, lease_ttl=30)
    admin = await asyncpg.connect(pg_url)
    try:
        held = await open_handle(other, 1)
        block = admin.transaction()
        await block.start()
        await admin.execute("SELECT * FROM leases WHERE partition = 1 FOR UPDATE")
        waiting = asyncio.create_task(store.wait_partition(1, lambda _holder: None))  # blocks on the row
        await until(lambda: _at_least(admin, 1))
        closing = asyncio.create_task(store.close())
        await asyncio.sleep(0.3)
        await block.rollback()  # the take finds the lease held: it would start waiting for its release
        with pytest.raises(StorageClosed):
            await asyncio.wait_for(waiting, 5)
        await asyncio.wait_for(closing, 10)
        await asyncio.sleep(0.5)
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "postgres-listen"]
        listeners = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = 'durable-bots listen' AND datname = current_database()"
        )
        assert listeners == 0
        await held.close()
    finally:
        await admin.close()
        await store.close()
        await other.close()


async def test_closing_the_store_closes_its_open_handles(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=30)
    other = await PostgresStore.open(pg_url, partitions=4, lease_ttl=30)
    try:
        handle = await open_handle(store, 2)
        await handle.commit([CommitBatch(seq=1, next_id=10, conversations=[Conversation(id=6)])])
        await store.close()
        with pytest.raises(StorageClosed):
            await handle.commit([CommitBatch(seq=2, next_id=14)])
        with pytest.raises(StorageClosed):
            await handle.conversation(6)
        await handle.close()  # closing again is harmless
        # The handle's close ran: the exact next id is stored (not the reservation) and the lease is free.
        assert (await other.read_meta(2)).next_id == 10
        successor = await open_handle(other, 2)
        await successor.close()
    finally:
        await store.close()
        await other.close()


async def test_many_commits_on_many_partitions_through_a_tiny_pool_finish(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=16, lease_ttl=1.5, pool_size=1)
    try:
        handles = [await open_handle(store, p) for p in range(16)]

        async def writes(h: PostgresStorage) -> None:
            for seq in range(1, 5):
                meta = await h.meta()
                await h.commit([CommitBatch(seq=seq, next_id=meta.next_id + 16)])

        await asyncio.wait_for(asyncio.gather(*(writes(h) for h in handles)), 30)
        await asyncio.sleep(1.0)
        assert all(h.lease is not None and h.lease.valid() for h in handles)
        for h in handles:
            await h.close()
        assert all(v is None for v in (await store.leases()).values())
    finally:
        await store.close()


async def test_a_closed_store_leaves_no_connection_behind(pg_url: str) -> None:
    admin = await asyncpg.connect(pg_url)

    async def ours() -> int:
        return int(
            await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name LIKE 'durable-bots%' AND datname = current_database()"
            )
        )

    try:
        store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=1.5, pool_size=3)
        with pytest.raises(StorageError, match="has 4 partitions, not 2"):
            await PostgresStore.open(pg_url, partitions=2)  # refused: closes what it opened
        handles = [await open_handle(store, p) for p in range(4)]
        await store.take_resource(-1)
        store.on_ingress(lambda _partition: None)
        await store.listening()
        await store.heartbeat()
        await asyncio.gather(*(h.commit([CommitBatch(seq=1, next_id=40)]) for h in handles))
        await asyncio.sleep(0.6)  # a renewal round
        assert await ours() >= 3  # pool, renewal, listen
        await handles[0].close()
        await store.close()

        async def none_left() -> bool:
            return await ours() == 0

        await until(none_left)
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("postgres-")]
    finally:
        await admin.close()


# --- store shape and migration -------------------------------------------------------------------------------


async def test_two_first_opens_with_different_counts_agree_on_one(pg_empty_url: str) -> None:
    results = await asyncio.gather(
        PostgresStore.open(pg_empty_url, partitions=4),
        PostgresStore.open(pg_empty_url, partitions=8),
        return_exceptions=True,
    )
    stores = [r for r in results if isinstance(r, PostgresStore)]
    errors = [r for r in results if isinstance(r, BaseException)]
    try:
        assert len(stores) == 1 and len(errors) == 1, results
        won = stores[0].partitions
        lost = 12 - won
        assert isinstance(errors[0], StorageError)
        assert f"has {won} partitions, not {lost} as configured" in str(errors[0])
    finally:
        for store in stores:
            await store.close()


async def test_two_processes_migrating_a_v2_store_at_once_migrate_it_once(pg_empty_url: str) -> None:
    conn = await asyncpg.connect(pg_empty_url)
    try:
        await migrate(conn, "test", upto=2)
        await conn.execute("UPDATE meta SET next_id = 7, last_seq = 3 WHERE partition = 0")
    finally:
        await conn.close()
    stores = await asyncio.gather(*(PostgresStore.open(pg_empty_url, partitions=1) for _ in range(2)))
    try:
        conn = await asyncpg.connect(pg_empty_url)
        try:
            assert await conn.fetchval("SELECT version FROM schema_version") == SCHEMA_VERSION
            assert await conn.fetchval("SELECT count(*) FROM store_shape") == 1
            assert await conn.fetchval("SELECT next_id FROM meta WHERE partition = 0") == 7
        finally:
            await conn.close()
        handle = await open_handle(stores[0], 0)
        assert (await handle.meta()).next_id == 7
        await handle.close()
    finally:
        for store in stores:
            await store.close()


# --- reads and operator requests ----------------------------------------------------------------------------


async def test_a_read_only_handle_sees_every_partition(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=4, lease_ttl=30)
    try:
        for p, conversation_id in ((1, 5), (2, 6), (3, 7)):
            handle = await open_handle(store, p)
            task = Task(
                id=conversation_id + 4,
                conversation_id=conversation_id,
                kind="t.work",
                state=TaskState(status="pending"),
                seq=1,
            )
            await handle.commit(
                [
                    CommitBatch(
                        seq=1, next_id=20, conversations=[Conversation(id=conversation_id)], tasks=[task]
                    )
                ]
            )
            await handle.close()
        reader = await PostgresStorage.open_read_only(pg_url)
        try:
            assert reader.partitions == 4 and reader.partition is None
            assert [c.id for c in (await reader.scan_conversations()).items] == [5, 6, 7]
            assert [t.id for t in (await reader.scan_tasks(live=True)).items] == [9, 10, 11]
            with pytest.raises(StorageError, match="read-only"):
                await reader.commit([CommitBatch(seq=1, next_id=30)])
            # A request for a task nobody has goes to the partition the id names (its owner answers it).
            request_id = await reader.put_operator_request("retry", {"task": 4099})
            owner = await open_handle(store, 4099 % 4)
            assert [r.id for r in await owner.pending_operator_requests()] == [request_id]
            await owner.close()
        finally:
            await reader.close()
    finally:
        await store.close()


# --- ingress ------------------------------------------------------------------------------------------------


async def test_hostile_ingress_input_gets_clear_errors_and_big_payloads_round_trip(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=2)
    try:
        huge = {"text": "x" * 1_500_000, "blocks": [{"n": n} for n in range(2000)]}
        assert await store.put_ingress(1, "message", "slack:huge", huge)
        (record,) = await store.pending_ingress([1])
        assert record.payload == huge
        deep: dict[str, Any] = {}
        for _ in range(500):
            deep = {"d": deep}
        with pytest.raises(StrictJsonError, match="slack:deep"):
            await store.put_ingress(0, "message", "slack:deep", deep)
        # A key too long for the unique index gets a clear error up front (not an index-row error from the
        # server), and the message does not repeat all of it.
        long_key = "".join(chr(0x4E00 + (n * 7919) % 20000) for n in range(10_000))
        with pytest.raises(StorageRequestError, match="ingress key is 10000 characters") as info:
            await store.put_ingress(0, "message", long_key, {})
        assert len(str(info.value)) < 400
        for bad in ("lone\ud800surrogate", "nul\x00", ""):
            with pytest.raises(StorageRequestError, match="ingress key"):
                await store.put_ingress(0, "message", bad, {})
        assert await store.pending_ingress([]) == []
        await store.finish_ingress(10**12)  # unknown: nothing happens
        for bad_age in (float("inf"), float("nan"), -1.0):
            with pytest.raises(ValueError, match="finished_for must be a number of seconds"):
                await store.prune_ingress(finished_for=bad_age)
        assert [r.key for r in await store.pending_ingress([0, 1])] == ["slack:huge"]
    finally:
        await store.close()


async def test_a_raising_ingress_callback_and_a_dropped_listen_connection_lose_nothing(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    owner = await PostgresStore.open(pg_url, partitions=4)
    other = await PostgresStore.open(pg_url, partitions=4)
    admin = await asyncpg.connect(pg_url)
    try:
        woken: asyncio.Queue[int] = asyncio.Queue()

        def broken(_partition: int) -> None:
            raise RuntimeError("callback bug")

        owner.on_ingress(broken)
        owner.on_ingress(woken.put_nowait)
        await owner.listening()
        assert await other.put_ingress(2, "message", "k1", {})
        assert await asyncio.wait_for(woken.get(), 5) == 2
        assert await other.put_ingress(3, "message", "k2", {})
        assert await asyncio.wait_for(woken.get(), 5) == 3  # the listener survived the raising callback
        assert "notification callback failed" in caplog.text
        # The LISTEN connection dropped while a put happens: the notification is lost, polling finds it.
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'durable-bots listen' AND datname = current_database()"
        )
        assert await other.put_ingress(1, "message", "k3", {})
        assert [r.key for r in await owner.pending_ingress([1])] == ["k3"]
    finally:
        await admin.close()
        await owner.close()
        await other.close()


async def test_an_unexpected_listen_error_is_retried_and_never_ends_listening(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    owner = await PostgresStore.open(pg_url, partitions=2)
    other = await PostgresStore.open(pg_url, partitions=2)
    try:
        notifications = owner._notifications
        real_connect = notifications._connect
        calls = 0

        async def flaky() -> asyncpg.Connection:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("a driver bug")
            return await real_connect()

        notifications._connect = flaky  # type: ignore[method-assign]
        woken: asyncio.Queue[int] = asyncio.Queue()
        owner.on_ingress(woken.put_nowait)
        await owner.listening()
        assert "cannot LISTEN" in caplog.text
        assert await other.put_ingress(1, "message", "k", {})
        assert await asyncio.wait_for(woken.get(), 5) == 1
    finally:
        await owner.close()
        await other.close()


# --- secrets ------------------------------------------------------------------------------------------------

# Unencoded special characters in a password (an operator pasting it raw): '#', '/', '?' and '@' each make
# urlsplit (and asyncpg) cut the URL somewhere inside the password.
RAW_PASSWORDS = ["Zq9#Wv4x", "Zq9/Wv4x", "Zq9?Wv4x", "Zq9@Wv4x", "Zq9:Wv4x", "Zq9[Wv4x"]


@pytest.mark.parametrize("password", RAW_PASSWORDS)
async def test_a_password_with_raw_special_characters_never_shows(
    password: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    dsn = f"postgresql://bot:{password}@127.0.0.1:1/ops"
    shown = redact_url(dsn)
    with pytest.raises(StorageError) as info:
        await PostgresStore.open(dsn, partitions=2, connect_timeout=2)
    for text in (shown, str(info.value), caplog.text):
        for fragment in ("Zq9", "Wv4x"):
            assert fragment not in text, (fragment, text)
    if "@" in password or ":" in password:  # unambiguous: the last '@' ends the user info
        assert shown == "postgresql://bot@127.0.0.1:1/ops"


def test_a_dsn_that_is_not_a_url_is_not_shown() -> None:
    assert redact_url("host=db password=Zq9Wv4x") == "(not a postgresql:// url)"


@settings(max_examples=300, deadline=None)
@given(
    password=st.text(st.sampled_from("ABCDEFXYZ#/?@:[]%&= "), min_size=1, max_size=16),
    query=st.sampled_from(["", "?sslmode=require", "?password=QUERYSECRET", "#frag"]),
)
def test_no_part_of_a_raw_password_is_ever_shown(password: str, query: str) -> None:
    # Passwords of capitals and URL delimiters, everything else lower case: any capital shown is a leak.
    shown = redact_url(f"postgresql://bot:{password}@db-1.example:5432/ops{query}")
    assert not any(c.isupper() for c in shown), shown
