"""Closing what one of the store's single-connection helpers owns (the put line, the lease renewer, the LISTEN
connection): its one background task, then its one connection."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

CLOSE_TIMEOUT = 1.0  # seconds a polite close may take before the connection is cut


async def end_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (if any) and wait until it has ended."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def close_connection(conn: Any) -> None:
    """Close an asyncpg connection politely, cutting it if that fails or takes longer than `CLOSE_TIMEOUT`."""
    if conn is None or conn.is_closed():
        return
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), CLOSE_TIMEOUT)
    if not conn.is_closed():
        conn.terminate()
