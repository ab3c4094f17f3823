"""The physical anchor: raw aiosqlite `INSERT` + `commit()`, one transaction per row, on the same disk with the
same journal (WAL) and sync level as our store."""

from __future__ import annotations

import time
from pathlib import Path

import aiosqlite

from benchmarks._env import Durability


async def raw_commit_rate(
    path: Path, count: int, *, row_bytes: int, durability: Durability = "normal"
) -> float:
    """Commits per second of `count` sequential insert+commit pairs of a `row_bytes` text row."""
    async with aiosqlite.connect(str(path)) as conn:
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute(f"PRAGMA synchronous={durability.upper()}")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY, conversation_id INTEGER, record TEXT)"
        )
        await conn.commit()
        payload = "x" * row_bytes
        for _ in range(min(200, count)):  # warm the file and the worker thread
            await conn.execute("INSERT INTO rows (conversation_id, record) VALUES (?, ?)", (1, payload))
            await conn.commit()
        started = time.perf_counter()
        for _ in range(count):
            await conn.execute("INSERT INTO rows (conversation_id, record) VALUES (?, ?)", (1, payload))
            await conn.commit()
        return count / (time.perf_counter() - started)
