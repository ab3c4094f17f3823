"""Submissions and the inbox (DESIGN.md §2.5)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harness_core import (
    CORE_RESET,
    CORE_USER,
    ConversationBusy,
    EntryDraft,
    HarnessClosed,
    HarnessSettings,
    InboxDoc,
    Input,
    LiveDoc,
    RequestIdConflict,
    Write,
)
from harness_core.messages import AssistantMessage, UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import faux_assistant, faux_text
from harness_core.storage import SqliteStorage

from .helpers import FAUX, open_harness


def echo(request: ModelRequest) -> AssistantMessage:
    last = [m for m in request.messages if isinstance(m, UserMessage)][-1]
    return faux_assistant([faux_text(f"echo {user_text(last)}")])


async def test_idle_input_is_placed_and_starts_a_run_in_the_same_commit() -> None:
    harness, _ = await open_harness(responder=echo)
    root = await harness.root(agent=FAUX)
    submission = await root.submit(Input("hello", request_id="r1"))
    assert submission.record.status == "placed"
    live = await harness.snapshot(LiveDoc, root.id)
    assert live["run"]["inputs"] == [submission.id]
    task = await harness.get_task(live["run"]["task_id"])
    assert task is not None and task.kind == "core.generation" and task.seq == submission.record.seq
    settled = await submission.wait()
    assert settled.status == "done"
    answer = await harness.session.storage.entry(settled.answer or 0)
    assert answer is not None and answer.model is not None and answer.model[0].text() == "echo hello"
    await harness.close()


async def test_request_id_is_exactly_once_and_conflicts_are_refused() -> None:
    harness, faux = await open_harness(responder=echo)
    root = await harness.root(agent=FAUX)
    first = await root.submit(Input("hello", request_id="slack:T:C:1"))
    again = await root.submit(Input("hello", request_id="slack:T:C:1"))
    assert again.id == first.id
    await first.wait()
    with pytest.raises(RequestIdConflict):
        await root.submit(Input("different text", request_id="slack:T:C:1"))
    with pytest.raises(RequestIdConflict):
        await root.submit(Write(EntryDraft(kind="test.x"), request_id="slack:T:C:1"))
    page = await root.entries(limit=50)
    assert [e for e in page.items if e.kind == CORE_USER].__len__() == 1
    assert len(faux.requests) == 1
    await harness.close()


async def test_request_id_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite"
    harness, _ = await open_harness(storage=await SqliteStorage.open(path), responder=echo)
    root = await harness.root(agent=FAUX)
    first = await root.submit(Input("hello", request_id="r1"))
    await first.wait()
    await harness.close()
    harness, faux = await open_harness(storage=await SqliteStorage.open(path), responder=echo)
    root = await harness.root()
    again = await root.submit(Input("hello", request_id="r1"))
    assert again.id == first.id
    restored = await harness.submission(first.id)
    assert restored is not None and (await restored.wait()).status == "done"
    assert faux.requests == []
    await harness.close()


async def test_busy_conversation_queues_follow_ups_in_order_and_rejects_reject() -> None:
    gate = asyncio.Event()
    requests: list[str] = []

    async def slow_gate() -> None:
        await gate.wait()

    def respond(request: ModelRequest) -> AssistantMessage:
        last = [m for m in request.messages if isinstance(m, UserMessage)][-1]
        requests.append(user_text(last))
        return faux_assistant([faux_text(f"answer to {user_text(last)}")])

    harness, faux = await open_harness(responder=respond)
    faux.delay_ms = 5
    root = await harness.root(agent=FAUX)

    # Hold the first run busy by pausing the scheduler until everything is queued.
    first = await root.submit(Input("one"))
    second = await root.submit(Input("two"))
    third = await root.submit(Input("three"))
    assert second.record.status == "queued" and third.record.status == "queued"
    with pytest.raises(ConversationBusy):
        await root.submit(Input("nope", when_busy="reject"))
    inbox = await harness.snapshot(InboxDoc, root.id)
    assert [item["id"] for item in inbox["items"]] == [second.id, third.id]
    results = [await s.wait() for s in (first, second, third)]
    assert [r.status for r in results] == ["done", "done", "done"]
    assert requests == ["one", "two", "three"]
    del slow_gate
    await harness.close()


async def test_follow_up_mode_all_places_every_queued_follow_up_at_once() -> None:
    seen: list[list[str]] = []

    def respond(request: ModelRequest) -> AssistantMessage:
        seen.append([user_text(m) for m in request.messages if isinstance(m, UserMessage)])
        return faux_assistant([faux_text("ok")])

    harness, _ = await open_harness(responder=respond, settings=HarnessSettings(follow_up_mode="all"))
    root = await harness.root(agent=FAUX)
    first = await root.submit(Input("one"))
    rest = [await root.submit(Input(t)) for t in ("two", "three")]
    for s in (first, *rest):
        await s.wait()
    assert len(seen) == 2 and seen[1][-2:] == ["two", "three"]
    await harness.close()


async def test_write_while_busy_is_placed_at_the_next_boundary_and_starts_no_model_call() -> None:
    harness, faux = await open_harness(responder=echo)
    root = await harness.root(agent=FAUX)
    run = await root.submit(Input("one"))
    write = await root.submit(Write(EntryDraft(kind="test.note", data={"n": 1})))
    assert write.record.status == "queued"
    await run.wait()
    placed = await write.wait()
    assert placed.status == "done" and placed.entry is not None
    await harness.wait_for_idle(root.id)
    assert len(faux.requests) == 1
    await harness.close()


async def test_withdrawal_of_a_queued_input() -> None:
    harness, _ = await open_harness(responder=echo)
    root = await harness.root(agent=FAUX)
    run = await root.submit(Input("one"))
    queued = await root.submit(Input("two"))
    assert await queued.abort() == "aborted"
    withdrawn = await queued.wait()
    assert withdrawn.status == "unanswered" and withdrawn.reason == "aborted"
    assert await run.abort() == "already_placed"
    await run.wait()
    assert await run.abort() == "settled"
    await harness.close()


async def test_no_model_leaves_input_unanswered() -> None:
    harness, _ = await open_harness(responder=echo)
    root = await harness.root()  # no model configured
    submission = await root.submit(Input("hello"))
    settled = await submission.wait()
    assert settled.status == "unanswered" and settled.reason == "no_model"
    assert "run" not in (await harness.snapshot(LiveDoc, root.id))
    await harness.close()


async def test_reset_starts_a_fresh_context() -> None:
    contexts: list[list[str]] = []

    def respond(request: ModelRequest) -> AssistantMessage:
        contexts.append([user_text(m) for m in request.messages if isinstance(m, UserMessage)])
        return faux_assistant([faux_text("ok")])

    harness, _ = await open_harness(responder=respond)
    root = await harness.root(agent=FAUX)
    await (await root.submit(Input("before"))).wait()
    reset = await root.reset("handoff notes")
    assert (await reset.wait()).status == "done"
    await (await root.submit(Input("after"))).wait()
    assert contexts[-1] == ["handoff notes", "after"]
    page = await root.entries(limit=20)
    assert any(e.kind == CORE_RESET for e in page.items)
    await harness.close()


async def test_stale_head_write_is_unanswered() -> None:
    harness, _ = await open_harness(responder=echo)
    root = await harness.root(agent=FAUX)
    first = await root.submit(Input("a"))
    await first.wait()
    await (await root.reset()).wait()
    stale = await root.submit(Write(EntryDraft(kind="core.compaction", head=first.record.entry)))
    settled = await stale.wait()
    assert settled.status == "unanswered" and settled.reason == "stale"
    await harness.close()


async def test_a_wait_on_an_open_submission_resolves_from_the_commit_that_settles_it(tmp_path: Path) -> None:
    # An unsettled submission this process wrote is waited on without reading storage; the waiter gets the
    # settled record as stored. Settled ones (and any after a reopen) are read from storage.
    path = tmp_path / "waits.sqlite"
    harness, _ = await open_harness(storage=await SqliteStorage.open(path), responder=echo)
    root = await harness.root(agent=FAUX)
    storage = harness.session.storage
    reads: list[int] = []
    read = storage.submission

    async def counting(submission_id: int) -> object:
        reads.append(submission_id)
        return await read(submission_id)

    storage.submission = counting  # type: ignore[method-assign, assignment]
    first = await root.submit(Input("one", request_id="w1"))
    second = await root.submit(Input("two", request_id="w2"))  # queued behind the first run
    assert second.record.status == "queued"
    settled = await asyncio.gather(first.wait(), second.wait())
    assert reads == []
    storage.submission = read  # type: ignore[method-assign]
    for record in settled:
        assert record.status == "done" and record == await storage.submission(record.id)
    again = await first.wait()
    assert again == settled[0]
    await harness.close()

    reopened, _ = await open_harness(storage=await SqliteStorage.open(path), responder=echo)
    handle = await reopened.submission(second.id)
    assert handle is not None and await handle.wait() == settled[1]
    await reopened.close()


async def test_waits_pending_when_a_storage_failure_closes_the_harness_raise_instead_of_hanging() -> None:
    # An uncertain storage failure closes the harness (reason "failed") without close(): nothing will settle
    # the submission or end the task in this process, so their waits must raise, as they do on close().
    from .test_commit_line import FlakyStorage

    storage = FlakyStorage()
    harness, _ = await open_harness(storage=storage, responder=lambda _r: faux_assistant("ok"))
    root = await harness.root(agent=FAUX)
    submitted = await root.submit(Input("q"))
    run = (await harness.snapshot(LiveDoc, root.id))["run"]["task_id"]
    storage.fail_next = True  # the run's first commit fails after the waits are registered
    waits = [
        asyncio.ensure_future(submitted.wait()),
        asyncio.ensure_future(harness.wait_for_task(run)),
        asyncio.ensure_future(root.wait_for_idle()),
    ]
    info = await harness.closed
    assert info.reason == "failed"
    for _ in range(20):  # let the waiters' tasks run
        await asyncio.sleep(0)
    assert all(wait.done() for wait in waits)
    for wait in waits:
        with pytest.raises(HarnessClosed) as raised:
            await wait
        assert raised.value.reason == "failed"
    with pytest.raises(HarnessClosed):
        await submitted.wait()
    await harness.close()


async def test_a_task_wait_registered_after_the_harness_failed_during_its_read_raises() -> None:
    # wait_for_task reads the task before registering its waiter; a failure that closes the harness during
    # that read must still reach the waiter registered after it.
    from contextlib import suppress

    from .test_commit_line import FlakyStorage

    storage = FlakyStorage()
    harness, _ = await open_harness(storage=storage, responder=lambda _r: faux_assistant("ok"))
    root = await harness.root(agent=FAUX)
    await root.submit(Input("q"))
    run = (await harness.snapshot(LiveDoc, root.id))["run"]["task_id"]
    read = harness.get_task

    async def read_then_fail(task_id: int) -> object:
        found = await read(task_id)
        if not harness.closed.done():
            storage.fail_next = True
            with suppress(HarnessClosed):
                await harness.commit(lambda _tx: None)
        return found

    harness.get_task = read_then_fail  # type: ignore[method-assign, assignment]
    waiting = asyncio.ensure_future(harness.wait_for_task(run))
    assert (await harness.closed).reason == "failed"
    for _ in range(20):
        await asyncio.sleep(0)
    assert waiting.done()
    with pytest.raises(HarnessClosed):
        await waiting
    await harness.close()


async def test_cancelled_waits_do_not_pile_up_while_the_submission_stays_open() -> None:
    # A client that waits with a timeout, again and again, on a submission queued behind a long run (or a
    # task that waits for a human) must not leave one dead waiter behind per attempt.
    from harness_core import tool
    from harness_core.messages import ToolResultMessage
    from harness_core.models.faux import faux_tool_call

    gate = asyncio.Event()

    @tool
    async def hold() -> str:
        """Holds the run."""
        await gate.wait()
        return "released"

    def respond(request: ModelRequest) -> AssistantMessage:
        if isinstance(request.messages[-1], ToolResultMessage):
            return faux_assistant([faux_text("done")])
        return faux_assistant([faux_tool_call("hold", {}, id="h")], stop_reason="toolUse")

    harness, _ = await open_harness(responder=respond, tools=[hold])
    root = await harness.root(agent=FAUX)
    first = await root.submit(Input("go"))
    later = await root.submit(Input("later"))
    assert later.record.status == "queued"
    run = (await harness.snapshot(LiveDoc, root.id))["run"]["task_id"]
    for _ in range(50):
        for waiting in (
            asyncio.ensure_future(later.wait()),
            asyncio.ensure_future(harness.wait_for_task(run)),
            asyncio.ensure_future(root.wait_for_idle()),
        ):
            await asyncio.sleep(0)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
    waiters = [*harness._submission_waiters.values(), *harness._task_waiters.values()]
    assert sum(len(found) for found in waiters) + len(harness._idle_waiters) == 0
    gate.set()
    assert (await first.wait()).status == "done" and (await later.wait()).status == "done"
    await harness.close()
