"""The running bot's side of operator requests, in process: whatever lands in the request table (it is
written by another process) gets an answer and never breaks the desk or leaves a request pending."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from adapters.bridge import Bridge
from bots.operator_requests import OperatorDesk, ask_running_bot
from harness_core import Harness, NotFound
from harness_core.storage import PostgresStorage, SqliteStorage

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
ARGS = st.dictionaries(st.sampled_from(["task", "gate", "approve", "name", "other"]), JSON, max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["retry", "cancel", "decide", "reboot", ""]), args=ARGS)
@example(kind="retry", args={"task": 2**70})  # past SQLite's integers: the lookup itself raises
@example(kind="decide", args={"gate": "7", "approve": True})  # no name
async def test_any_request_gets_an_answer_and_the_desk_keeps_going(
    tmp_path_factory: Any, kind: str, args: dict[str, Any]
) -> None:
    path: Path = tmp_path_factory.mktemp("desk") / "s.sqlite"
    storage = await SqliteStorage.open(path)
    harness = await Harness.open(storage)
    bridge = Bridge(harness)
    desk = OperatorDesk(storage, harness, bridge)
    try:
        request_id = await storage.put_operator_request(kind, json.loads(json.dumps(args)))
        for request in await storage.pending_operator_requests():
            await desk.handle(request)
        found = await storage.operator_request(request_id)
        assert found is not None and found.status in ("done", "failed")
        assert isinstance((found.outcome or {}).get("message"), str)
        assert await storage.pending_operator_requests() == []
    finally:
        await bridge.stop()
        await harness.close()


async def test_a_request_nobody_picks_up_is_withdrawn(tmp_path: Path) -> None:
    owner = await SqliteStorage.open(tmp_path / "s.sqlite")
    reader = await SqliteStorage.open_read_only(tmp_path / "s.sqlite")
    try:
        assert await ask_running_bot(reader, "retry", {"task": 1}, timeout=0.3) is None
        found = await reader.operator_request(1)
        assert found is not None and found.status == "withdrawn"
        assert await owner.pending_operator_requests() == []
        assert not await owner.finish_operator_request(1, "done", {"message": "late"})  # first wins
    finally:
        await reader.close()
        await owner.close()


async def test_on_postgres_the_leaders_desk_answers_a_read_only_handle_within_a_second(pg_url: str) -> None:
    storage = await PostgresStorage.open(pg_url)
    harness = await Harness.open(storage)
    bridge = Bridge(harness)
    desk = OperatorDesk(storage, harness, bridge)
    desk.start()
    reader = await PostgresStorage.open_read_only(pg_url)
    try:
        found = await ask_running_bot(reader, "retry", {"task": 424242}, timeout=5)
        assert found is not None and found.status == "failed"
        assert found.outcome == {"message": "there is no task 424242"}
        assert found.finished_at is not None and found.finished_at - found.created_at < 1500
    finally:
        await reader.close()
        await desk.stop()
        await bridge.stop()
        await harness.close()


async def test_a_request_the_bot_took_is_answered_not_withdrawn_when_the_asker_times_out(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A slow bot (paused, a busy loop) took a retry and is still carrying it out when the command's wait
    ends: the command must report the outcome, never 'withdrawn, nothing was done' for a retry that ran."""
    import asyncio

    from bots import operator_requests

    release = asyncio.Event()

    async def slow(harness: Any, bridge: Any, request: Any) -> Any:
        await release.wait()
        return "done", {"message": "task 1 is scheduled again"}

    monkeypatch.setattr(operator_requests, "carry_out", slow)
    owner = await SqliteStorage.open(tmp_path / "s.sqlite")
    harness = await Harness.open(owner)
    bridge = Bridge(harness)
    desk = OperatorDesk(owner, harness, bridge)
    reader = await SqliteStorage.open_read_only(tmp_path / "s.sqlite")
    try:
        asking = asyncio.create_task(ask_running_bot(reader, "retry", {"task": 1}, timeout=0.3))
        for _ in range(500):  # the request is written by the other handle: poll the table for it
            pending = await owner.pending_operator_requests()
            if pending:
                break
            await asyncio.sleep(0.01)
        handling = asyncio.create_task(desk.handle(pending[0]))
        await asyncio.sleep(0.8)  # the asker's timeout passes while the bot is at work
        assert not asking.done()
        release.set()
        await handling
        found = await asking
        assert found is not None and found.status == "done", found
        assert found.outcome == {"message": "task 1 is scheduled again"}
    finally:
        await reader.close()
        await bridge.stop()
        await harness.close()


async def test_on_sqlite_queuing_a_request_deletes_finished_ones_older_than_a_week(tmp_path: Path) -> None:
    owner = await SqliteStorage.open(tmp_path / "s.sqlite")
    try:
        old, recent, open_ = [await owner.put_operator_request("retry", {"task": n}) for n in (1, 2, 3)]
        for request_id in (old, recent):
            assert await owner.finish_operator_request(request_id, "done", {"message": "done"})
        week = 7 * 86_400_000
        conn = sqlite3.connect(tmp_path / "s.sqlite")
        with conn:
            conn.execute(
                "UPDATE operator_requests SET finished_at = finished_at - ? WHERE id = ?", (week + 1, old)
            )
            conn.execute("UPDATE operator_requests SET created_at = 0 WHERE id = ?", (open_,))
            plan = conn.execute(
                "EXPLAIN QUERY PLAN SELECT id FROM operator_requests WHERE status IN ('pending', 'taken') "
                "ORDER BY id LIMIT 20"
            ).fetchall()
        conn.close()
        assert "operator_requests_open" in str(plan), plan
        await owner.put_operator_request("cancel", {"task": 4})
        assert await owner.operator_request(old) is None
        assert await owner.operator_request(recent) is not None
        assert await owner.operator_request(open_) is not None  # pending: kept whatever its age
    finally:
        await owner.close()


async def test_a_request_deleted_while_its_command_waits_ends_the_wait_with_a_clear_error(
    tmp_path: Path,
) -> None:
    owner = await SqliteStorage.open(tmp_path / "s.sqlite")
    reader = await SqliteStorage.open_read_only(tmp_path / "s.sqlite")
    try:
        asking = asyncio.create_task(ask_running_bot(reader, "retry", {"task": 1}, timeout=30))
        for _ in range(500):
            if await owner.pending_operator_requests():
                break
            await asyncio.sleep(0.01)
        conn = sqlite3.connect(tmp_path / "s.sqlite")
        with conn:
            conn.execute("DELETE FROM operator_requests")
        conn.close()
        with pytest.raises(NotFound, match="no longer in the request table"):
            await asyncio.wait_for(asking, 5)  # not a busy loop until the timeout
    finally:
        await reader.close()
        await owner.close()
