"""Observing: conversation.watch() (snapshot + committed changes, bounded) and watch_events() with cursors."""

from __future__ import annotations

import asyncio
from typing import Any

from harness_core import EntryDraft, Extension, Input, ToolApi, Tx, define_task, tool, watch_events
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


async def collect_events(harness: Any, conversation_id: int, act: Any, until: Any) -> list[dict[str, Any]]:
    """Events from a fresh watch while `act()` runs, until `until(events)` holds."""
    events: list[dict[str, Any]] = []
    async with watch_events(harness, conversation_id) as stream:
        iterator = stream.__aiter__()
        await anext(iterator)  # the snapshot
        await act()
        while not until(events):
            events.extend((await asyncio.wait_for(anext(iterator), 5)).events)
    return events


async def test_streaming_text_and_tool_output_arrive_as_update_events() -> None:
    @tool
    async def tail_log(service: str, api: ToolApi) -> str:
        """Tail a service's log."""
        api.output(f"{service}: starting\n")
        await asyncio.sleep(0.25)  # longer than the output interval: the first line is committed alone
        api.output(f"{service}: ready\n")
        return "tailed"

    def respond(request: ModelRequest) -> Any:
        if isinstance(request.messages[-1], ToolResultMessage):
            return faux_assistant([faux_text("the service came up cleanly after a slow start " * 3)])
        return faux_assistant([faux_tool_call("tail_log", {"service": "api"}, id="t1")])

    harness, faux = await open_harness(tools=[tail_log], responder=respond)
    faux.chunk_size = 5
    faux.delay_ms = 20  # ~0.6 s of streaming: several committed partials
    root = await harness.root(agent=FAUX)
    events = await collect_events(
        harness,
        root.id,
        lambda: root.submit(Input("tail it")),
        lambda es: any(e["type"] == "run_end" for e in es),
    )
    outputs = [e["output"] for e in events if e["type"] == "tool_execution_update"]
    assert outputs and outputs[0] == "api: starting\n"
    deltas = [e["delta"] for e in events if e["type"] == "message_update"]
    assert len(deltas) >= 2 and all(deltas)
    final = [e for e in events if e["type"] == "message_end" and e["entry"]["kind"] == "core.assistant"][-1]
    assert "".join(deltas) in str(final["entry"])  # the deltas are pieces of the final text, in order
    await harness.close()


async def test_queued_input_shows_as_inbox_update_and_a_faulted_task_as_task_failed() -> None:
    release = asyncio.Event()

    @tool
    async def wait_here() -> str:
        """Wait."""
        await release.wait()
        return "done"

    def respond(request: ModelRequest) -> Any:
        if isinstance(request.messages[-1], ToolResultMessage):
            return faux_assistant("ok")
        return faux_assistant([faux_tool_call("wait_here", {}, id="w1")])

    lazy = define_task("test.lazy-observed", phases={"start": lambda _t, _r: asyncio.sleep(0)})
    harness, _ = await open_harness(
        tools=[wait_here], responder=respond, extensions=[Extension("lazy", tasks=[lazy])]
    )
    root = await harness.root(agent=FAUX)
    await root.submit(Input("first"))

    async def act() -> None:
        await root.submit(Input("second, while busy"))  # queued as a follow-up
        await harness.commit(
            lambda tx: harness.create_task_in(tx, "test.lazy-observed", conversation_id=root.id)
        )

    events = await collect_events(
        harness,
        root.id,
        act,
        lambda es: (
            any(e["type"] == "inbox_update" and e["items"] for e in es)
            and any(e["type"] == "task_failed" for e in es)
        ),
    )
    inbox = next(e for e in events if e["type"] == "inbox_update" and e["items"])
    assert [item["mode"] for item in inbox["items"]] == ["followUp"]
    failed = next(e for e in events if e["type"] == "task_failed")
    assert failed["kind"] == "test.lazy-observed" and "progress" in (failed["message"] or "")
    release.set()
    await harness.wait_for_idle()
    await harness.close()
