"""`OperatorRequests` on PostgreSQL: operator commands queue requests through a read-only handle (no lease)
while the leader holds the store; the leader picks them up and answers; first of finish and withdraw wins;
a leader whose lease is gone leaves them for its successor."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from harness_core.errors import LeaseLost
from harness_core.storage import OperatorRequests, PostgresStorage
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
