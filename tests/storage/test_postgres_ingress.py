"""Ingress and workers on a PostgreSQL store shared by many workers (issue 16): an event put by any worker is
stored exactly once and wakes the owner (LISTEN/NOTIFY); payloads are strict JSON, refused before any I/O
otherwise; heartbeats, draining and leaving are seen by the other workers. Real cluster, no mocks."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness_core import clean_json
from harness_core.errors import StorageClosed, StorageError, StorageRequestError, StrictJsonError
from harness_core.storage import PostgresStore


async def test_the_same_key_put_concurrently_by_two_workers_is_stored_once(pg_url: str) -> None:
    a = await PostgresStore.open(pg_url, partitions=4)
    b = await PostgresStore.open(pg_url, partitions=4)
    try:
        keys = [f"slack:T1:C{n % 3}:{n}" for n in range(40)]
        results = await asyncio.gather(
            *(
                store.put_ingress(n % 4, "message", key, {"n": n})
                for n, key in enumerate(keys)
                for store in (a, b)
            )
        )
        assert [results[2 * i] + results[2 * i + 1] for i in range(len(keys))] == [1] * len(keys)
        pending = await b.pending_ingress(range(4), limit=1000)
        assert sorted(r.key for r in pending) == sorted(keys)
        assert [r.id for r in pending] == sorted(r.id for r in pending)
        # A worker that gets the same event again later (a Slack retry on another connection) adds nothing.
        assert not await a.put_ingress(0, "message", keys[0], {"n": 0})
        mine = await a.pending_ingress([1], limit=1000)
        assert {r.partition for r in mine} == {1} and len(mine) == 10
        for record in mine:
            await a.finish_ingress(record.id)
        await a.finish_ingress(mine[0].id)  # twice is harmless
        assert await a.pending_ingress([1]) == []
        assert len(await a.pending_ingress([0, 2, 3], limit=1000)) == 30
        assert await a.pending_ingress([]) == []
    finally:
        await a.close()
        await b.close()


async def test_a_put_wakes_the_owner_in_another_store(pg_url: str) -> None:
    owner = await PostgresStore.open(pg_url, partitions=8)
    other = await PostgresStore.open(pg_url, partitions=8)
    try:
        woken: asyncio.Queue[int] = asyncio.Queue()
        stop = owner.on_ingress(woken.put_nowait)
        await owner.listening()
        assert await other.put_ingress(6, "click", "slack:action:1", {"value": "approve"})
        assert await asyncio.wait_for(woken.get(), 5) == 6
        assert not await other.put_ingress(6, "click", "slack:action:1", {"value": "approve"})
        await asyncio.sleep(0.3)
        assert woken.empty()  # a duplicate wakes nobody
        [record] = await owner.pending_ingress([6])
        assert (record.kind, record.key, record.payload, record.partition) == (
            "click",
            "slack:action:1",
            {"value": "approve"},
            6,
        )
        assert record.created_ms > 0
        stop()
        assert await other.put_ingress(6, "click", "slack:action:2", {})
        await asyncio.sleep(0.3)
        assert woken.empty()  # unsubscribed
    finally:
        await owner.close()
        await other.close()


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"x": math.nan}, "x"),
        ({"tags": {"a", "b"}}, "tags"),
        ({"deep": {1: "non-string key"}}, "deep"),
        ({"n": 2**70}, "n"),
        (["not", "an", "object"], "JSON object"),
    ],
)
async def test_a_bad_payload_is_refused_before_anything_is_written(
    pg_url: str, payload: Any, fragment: str
) -> None:
    store = await PostgresStore.open(pg_url, partitions=2)
    try:
        with pytest.raises(StrictJsonError) as info:
            await store.put_ingress(1, "message", "slack:bad", payload)
        assert "slack:bad" in str(info.value) and fragment in str(info.value)
        assert await store.pool.fetchval("SELECT count(*) FROM ingress") == 0
        with pytest.raises(StorageRequestError, match="0 to 1"):
            await store.put_ingress(2, "message", "slack:ok", {})
        with pytest.raises(StorageRequestError, match="key"):
            await store.put_ingress(0, "message", "nul\x00key", {})
        assert await store.put_ingress(0, "message", "slack:bad", {"fine": True})  # the key is still free
    finally:
        await store.close()


# Any code point, lone surrogates and U+0000 included (st.text() alone never draws surrogates).
_outside_text = st.text(
    st.characters(codec=None, categories=["Cs", "Cc", "L", "N", "P", "S", "Z"]), max_size=12
)
_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _outside_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_outside_text, children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.dictionaries(_outside_text, _json_values, max_size=5), key=_outside_text)
def test_payloads_read_back_as_the_strict_json_they_clean_to(
    pg_url: str, payload: dict[str, Any], key: str
) -> None:
    """Text from outside (lone surrogates, U+0000, any code point) is kept as `clean_json` makes it."""

    async def run() -> None:
        store = await PostgresStore.open(pg_url, partitions=1)
        try:
            if not key or not key.isprintable() or any(0xD800 <= ord(c) <= 0xDFFF for c in key):
                with pytest.raises(StorageRequestError):
                    await store.put_ingress(0, "message", key, payload)
                return
            await store.pool.execute("DELETE FROM ingress")
            assert await store.put_ingress(0, "message", key, payload)
            [record] = await store.pending_ingress([0])
            assert record.key == key
            assert record.payload == clean_json(payload)
        finally:
            await store.close()

    asyncio.run(run())


async def test_workers_see_each_other_join_drain_and_leave(pg_url: str) -> None:
    a = await PostgresStore.open(pg_url, partitions=4, lease_ttl=1.5, holder="worker-a")
    b = await PostgresStore.open(pg_url, partitions=4, lease_ttl=1.5, holder="worker-b")
    try:
        changes: asyncio.Queue[None] = asyncio.Queue()
        stop = a.on_change(lambda: changes.put_nowait(None))
        await a.listening()
        await a.heartbeat()
        await b.heartbeat()
        for _ in range(2):  # both joined: a's own join is notified to its listener too (it came after, in CI)
            await asyncio.wait_for(changes.get(), 5)
        workers = await a.live_workers()
        assert [w.holder for w in workers] == ["worker-a", "worker-b"]
        assert not any(w.draining for w in workers) and all(w.pid and w.host for w in workers)
        while not changes.empty():
            changes.get_nowait()
        await b.heartbeat()  # nothing new: no notification
        await asyncio.sleep(0.3)
        assert changes.empty()
        await b.heartbeat(draining=True)
        await asyncio.wait_for(changes.get(), 5)
        assert [w.draining for w in await a.live_workers()] == [False, True]
        await b.leave()
        await asyncio.wait_for(changes.get(), 5)
        assert [w.holder for w in await a.live_workers()] == ["worker-a"]
        await asyncio.sleep(2.0)  # a's heartbeat expires without renewal: a dead worker drops out
        assert await b.live_workers() == []
        stop()
    finally:
        await a.close()
        await b.close()


async def test_a_dropped_listen_connection_is_replaced(pg_url: str) -> None:
    owner = await PostgresStore.open(pg_url, partitions=2)
    other = await PostgresStore.open(pg_url, partitions=2)
    try:
        woken: asyncio.Queue[int] = asyncio.Queue()
        owner.on_ingress(woken.put_nowait)
        await owner.listening()
        killed = await other.pool.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'durable-bots listen' AND datname = current_database()"
        )
        assert killed == 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        n = 0
        while woken.empty():  # puts sent while reconnecting are lost (the owner polls for those)
            assert loop.time() < deadline, "the LISTEN connection was not replaced"
            n += 1
            await other.put_ingress(1, "message", f"k{n}", {})
            await asyncio.sleep(0.2)
        assert woken.get_nowait() == 1
    finally:
        await owner.close()
        await other.close()


async def test_only_old_finished_records_are_pruned(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=1)
    try:
        for key in ("old", "recent", "open"):
            assert await store.put_ingress(0, "message", key, {})
        records = {r.key: r for r in await store.pending_ingress([0])}
        await store.finish_ingress(records["old"].id)
        await store.finish_ingress(records["recent"].id)
        await store.pool.execute("UPDATE ingress SET finished_at = finished_at - 120000 WHERE key = 'old'")
        assert await store.prune_ingress(finished_for=60) == 1
        keys = [r[0] for r in await store.pool.fetch("SELECT key FROM ingress ORDER BY id")]
        assert keys == ["recent", "open"]
        assert await store.put_ingress(0, "message", "old", {})  # its key is free again
        assert not await store.put_ingress(0, "message", "recent", {})
    finally:
        await store.close()


async def test_dropped_records_free_their_keys_at_once(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=1)
    try:
        for key in ("click:slack:5:U1:approve", "click:slack:5:U2:approve"):
            assert await store.put_ingress(0, "click", key, {})
        refused, accepted = await store.pending_ingress([0])
        await store.finish_ingress(accepted.id)
        await store.drop_ingresses([refused.id, refused.id])  # twice in one call: harmless
        await store.drop_ingresses([])
        assert await store.put_ingress(0, "click", refused.key, {})  # the refused clicker may click again
        assert not await store.put_ingress(0, "click", accepted.key, {})  # a finished key is still kept
    finally:
        await store.close()


async def test_wake_ups_are_coalesced_per_partition_yet_every_record_is_there(pg_url: str) -> None:
    owner = await PostgresStore.open(pg_url, partitions=8)
    other = await PostgresStore.open(pg_url, partitions=8)
    try:
        woken: asyncio.Queue[int] = asyncio.Queue()
        owner.on_ingress(woken.put_nowait)
        await owner.listening()
        other.waker.window = 0.3  # every put below lands within a few windows
        puts = [(2 if n % 3 else 5, f"slack:T1:C{n}:{n}") for n in range(30)]
        results = await asyncio.gather(*(other.put_ingress(p, "message", k, {"n": 1}) for p, k in puts))
        assert all(results)
        seen: set[int] = set()
        while seen != {2, 5}:
            seen.add(await asyncio.wait_for(woken.get(), 5))
        # One NOTIFY transaction per window, each waking every partition marked in it: far fewer than puts.
        # (The owner can hear a NOTIFY before the sender's commit call returns and counts it.)
        for _ in range(100):
            if other.waker.sent:
                break
            await asyncio.sleep(0.02)
        assert 1 <= other.waker.sent < len(puts) // 2
        pending = await owner.pending_ingress([2, 5], limit=100)
        assert sorted(r.key for r in pending) == sorted(k for _, k in puts)
    finally:
        await owner.close()
        await other.close()


async def test_a_put_made_just_before_close_still_wakes_the_owner(pg_url: str) -> None:
    owner = await PostgresStore.open(pg_url, partitions=4)
    other = await PostgresStore.open(pg_url, partitions=4)
    try:
        woken: asyncio.Queue[int] = asyncio.Queue()
        owner.on_ingress(woken.put_nowait)
        await owner.listening()
        other.waker.window = 30.0  # only `close` can send it in time
        assert await other.put_ingress(3, "message", "last", {})
        await other.close()
        assert await asyncio.wait_for(woken.get(), 5) == 3
    finally:
        await owner.close()
        await other.close()


async def test_many_records_are_finished_in_one_call(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=2)
    try:
        for n in range(6):
            assert await store.put_ingress(n % 2, "message", f"m{n}", {"n": n})
        records = await store.pending_ingress([0, 1])
        done = [r.id for r in records if r.partition == 0]
        await store.finish_ingresses(done)
        await store.finish_ingresses(done + done)  # again, and repeated ids: harmless
        await store.finish_ingresses([])
        assert [r.key for r in await store.pending_ingress([0, 1])] == ["m1", "m3", "m5"]
        finished = await store.pool.fetch("SELECT key FROM ingress WHERE finished_at IS NOT NULL ORDER BY id")
        assert [row[0] for row in finished] == ["m0", "m2", "m4"]
    finally:
        await store.close()


async def test_a_pooled_connection_is_released_without_a_reset_round_trip(pg_url: str) -> None:
    """Pooled connections keep no session state, so releasing one sends nothing (asyncpg's default sends
    `... RESET ALL` each time: a round trip per storage call)."""
    store = await PostgresStore.open(pg_url, partitions=2, pool_size=1)
    watcher = await PostgresStore.open(pg_url, partitions=2)
    try:
        await store.pending_ingress([1])
        await asyncio.sleep(0.1)
        pid = await store.pool.fetchval("SELECT pg_backend_pid()")
        await asyncio.sleep(0.1)
        last = await watcher.pool.fetchval("SELECT query FROM pg_stat_activity WHERE pid = $1", pid)
        assert last == "SELECT pg_backend_pid()"  # the statement itself was the last one sent
    finally:
        await store.close()
        await watcher.close()


async def test_puts_made_together_are_committed_together_in_the_order_made(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=4)
    try:
        keys = [f"slack:T1:C1:{n}" for n in range(60)] + ["slack:T1:C1:7"]  # the last repeats a key
        results = await asyncio.gather(
            *(store.put_ingress(n % 4, "message", k, {"n": n}) for n, k in enumerate(keys))
        )
        assert results == [True] * 60 + [False]
        assert store.puts.writes < 30  # puts queued behind a write share the next one
        pending = await store.pending_ingress(range(4), limit=100)
        assert [r.key for r in pending] == keys[:60]  # ids follow the order the puts were made
        assert [r.payload["n"] for r in pending] == list(range(60))
    finally:
        await store.close()


async def test_a_dropped_put_connection_fails_only_the_puts_in_flight_and_is_replaced(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=2)
    try:
        assert await store.put_ingress(0, "message", "before", {})
        dropped = await store.pool.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'durable-bots ingress'"
        )
        assert dropped == 1
        await asyncio.sleep(0.1)
        outcomes: list[bool | str] = []
        for _ in range(2):  # the first may meet the dead connection: a clear error, nothing acknowledged
            try:
                outcomes.append(await store.put_ingress(1, "message", "after", {}))
            except StorageError as exc:
                outcomes.append(str(exc))
        assert True in outcomes
        assert all("put an ingress record failed" in o for o in outcomes if isinstance(o, str))
        assert [r.key for r in await store.pending_ingress([0, 1])] == ["before", "after"]
    finally:
        await store.close()


async def test_a_closed_store_refuses_puts(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=2)
    await store.close()
    with pytest.raises(StorageClosed):
        await store.put_ingress(0, "message", "late", {})


async def test_a_write_the_server_aborts_to_break_a_deadlock_is_repeated(pg_url: str) -> None:
    """Two workers' put lines can hold the same keys in opposite orders (one event sent to both: a Slack retry,
    or a mention's `message` and `app_mention`); the server then aborts one write. Found in a benchmark run
    where a warm-up event was never acknowledged."""
    store = await PostgresStore.open(pg_url, partitions=1)
    other = await asyncpg.connect(pg_url)
    watcher = await asyncpg.connect(pg_url)
    insert = (
        "INSERT INTO ingress (key, partition, kind, payload, created_at) VALUES ($1, 0, 'message', '{}', 0)"
    )
    try:
        await other.execute("SET deadlock_timeout = '60s'")  # so the put line's backend is the one aborted
        async with other.transaction():
            await other.execute(insert, "key-b")
            # One write of [a, b]: it inserts a, then waits for the other transaction's b.
            puts = asyncio.gather(
                store.put_ingress(0, "message", "key-a", {}), store.put_ingress(0, "message", "key-b", {})
            )
            for _ in range(500):
                waiting = await watcher.fetchval(  # not `other`: in a transaction it sees one snapshot
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND application_name LIKE '%ingress'"
                )
                if waiting:
                    break
                await asyncio.sleep(0.01)
            assert waiting == 1
            await other.execute(
                insert, "key-a"
            )  # waits for the put line's a: a deadlock, which aborts the write
        # Repeated after the other transaction committed both keys: neither is new to the put line.
        assert await asyncio.wait_for(puts, 30) == [False, False]
        # At least once: the repeat may take `key-a` again before the other transaction's waiting insert does,
        # and deadlock once more (each repeat is safe; at most DEADLOCK_RETRIES).
        assert store.puts.deadlocks >= 1
        assert await other.fetchval("SELECT count(*) FROM ingress WHERE key IN ('key-a', 'key-b')") == 2
    finally:
        await watcher.close()
        await other.close()
        await store.close()


async def test_two_workers_writes_sharing_keys_in_opposite_orders_do_not_deadlock(pg_url: str) -> None:
    """Each worker's write holds the same two events in the opposite order (a mention's `message` and
    `app_mention`, each sent to a random connection). Both writes are held after their first row until both
    have started; inserting in arrival order they would then wait for each other's row."""
    first = await PostgresStore.open(pg_url, partitions=1)
    second = await PostgresStore.open(pg_url, partitions=1)
    gate = await asyncpg.connect(pg_url)
    watcher = await asyncpg.connect(pg_url)
    try:
        # The gate holds keys `g1` and `g2` uncommitted: a write reaching one waits there.
        gate_tx = gate.transaction()
        await gate_tx.start()
        for key in ("g1", "g2"):
            await gate.execute(
                "INSERT INTO ingress (key, partition, kind, payload, created_at) VALUES ($1, 0, 'm', '{}', 0)",
                key,
            )

        def write(store: PostgresStore, keys: list[str]) -> Any:
            return asyncio.gather(*(store.put_ingress(0, "message", key, {"key": key}) for key in keys))

        ones = write(first, ["x", "g1", "y"])
        twos = write(second, ["y", "g2", "x"])
        for _ in range(500):
            waiting = await watcher.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND application_name LIKE '%ingress'"
            )
            if waiting == 2:
                break
            await asyncio.sleep(0.01)
        assert waiting == 2
        await gate_tx.rollback()  # both writes go on
        one, two = await asyncio.wait_for(asyncio.gather(ones, twos), 30)
        assert first.puts.deadlocks == second.puts.deadlocks == 0
        assert one[1] and two[1]  # each gate key is its write's own
        assert [one[0] + two[2], one[2] + two[0]] == [1, 1]  # x and y: new to exactly one worker each
        assert await watcher.fetchval("SELECT count(*) FROM ingress WHERE key IN ('x', 'y', 'g1', 'g2')") == 4
    finally:
        await watcher.close()
        await gate.close()
        await first.close()
        await second.close()
