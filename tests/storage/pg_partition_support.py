"""Helpers of the partition tests (real cluster): open a partition that must be free, and expire a lease the
way a paused holder's lease runs out."""

from __future__ import annotations

import asyncpg

from harness_core.storage import PostgresStorage, PostgresStore


async def open_handle(store: PostgresStore, partition: int) -> PostgresStorage:
    handle = await store.open_partition(partition)
    assert isinstance(handle, PostgresStorage), handle
    return handle


async def expire(url: str, partition: int) -> None:
    """What a paused holder looks like from outside: its lease ran out by the server's clock."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "UPDATE leases SET expires_at = now() - interval '1 second' WHERE partition = $1", partition
        )
    finally:
        await conn.close()
