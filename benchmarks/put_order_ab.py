"""What inserting ingress puts in key order costs: the shipped put statement (ids drawn in the order the puts
were made, rows inserted in key order, so two workers' writes sharing keys never deadlock) against the
statement it replaced (rows inserted in the order made), alternately on one durable server in one run, for
writes of 1, 8 and 64 puts. Not one of `python -m benchmarks`' benchmarks:

    .venv/bin/python -m benchmarks.put_order_ab [rounds]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid

import asyncpg

from benchmarks._pg_server import durable_server
from harness_core.storage import PostgresStore
from harness_core.storage._postgres_put import PUT_MANY

ARRIVAL_ORDER = """
INSERT INTO ingress (key, partition, kind, payload, created_at)
SELECT k, p, t, d, (extract(epoch FROM clock_timestamp()) * 1000)::bigint
FROM unnest($1::text[], $2::int[], $3::text[], $4::text[]) WITH ORDINALITY AS u(k, p, t, d, n)
ORDER BY n
ON CONFLICT (key) DO NOTHING RETURNING key
"""
SIZES = (1, 8, 64)
PAYLOAD = '{"text": "' + "x" * 300 + '"}'  # about a Slack message's size


async def measure(rounds: int) -> dict[tuple[str, int], float]:
    """Median seconds per write of each statement and size."""
    statements = (("arrival order", ARRIVAL_ORDER), ("key order", PUT_MANY))
    times: dict[tuple[str, int], list[float]] = {(name, size): [] for name, _ in statements for size in SIZES}
    prefix = uuid.uuid4().hex[:8]
    made = 0
    async with durable_server() as server:
        store = await PostgresStore.open(server.admin_url, partitions=64)
        await store.close()  # only its schema
        conn = await asyncpg.connect(server.admin_url)
        try:
            for turn in range(rounds):
                for size in SIZES:
                    # Alternate which goes first, so neither always meets a warmer server.
                    for name, sql in statements if turn % 2 else statements[::-1]:
                        # Keys whose text order differs from the order made (as Slack's timestamps in
                        # different channels do).
                        keys = [f"bench:{prefix}:C{(made + i) % 30}:{made + i}" for i in range(size)]
                        made += size
                        started = time.perf_counter()
                        await conn.fetch(
                            sql, keys, [i % 64 for i in range(size)], ["message"] * size, [PAYLOAD] * size
                        )
                        times[(name, size)].append(time.perf_counter() - started)
        finally:
            await conn.close()
    return {key: statistics.median(values) for key, values in times.items()}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    medians = asyncio.run(measure(rounds))
    for size in SIZES:
        old, new = medians[("arrival order", size)], medians[("key order", size)]
        print(
            f"{size:3} puts per write: arrival order {old * 1e3:.3f} ms, key order {new * 1e3:.3f} ms "
            f"(median of {rounds}); key order / arrival order = {new / old:.2f}"
        )


if __name__ == "__main__":
    main()
