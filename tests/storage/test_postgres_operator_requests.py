"""`OperatorRequests` on PostgreSQL: operator commands queue requests through a read-only handle (no lease)
while the leader holds the store; the leader picks them up and answers; first of finish and withdraw wins;
a leader whose lease is gone leaves them for its successor."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harness_core.errors import LeaseLost, StorageError
from harness_core.storage import OperatorRequests, PostgresStorage, PostgresStore
from harness_core.storage._postgres_requests import PENDING, WAITING
from harness_core.storage._postgres_schema import migrate


async def test_a_read_only_handle_queues_and_the_leader_answers(pg_url: str) -> None:
    leader = await PostgresStorage.open(pg_url)
    reader = await PostgresStorage.open_read_only(pg_url)
    try:
        assert isinstance(leader, OperatorRequests) and isinstance(reader, OperatorRequests)
        first = await reader.put_operator_request("retry", {"task": 7})
        second = await reader.put_operator_request("decide", {"gate": 9, "approve": False, "name": "oncall"})
        assert second > first
        pending = await leader.pending_operator_requests()
        assert [(r.id, r.kind, r.args) for r in pending] == [
            (first, "retry", {"task": 7}),
            (second, "decide", {"gate": 9, "approve": False, "name": "oncall"}),
        ]
        assert await leader.finish_operator_request(first, "done", {"message": "task 7 is scheduled again"})
        found = await reader.operator_request(first)
        assert found is not None and found.status == "done"
        assert found.outcome == {"message": "task 7 is scheduled again"}
        assert found.finished_at is not None and found.finished_at >= found.created_at > 0
        assert [r.id for r in await leader.pending_operator_requests()] == [second]
        assert await reader.operator_request(second + 100) is None
    finally:
        await reader.close()
        await leader.close()


async def test_withdraw_and_finish_racing_for_one_request_exactly_one_wins(pg_url: str) -> None:
    leader = await PostgresStorage.open(pg_url)
    reader = await PostgresStorage.open_read_only(pg_url)
    try:
        for n in range(20):
            request_id = await reader.put_operator_request("cancel", {"task": n})
            withdrawn, finished = await asyncio.gather(
                reader.withdraw_operator_request(request_id),
                leader.finish_operator_request(request_id, "done", {"message": "cancelled"}),
            )
            assert withdrawn != finished, (n, withdrawn, finished)
            found = await reader.operator_request(request_id)
            assert found is not None
            assert found.status == ("withdrawn" if withdrawn else "done")
            # The loser cannot change it afterwards either.
            assert not await reader.withdraw_operator_request(request_id)
            assert not await leader.finish_operator_request(request_id, "failed", {"message": "late"})
        assert await leader.pending_operator_requests() == []
    finally:
        await reader.close()
        await leader.close()


async def test_a_leader_that_lost_its_lease_leaves_requests_to_its_successor(pg_url: str) -> None:
    old = await PostgresStorage.open(pg_url, lease_ttl=1.5)
    request_id = await old.put_operator_request("retry", {"task": 3})
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("UPDATE leases SET expires_at = now() - interval '1 second'")
    finally:
        await conn.close()
    new = await PostgresStorage.open(pg_url, lease_ttl=1.5, on_standby=lambda holder: None)
    try:
        assert old.lease is not None
        await asyncio.wait_for(old.lease.lost, timeout=5)
        assert await old.pending_operator_requests() == []
        with pytest.raises(LeaseLost, match="stays pending"):
            await old.finish_operator_request(request_id, "done", {"message": "too late"})
        (pending,) = await new.pending_operator_requests()
        assert pending.id == request_id and pending.status == "pending"
        assert await new.finish_operator_request(request_id, "done", {"message": "done by the successor"})
    finally:
        await old.close()
        await new.close()


async def test_a_store_at_schema_version_one_gains_the_request_table_when_the_bot_opens_it(
    pg_empty_url: str,
) -> None:
    conn = await asyncpg.connect(pg_empty_url)
    try:
        await migrate(conn, "test", upto=1)  # as the first PostgreSQL release left it
        assert await conn.fetchval("SELECT to_regclass('operator_requests')") is None
    finally:
        await conn.close()
    leader = await PostgresStorage.open(pg_empty_url)
    try:
        request_id = await leader.put_operator_request("cancel", {"task": 1})
        assert [r.id for r in await leader.pending_operator_requests()] == [request_id]
    finally:
        await leader.close()


async def test_looking_for_open_requests_uses_an_index_and_pruning_keeps_the_open_ones(
    pg_empty_url: str,
) -> None:
    # Version 3 indexed only 'pending' requests; the workers' looks ask for 'pending' or 'taken' and read the
    # whole table, which nothing emptied. Version 4 indexes both; finished requests can be pruned.
    conn = await asyncpg.connect(pg_empty_url)
    try:
        await migrate(conn, "test", upto=3)
        await conn.execute(
            "INSERT INTO operator_requests (partition, kind, args, status, outcome, created_at, finished_at) "
            "SELECT g % 64, 'retry', '{}', 'done', '{}', 0, 0 FROM generate_series(1, 20000) g"
        )
        await conn.execute(
            "INSERT INTO operator_requests (partition, kind, args, status, created_at) "
            "VALUES (3, 'retry', '{}', 'pending', 0), (3, 'cancel', '{}', 'taken', 0)"
        )
    finally:
        await conn.close()
    store = await PostgresStore.open(pg_empty_url, partitions=64)  # migrates to the current version
    try:
        await store.pool.execute("ANALYZE operator_requests")
        for query, args in ((WAITING, [list(range(32))]), (PENDING, [3, 20])):
            plan = "\n".join(row[0] for row in await store.pool.fetch("EXPLAIN " + query, *args))
            assert "operator_requests_open" in plan and "Seq Scan" not in plan, plan
        assert await store.partitions_with_operator_requests(range(64)) == {3}
        with pytest.raises(ValueError, match="finished_for"):
            await store.prune_operator_requests(finished_for=float("nan"))
        assert await store.prune_operator_requests(finished_for=60) == 20_000
        statuses = sorted(r[0] for r in await store.pool.fetch("SELECT status FROM operator_requests"))
        assert statuses == ["pending", "taken"]  # open requests stay whatever their age
    finally:
        await store.close()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.text(max_size=10), args=st.dictionaries(st.text(max_size=6), JSON, max_size=4), outcome=JSON)
@example(kind="retry\x00", args={"task": 2**70, "\x00": "\ud800"}, outcome="\x00")
async def test_any_request_round_trips_through_the_table(
    pg_url: str, kind: str, args: dict[str, Any], outcome: Any
) -> None:
    # What an operator command passes in is outside input: every JSON value (U+0000, lone surrogates, integers
    # past bigint) comes back as it went in. A kind holding U+0000 is refused by PostgreSQL text: no request.
    reader = await PostgresStorage.open_read_only(pg_url)
    try:
        if "\x00" in kind:
            with pytest.raises(StorageError, match="queue an operator request failed"):
                await reader.put_operator_request(kind, args)
            return
        request_id = await reader.put_operator_request(kind, args)
        assert await reader.finish_operator_request(request_id, "failed", {"message": "x", "value": outcome})
        found = await reader.operator_request(request_id)
        assert found is not None and (found.kind, found.args) == (kind, args)
        assert found.outcome == {"message": "x", "value": outcome}
    finally:
        await reader.close()


async def test_one_look_names_the_partitions_with_requests_to_carry_out(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, partitions=8)
    try:
        reader = store.reader()
        retry = await reader.put_operator_request("retry", {"task": 11})  # ids say their partition: 3
        await reader.put_operator_request("cancel", {"task": 3})
        decide = await reader.put_operator_request("decide", {"gate": 14, "approve": True, "name": "oncall"})
        assert await store.partitions_with_operator_requests(range(8)) == {3, 6}
        assert await store.partitions_with_operator_requests([0, 1, 2, 7]) == set()
        assert await store.partitions_with_operator_requests([]) == set()
        owner = await store.open_partition(6)
        assert isinstance(owner, PostgresStorage)
        assert await owner.claim_operator_request(decide)  # taken, not finished: still to carry out
        assert await store.partitions_with_operator_requests([6]) == {6}
        assert await owner.finish_operator_request(decide, "done", {"message": "approved"})
        assert await reader.withdraw_operator_request(retry)
        assert await store.partitions_with_operator_requests(range(8)) == {3}  # the cancel is left
        await owner.close()
    finally:
        await store.close()
