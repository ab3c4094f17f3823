"""Observing: conversation.watch() (snapshot + committed changes, bounded) and watch_events() with cursors."""

from __future__ import annotations

import asyncio
from typing import Any

from harness_core import EntryDraft, Input, Tx, tool, watch_events
from harness_core.messages import ToolResultMessage
from harness_core.models import ModelRequest
from harness_core.models.faux import faux_assistant, faux_text, faux_tool_call

from .helpers import FAUX, open_harness


async def test_watch_starts_with_snapshot_then_delivers_committed_changes() -> None:
    harness, _ = await open_harness(responder=lambda _r: faux_assistant("hello there"))
    root = await harness.root(agent=FAUX)
    async with root.watch() as frames:
        iterator = frames.__aiter__()
        first = await anext(iterator)
        assert first.kind == "snapshot"
        assert "core.live" in first.docs
        await root.submit(Input("hi"))
        texts: list[str] = []
        while True:
            frame = await asyncio.wait_for(anext(iterator), 5)
            texts.extend(e.model[0].text() for e in frame.entries if e.kind == "core.assistant" and e.model)  # type: ignore[union-attr]
            if texts:
                break
        assert texts == ["hello there"]
    await harness.close()


async def test_slow_watch_consumer_gets_one_fresh_snapshot_instead_of_a_backlog() -> None:
    harness, _ = await open_harness()
    root = await harness.root()
    watch = root.watch()
    iterator = watch.__aiter__()
    assert (await anext(iterator)).kind == "snapshot"
    for i in range(150):
        await harness.commit(
            lambda tx, i=i: tx.append_entry(root.id, EntryDraft(kind="test.n", data={"i": i}))
        )
    frame = await asyncio.wait_for(anext(iterator), 5)
    assert frame.kind == "snapshot"
    assert len([e for e in frame.entries if e.kind == "test.n"]) == 150
    await harness.commit(lambda tx: tx.append_entry(root.id, EntryDraft(kind="test.n", data={"i": "after"})))
    frame = await asyncio.wait_for(anext(iterator), 5)
    assert frame.kind == "change" and frame.entries[0].data == {"i": "after"}
    watch.stop()
    await harness.close()


def tool_turn(request: ModelRequest) -> Any:
    if isinstance(request.messages[-1], ToolResultMessage):
        return faux_assistant([faux_text("done")])
    return faux_assistant([faux_tool_call("lookup", {"q": "x"}, id="c1")])


@tool(replay="safe")
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


async def collect(stream: Any, until: str, limit: float = 5) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    iterator = stream.__aiter__()
    while not any(e["type"] == until for e in events):
        batch = await asyncio.wait_for(anext(iterator), limit)
        events.extend(batch.events)
    return events


async def test_watch_events_orders_a_tool_turn() -> None:
    harness, _ = await open_harness(tools=[lookup], responder=tool_turn)
    root = await harness.root(agent=FAUX)
    async with watch_events(harness, root.id) as stream:
        iterator = stream.__aiter__()
        snapshot = await anext(iterator)
        assert snapshot.events[0]["type"] == "snapshot"
        await root.submit(Input("go"))
        events: list[dict[str, Any]] = []
        while not any(e["type"] == "run_end" for e in events):
            events.extend((await asyncio.wait_for(anext(iterator), 5)).events)
    types = [e["type"] for e in events]
    assert types.index("run_start") < types.index("turn_start") < types.index("tool_execution_start")
    end = types.index("tool_execution_end")
    # The tool result's message events follow its tool_execution_end.
    result_start = next(
        i
        for i, e in enumerate(events)
        if e["type"] == "message_start" and e.get("entry", {}).get("kind") == "core.tool-result"
    )
    assert end < result_start
    assert types[-1] == "run_end" or "run_end" in types
    submission_events = [e for e in events if e["type"] == "submission"]
    assert submission_events[-1]["record"]["status"] == "done"
    await harness.close()


async def test_watch_events_resume_from_cursor_without_snapshot() -> None:
    harness, _ = await open_harness(responder=lambda r: faux_assistant("answer"))
    root = await harness.root(agent=FAUX)
    async with watch_events(harness, root.id) as stream:
        first = await anext(stream.__aiter__())
        cursor = first.cursor
    await (await root.submit(Input("while you were away"))).wait()
    async with watch_events(harness, root.id, after=cursor) as resumed:
        batch = await anext(resumed.__aiter__())
    types = [e["type"] for e in batch.events]
    assert types[0] == "resume" and "snapshot" not in types
    ended = [e["entry"] for e in batch.events if e["type"] == "message_end"]
    assert [e["kind"] for e in ended] == ["core.user", "core.assistant"]
    assert batch.cursor >= cursor
    await harness.close()


async def test_slow_event_consumer_gets_a_snapshot() -> None:
    harness, _ = await open_harness()
    root = await harness.root()
    stream = watch_events(harness, root.id)
    iterator = stream.__aiter__()
    await anext(iterator)

    async def add(tx: Tx, i: int) -> None:
        tx.append_entry(root.id, EntryDraft(kind="test.n", data={"i": i}))

    for i in range(120):
        await harness.commit(lambda tx, i=i: add(tx, i))
    batch = await asyncio.wait_for(anext(iterator), 5)
    assert batch.events[0]["type"] == "snapshot"
    stream.stop()
    await harness.close()


async def test_inspect_reports_waiting_and_submissions() -> None:
    gate = asyncio.Event()

    @tool
    async def hold() -> str:
        """Hold."""
        await gate.wait()
        return "ok"

    harness, _ = await open_harness(
        tools=[hold],
        responder=lambda r: (
            faux_assistant([faux_tool_call("hold", {}, id="h")])
            if not isinstance(r.messages[-1], ToolResultMessage)
            else faux_assistant("fin")
        ),
    )
    root = await harness.root(agent=FAUX)
    run = await root.submit(Input("go"))
    queued = await root.submit(Input("next"))
    while True:
        inspection = await harness.inspect()
        states = {t.record.kind: t.state for t in inspection.tasks}
        if states.get("core.tool") == "running":
            break
        await asyncio.sleep(0.01)
    assert states["core.generation"] == "waiting"
    assert inspection.scheduling == "running"
    assert [s.id for s in inspection.submissions] == [run.id, queued.id]
    gate.set()
    await queued.wait()
    await harness.close()
