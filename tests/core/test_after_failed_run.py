"""What is queued behind a run that ends without an answer: `HarnessSettings.after_failed_run`.

"continue" (the default) places it at once, in the commit that ends the failed run; "hold" keeps it queued until
the next submission (pi-durable's rule)."""

from __future__ import annotations

import asyncio
from typing import Any

from harness_core import (
    CORE_USER,
    EntryDraft,
    HarnessSettings,
    InboxDoc,
    Input,
    LiveDoc,
    StorageCorrupt,
    Write,
)
from harness_core.messages import AssistantMessage, UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import faux_assistant, faux_error, faux_text

from .helpers import FAUX, open_harness


def fails_on(word: str) -> tuple[list[str], object]:
    asked: list[str] = []

    def respond(request: ModelRequest) -> AssistantMessage:
        last = user_text([m for m in request.messages if isinstance(m, UserMessage)][-1])
        asked.append(last)
        if word in last:
            return faux_error(f"the provider refused {last!r}")
        return faux_assistant([faux_text(f"answer to {last}")])

    return asked, respond


async def test_a_follow_up_queued_behind_a_model_error_starts_in_the_commit_that_ends_the_failed_run() -> (
    None
):
    asked, respond = fails_on("one")
    harness, faux = await open_harness(responder=respond)  # type: ignore[arg-type]
    faux.delay_ms = 5
    root = await harness.root(agent=FAUX)
    first = await root.submit(Input("one"))
    note = await root.submit(Write(EntryDraft(kind="test.note", data={"n": 1})))
    second = await root.submit(Input("two"))
    assert (note.record.status, second.record.status) == ("queued", "queued")
    failed = await first.wait()
    assert failed.status == "unanswered" and failed.reason == "model_error"
    placed = await second.status()
    # one commit: the failure's settlement, the queued write and follow-up placed, the next run started
    assert placed.status in ("placed", "done") and placed.seq == failed.seq
    assert (await note.status()).seq == failed.seq
    answered = await second.wait()
    assert answered.status == "done"
    assert asked == ["one", "two"]
    assert (await harness.snapshot(InboxDoc, root.id))["items"] == []
    await harness.close()


async def test_with_hold_the_follow_up_waits_for_the_next_submission() -> None:
    asked, respond = fails_on("one")
    harness, faux = await open_harness(
        responder=respond,  # type: ignore[arg-type]
        settings=HarnessSettings(after_failed_run="hold"),
    )
    faux.delay_ms = 5
    root = await harness.root(agent=FAUX)
    first = await root.submit(Input("one"))
    second = await root.submit(Input("two"))
    assert (await first.wait()).status == "unanswered"
    await harness.wait_for_idle(root.id)
    await asyncio.sleep(0.05)
    assert (await second.status()).status == "queued" and asked == ["one"]
    third = await root.submit(Input("three"))
    assert [(await s.wait()).status for s in (second, third)] == ["done", "done"]
    assert asked == ["one", "two", "three"]
    await harness.close()


async def test_without_a_model_every_queued_input_is_told_so_instead_of_waiting() -> None:
    harness, _ = await open_harness()
    root = await harness.root()  # no model configured: every run fails at once
    submissions = [await root.submit(Input(text)) for text in ("one", "two", "three")]
    settled = [await s.wait() for s in submissions]
    assert [(s.status, s.reason) for s in settled] == [("unanswered", "no_model")] * 3
    assert "run" not in (await harness.snapshot(LiveDoc, root.id))
    users = [e for e in await _entries(harness, root.id) if e.kind == CORE_USER]
    assert len(users) == 3  # each was placed (in order) before its run failed
    await harness.close()


async def test_a_follow_up_queued_behind_a_faulted_generation_is_answered() -> None:
    asked, respond = fails_on("never")
    harness, faux = await open_harness(responder=respond)  # type: ignore[arg-type]
    faux.delay_ms = 5
    storage: Any = harness.session.storage
    scan = storage.scan_entries
    broken = [True]

    async def scan_once_broken(*args: Any, **kwargs: Any) -> Any:
        if broken:  # the first run's context read fails: its generation task faults (an internal failure)
            broken.clear()
            raise StorageCorrupt("an unreadable entries row")
        return await scan(*args, **kwargs)

    storage.scan_entries = scan_once_broken
    root = await harness.root(agent=FAUX)
    first = await root.submit(Input("one"))
    second = await root.submit(Input("two"))
    failed = await first.wait()
    assert failed.status == "unanswered" and failed.reason == "faulted", failed
    assert (await second.wait()).status == "done"
    assert asked == ["two"]
    await harness.close()


async def test_a_follow_up_queued_behind_a_cancelled_answer_is_answered_and_a_conversation_abort_withdraws_it() -> (
    None
):
    asked: list[str] = []
    stuck = asyncio.Event()

    def respond(request: ModelRequest) -> AssistantMessage:
        last = user_text([m for m in request.messages if isinstance(m, UserMessage)][-1])
        asked.append(last)
        if last == "one":  # a stuck answer: streams for minutes, cancelled by an operator
            stuck.set()
            return faux_assistant([faux_text("slow " * 5000)])
        return faux_assistant([faux_text(f"answer to {last}")])

    harness, faux = await open_harness(responder=respond)
    faux.chunk_size, faux.delay_ms = 1, 20
    root = await harness.root(agent=FAUX)
    first = await root.submit(Input("one"))
    second = await root.submit(Input("two"))
    await stuck.wait()
    live = await harness.snapshot(LiveDoc, root.id)
    assert await harness.abort_task(int(live["run"]["task_id"])) == "marked"
    assert ((await first.wait()).status, (await first.status()).reason) == ("unanswered", "aborted")
    assert (await second.wait()).status == "done" and asked == ["one", "two"]

    # A conversation abort (a stop button) withdraws what is queued: nothing runs after it.
    asked.clear()
    stuck.clear()
    third = await root.submit(Input("one"))
    fourth = await root.submit(Input("four"))
    await stuck.wait()
    await root.abort()
    assert [((await s.wait()).status, (await s.status()).reason) for s in (third, fourth)] == [
        ("unanswered", "aborted")
    ] * 2
    assert asked == ["one"]
    await harness.close()


async def test_a_stop_resolves_even_when_a_message_arrives_while_it_stops() -> None:
    asked: list[str] = []
    streaming = asyncio.Event()

    def respond(request: ModelRequest) -> AssistantMessage:
        asked.append(user_text([m for m in request.messages if isinstance(m, UserMessage)][-1]))
        streaming.set()
        return faux_assistant([faux_text("slow " * 5000)])  # every answer streams for minutes

    harness, faux = await open_harness(responder=respond)
    faux.chunk_size, faux.delay_ms = 1, 20
    root = await harness.root(agent=FAUX)
    await root.submit(Input("one"))
    await streaming.wait()
    generation = int((await harness.snapshot(LiveDoc, root.id))["run"]["task_id"])
    late: list[asyncio.Task[Any]] = []

    def speak_when_marked(publication: Any) -> None:  # someone speaks right after the stop withdrew the queue
        if not late and any(t.id == generation and t.abort_requested for t in publication.tasks):
            late.append(asyncio.ensure_future(root.submit(Input("two"))))

    harness.session.subscribe(speak_when_marked)
    await asyncio.wait_for(root.abort(), 10)  # it does not wait for an answer to "two"
    second = await late[0]
    assert (await second.status()).status == "queued" and asked == ["one"]
    await harness.close()


async def _entries(harness, conversation_id):  # type: ignore[no-untyped-def]
    handle = await harness.conversation(conversation_id)
    return list((await handle.entries(limit=100, order="asc")).items)
