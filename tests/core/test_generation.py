"""The generation task: retries, overflow, steering, hooks, partials, system prompt, compaction, usage."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from harness_core import (
    CORE_ASSISTANT,
    CORE_COMPACTION,
    CORE_SYSTEM,
    AgentChange,
    CompactionSettings,
    Extension,
    HarnessSettings,
    Input,
    LiveDoc,
    ModelRef,
    RetrySettings,
    TaskRuntime,
    UsageDoc,
    hook,
    section,
    tool,
)
from harness_core.messages import AssistantMessage, SystemMessage, ToolResultMessage, UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import faux_assistant, faux_error, faux_tool_call

from .helpers import FAUX, eventually, open_harness

FAST_RETRY = HarnessSettings(retry=RetrySettings(base_delay_ms=1, max_delay_ms=20))


def users(request: ModelRequest) -> list[str]:
    return [user_text(m) for m in request.messages if isinstance(m, UserMessage)]


async def assistant_entries(root: Any) -> list[AssistantMessage]:
    page = await root.entries(limit=200, order="asc")
    return [
        m
        for e in page.items
        if e.kind == CORE_ASSISTANT
        for m in e.model or ()
        if isinstance(m, AssistantMessage)
    ]


async def test_retryable_error_is_retried_durably_then_succeeds() -> None:
    harness, faux = await open_harness(
        responses=[
            faux_error("overloaded", retryable=True),
            faux_error("503", retryable=True, retry_after_ms=5),
        ],
        responder=lambda _r: faux_assistant("finally"),
        settings=FAST_RETRY,
    )
    root = await harness.root(agent=FAUX)
    settled = await (await root.submit(Input("hi"))).wait()
    assert settled.status == "done"
    stored = await assistant_entries(root)
    assert [m.stop_reason for m in stored] == ["error", "error", "stop"]
    # Error attempts are kept but never sent back to the model.
    assert all(not any(isinstance(m, AssistantMessage) for m in r.messages) for r in faux.requests)
    await harness.close()


def test_retry_backoff_doubles_from_the_base_and_is_capped() -> None:
    policy = RetrySettings(base_delay_ms=2_000, max_delay_ms=60_000)
    assert [policy.delay_ms(n, None) for n in range(1, 8)] == [
        2_000,
        4_000,
        8_000,
        16_000,
        32_000,
        60_000,
        60_000,
    ]
    assert policy.delay_ms(1, 7_500) == 7_500  # the provider's retry-after wins over the backoff
    assert policy.delay_ms(2, 600_000) == 60_000  # but never past the cap


async def test_each_durable_retry_is_scheduled_by_the_backoff() -> None:
    clock = 1_000_000  # a frozen harness clock: each retry's `at` is exactly now + its delay
    harness, _ = await open_harness(
        responses=[faux_error("overloaded", retryable=True)] * 3,
        responder=lambda _r: faux_assistant("finally"),
        settings=HarnessSettings(retry=RetrySettings(base_delay_ms=4, max_delay_ms=10)),
        now=lambda: clock,
    )
    root = await harness.root(agent=FAUX)
    scheduled: list[int] = []

    def capture(publication: Any) -> None:
        for doc in publication.docs:
            retry = (
                ((doc.value or {}).get("generation") or {}).get("retry")
                if doc.record.kind == "core.live"
                else None
            )
            if retry and (not scheduled or scheduled[-1] != retry["at"]):
                scheduled.append(retry["at"])

    harness.add_publication_listener(capture)
    settled = await (await root.submit(Input("hi"))).wait()
    assert settled.status == "done"
    assert [at - clock for at in scheduled] == [4, 8, 10]  # doubling, then the cap
    await harness.close()


async def test_retries_are_exhausted_then_model_error() -> None:
    harness, faux = await open_harness(
        responder=lambda _r: faux_error("still 503", retryable=True), settings=FAST_RETRY
    )
    root = await harness.root(agent=FAUX)
    settled = await (await root.submit(Input("hi"))).wait()
    assert (
        settled.status == "unanswered" and settled.reason == "model_error" and settled.detail == "still 503"
    )
    assert len(faux.requests) == 4  # the first attempt and three retries
    await harness.close()


async def test_non_retryable_error_fails_after_one_attempt() -> None:
    harness, faux = await open_harness(
        responder=lambda _r: faux_error("invalid api key"), settings=FAST_RETRY
    )
    root = await harness.root(agent=FAUX)
    settled = await (await root.submit(Input("hi"))).wait()
    assert (settled.status, settled.reason) == ("unanswered", "model_error")
    assert len(faux.requests) == 1
    await harness.close()


def long_conversation_responder(summary_calls: list[int]) -> Any:
    def respond(request: ModelRequest) -> AssistantMessage:
        if request.system_prompt.startswith("You write checkpoint summaries"):
            summary_calls.append(1)
            return faux_assistant("SUMMARY of the early talk")
        return faux_assistant("x" * 400)

    return respond


async def test_overflow_compacts_and_retries_once() -> None:
    summary_calls: list[int] = []
    normal = long_conversation_responder(summary_calls)
    overflowed = False

    def respond(request: ModelRequest) -> AssistantMessage:
        nonlocal overflowed
        if users(request)[-1:] == ["trigger"] and not overflowed:
            overflowed = True
            return faux_error("prompt is too long", overflow=True)
        return normal(request)

    settings = HarnessSettings(
        compaction=CompactionSettings(reserve_tokens=100, keep_recent_tokens=150, background_tokens=0),
        retry=RetrySettings(max_retries=0),
    )
    harness, faux = await open_harness(responder=respond, settings=settings)
    root = await harness.root(agent=FAUX)
    for i in range(4):
        await (await root.submit(Input(f"message {i} " + "y" * 200))).wait()
    settled = await (await root.submit(Input("trigger"))).wait()
    assert settled.status == "done"  # the overflow retry does not spend the (zero) retry budget
    assert summary_calls == [1]
    page = await root.entries(limit=100)
    assert any(e.kind == CORE_COMPACTION for e in page.items)
    assert users(faux.requests[-1])[0].startswith("The conversation history before this point was compacted")
    await harness.close()


async def test_second_overflow_fails_the_run() -> None:
    summary_calls: list[int] = []
    normal = long_conversation_responder(summary_calls)

    def respond(request: ModelRequest) -> AssistantMessage:
        if users(request)[-1:] == ["trigger"]:
            return faux_error("context length exceeded", overflow=True)
        return normal(request)

    settings = HarnessSettings(
        compaction=CompactionSettings(reserve_tokens=100, keep_recent_tokens=150, background_tokens=0)
    )
    harness, _ = await open_harness(responder=respond, settings=settings)
    root = await harness.root(agent=FAUX)
    for i in range(4):
        await (await root.submit(Input(f"message {i} " + "y" * 200))).wait()
    settled = await (await root.submit(Input("trigger"))).wait()
    assert (settled.status, settled.reason) == ("unanswered", "model_error")
    await harness.close()


async def test_blocking_compaction_above_threshold_before_the_request() -> None:
    summary_calls: list[int] = []
    harness, faux = await open_harness(
        responder=long_conversation_responder(summary_calls),
        settings=HarnessSettings(
            compaction=CompactionSettings(reserve_tokens=300, keep_recent_tokens=200, background_tokens=0)
        ),
    )
    faux.context_window = 900
    root = await harness.root(agent=FAUX)
    for i in range(6):
        assert (await (await root.submit(Input(f"turn {i} " + "z" * 300))).wait()).status == "done"
    assert summary_calls
    view = await root.context()
    assert view.head is not None and view.head.kind == CORE_COMPACTION
    await harness.close()


async def test_manual_compaction_places_summary_as_a_write() -> None:
    summary_calls: list[int] = []
    harness, _ = await open_harness(
        responder=long_conversation_responder(summary_calls),
        settings=HarnessSettings(compaction=CompactionSettings(keep_recent_tokens=120)),
    )
    root = await harness.root(agent=FAUX)
    for i in range(3):
        await (await root.submit(Input(f"turn {i} " + "z" * 300))).wait()
    task_id = await root.compact("focus on decisions")
    task = await harness.wait_for_task(task_id)
    assert task.state.outcome is not None and task.state.outcome.status == "completed"
    submission_id = task.state.outcome.result["submission_id"]
    placed = await (await harness.submission(submission_id)).wait()  # type: ignore[union-attr]
    assert placed.status == "done"
    assert placed.request_id == f"compaction:{task_id}"
    assert summary_calls == [1]
    await harness.close()


async def test_steer_joins_the_run_after_the_tool_round() -> None:
    gate = asyncio.Event()

    @tool
    async def wait_here() -> str:
        """Blocks until released."""
        await asyncio.wait_for(gate.wait(), 5)
        return "released"

    def respond(request: ModelRequest) -> AssistantMessage:
        if not any(isinstance(m, ToolResultMessage) for m in request.messages):
            return faux_assistant([faux_tool_call("wait_here", {}, id="w")])
        return faux_assistant("answer after " + ",".join(users(request)))

    harness, faux = await open_harness(tools=[wait_here], responder=respond)
    root = await harness.root(agent=FAUX)
    run = await root.submit(Input("go"))
    await eventually(lambda: _tools_running(harness, root.id))
    steer = await root.submit(Input("also check staging", when_busy="steer"))
    gate.set()
    first, second = await run.wait(), await steer.wait()
    assert first.status == second.status == "done"
    assert first.answer == second.answer  # the steer settled with the same answer
    # The steer's message comes after the tool result, in the same run.
    assert users(faux.requests[-1]) == ["go", "also check staging"]
    await harness.close()


async def test_on_yield_continuation_keeps_the_run_open() -> None:
    continued = False

    def on_yield(message: AssistantMessage, runtime: TaskRuntime) -> Any:
        nonlocal continued
        if not continued:
            continued = True
            return {"continue": "and now double check"}
        return None

    harness, faux = await open_harness(
        extensions=[Extension("yield", hooks=[hook("core.generation", on_yield=on_yield)])],
        responder=lambda r: faux_assistant(f"reply to {users(r)[-1]}"),
    )
    root = await harness.root(agent=FAUX)
    settled = await (await root.submit(Input("start"))).wait()
    answer = await harness.session.storage.entry(settled.answer or 0)
    assert (
        answer is not None
        and answer.model is not None
        and answer.model[0].text() == "reply to and now double check"
    )
    assert len(faux.requests) == 2
    await harness.close()


async def test_before_request_replaces_messages_for_one_request_only() -> None:
    def drop_secret(request: dict[str, Any], runtime: TaskRuntime) -> dict[str, Any]:
        return {
            "messages": [
                m
                for m in request["messages"]
                if not (isinstance(m, UserMessage) and "secret" in user_text(m))
            ]
        }

    harness, faux = await open_harness(
        extensions=[Extension("redact", hooks=[hook("core.generation", before_request=drop_secret)])],
        responder=lambda r: faux_assistant("ok"),
    )
    root = await harness.root(agent=FAUX)
    await (await root.submit(Input("secret: hunter2"))).wait()
    await (await root.submit(Input("public"))).wait()
    assert users(faux.requests[-1]) == ["public"]
    page = await root.entries(limit=50)
    assert any(
        e.model and isinstance(e.model[0], UserMessage) and "hunter2" in user_text(e.model[0])
        for e in page.items
    )
    await harness.close()


async def test_partials_are_committed_while_streaming_at_most_every_interval() -> None:
    harness, faux = await open_harness(
        responder=lambda _r: faux_assistant("a fairly long streamed answer " * 4)
    )
    faux.chunk_size = 4
    faux.delay_ms = 10  # 31 chunks over about 0.3 s: several partial intervals
    root = await harness.root(agent=FAUX)
    partials: list[str] = []
    times: list[float] = []

    def capture(publication: Any) -> None:
        for doc in publication.docs:
            if (
                doc.record.kind == "core.live"
                and doc.value
                and doc.value.get("generation", {}).get("message")
            ):
                content = doc.value["generation"]["message"]["content"]
                text = "".join(p.get("text", "") for p in content)
                if not partials or text != partials[-1]:
                    partials.append(text)
                    times.append(time.monotonic())

    harness.add_publication_listener(capture)
    await (await root.submit(Input("talk"))).wait()
    assert len(partials) >= 2
    assert all(len(a) <= len(b) for a, b in itertools.pairwise(partials))
    # Throttled to the 100 ms partial interval, not one commit per chunk (a small allowance for timer jitter).
    assert min(b - a for a, b in itertools.pairwise(times)) >= 0.09
    assert (await harness.snapshot(LiveDoc, root.id)).get("generation") is None
    await harness.close()


async def test_system_prompt_baseline_then_only_deltas() -> None:
    harness, faux = await open_harness(
        extensions=[Extension("style", sections=[section("style", "Be brief.")])],
        responder=lambda _r: faux_assistant("ok"),
    )
    root = await harness.root(
        agent=AgentChange(model=ModelRef(provider="faux", model_id="m"), instructions="You are ops.")
    )
    await (await root.submit(Input("one"))).wait()
    await (await root.submit(Input("two"))).wait()
    systems = [e for e in (await root.entries(limit=50, order="asc")).items if e.kind == CORE_SYSTEM]
    assert len(systems) == 1  # unchanged prompt: nothing appended for the second request
    assert (
        faux.requests[0].system_prompt
        == "<style>\nBe brief.\n</style>\n\n<instructions>\nYou are ops.\n</instructions>"
    )
    await root.configure(AgentChange(instructions="You are the on-call bot."))
    await (await root.submit(Input("three"))).wait()
    systems = [e for e in (await root.entries(limit=50, order="asc")).items if e.kind == CORE_SYSTEM]
    assert len(systems) == 2
    delta = systems[1].model[0]  # type: ignore[index]
    assert isinstance(delta, SystemMessage) and list(delta.sections) == ["instructions"]
    assert "on-call" in faux.requests[-1].system_prompt
    await harness.close()


async def test_usage_is_recorded_per_model() -> None:
    harness, _ = await open_harness(responder=lambda _r: faux_assistant("ok"))
    root = await harness.root(agent=FAUX)
    await (await root.submit(Input("one"))).wait()
    await (await root.submit(Input("two"))).wait()
    usage = await harness.snapshot(UsageDoc, root.id)
    assert usage["models"]["faux/faux-1"]["output"] > 0
    totals = await harness.usage()
    assert totals["total"].output == usage["models"]["faux/faux-1"]["output"]
    fork = await root.fork((await root.entries(limit=1)).items[0].id)
    assert (await harness.snapshot(UsageDoc, fork.id)) == {"models": {}, "tools": {}}
    await harness.close()


async def test_conversation_abort_withdraws_and_aborts_the_run() -> None:
    gate = asyncio.Event()

    @tool
    async def hang() -> str:
        """Never returns until released."""
        await gate.wait()
        return "late"

    harness, _ = await open_harness(
        tools=[hang], responder=lambda r: faux_assistant([faux_tool_call("hang", {}, id="h")])
    )
    root = await harness.root(agent=FAUX)
    running = await root.submit(Input("go"))
    queued = await root.submit(Input("later"))
    await eventually(lambda: _tools_running(harness, root.id))
    await asyncio.wait_for(root.abort(), 5)
    assert (await running.wait()).reason == "aborted"
    assert (await queued.wait()).reason == "aborted"
    live = await harness.snapshot(LiveDoc, root.id)
    assert "run" not in live
    page = await root.entries(limit=20)
    results = [m for e in page.items for m in e.model or () if isinstance(m, ToolResultMessage)]
    assert results and results[0].is_error and "aborted" in results[0].text()
    await harness.close()


async def _tools_running(harness: Any, conversation_id: int) -> bool:
    return bool((await harness.snapshot(LiveDoc, conversation_id) or {}).get("tools"))


async def test_background_compaction_runs_beside_the_run_and_places_its_summary() -> None:
    summary_calls: list[int] = []
    harness, faux = await open_harness(
        responder=long_conversation_responder(summary_calls),
        settings=HarnessSettings(
            compaction=CompactionSettings(reserve_tokens=100, keep_recent_tokens=150, background_tokens=600)
        ),
    )
    faux.context_window = 1_200
    root = await harness.root(agent=FAUX)
    started: list[dict[str, Any]] = []

    def watch_compactions(publication: Any) -> None:
        for doc in publication.docs:
            if doc.record.kind == "core.live" and doc.value:
                started.extend(c for c in doc.value.get("compactions", []) if c not in started)

    harness.add_publication_listener(watch_compactions)
    for i in range(5):
        assert (await (await root.submit(Input(f"turn {i} " + "z" * 300))).wait()).status == "done"
    await harness.wait_for_idle()
    assert started and all(c["blocking"] is False and c["reason"] == "threshold" for c in started)
    assert summary_calls
    page = await root.entries(limit=100)
    assert any(e.kind == CORE_COMPACTION for e in page.items)
    await harness.close()


async def test_before_compact_can_decline_or_provide_the_summary() -> None:
    decisions: list[Any] = [{"decline": True}, {"summary": "hand-written summary"}]

    def before_compact(request: dict[str, Any], runtime: TaskRuntime) -> Any:
        return decisions.pop(0)

    summary_calls: list[int] = []
    harness, _ = await open_harness(
        extensions=[
            Extension("compact-hook", hooks=[hook("core.compaction", before_compact=before_compact)])
        ],
        responder=long_conversation_responder(summary_calls),
        settings=HarnessSettings(compaction=CompactionSettings(keep_recent_tokens=120)),
    )
    root = await harness.root(agent=FAUX)
    for i in range(3):
        await (await root.submit(Input(f"turn {i} " + "z" * 300))).wait()
    declined = await harness.wait_for_task(await root.compact())
    assert declined.state.outcome is not None and declined.state.outcome.result == {}
    provided = await harness.wait_for_task(await root.compact())
    assert provided.state.outcome is not None and "submission_id" in provided.state.outcome.result
    assert summary_calls == []  # neither asked the model
    view = await root.context()
    assert view.head is not None and "hand-written summary" in user_text(view.head.model[0])  # type: ignore[index, arg-type]
    await harness.close()


async def test_generation_and_tool_observer_hooks() -> None:
    seen: dict[str, list[Any]] = {"after_response": [], "after_tools": [], "on_abort": []}
    gate = asyncio.Event()

    @tool
    async def quick() -> str:
        """Quick."""
        return "q"

    @tool
    async def stuck() -> str:
        """Never finishes until aborted."""
        await gate.wait()
        return "late"

    def after_response(message: AssistantMessage, runtime: TaskRuntime) -> None:
        seen["after_response"].append(message.stop_reason)

    def after_tools(assistant_id: int, result_ids: list[int], runtime: TaskRuntime) -> None:
        seen["after_tools"].append((assistant_id, result_ids))

    def on_abort(call: Any, result: Any, api: Any) -> Any:
        seen["on_abort"].append(call.name)
        from harness_core import ToolResult

        return ToolResult(content="aborted by the operator", is_error=True)

    calls = [faux_tool_call("quick", {}, id="q1")]

    def respond(request: ModelRequest) -> AssistantMessage:
        if users(request)[-1] == "hang":
            return faux_assistant([faux_tool_call("stuck", {}, id="s1")])
        if isinstance(request.messages[-1], ToolResultMessage):
            return faux_assistant("done")
        return faux_assistant(list(calls))

    harness, _ = await open_harness(
        extensions=[
            Extension(
                "observers",
                tools=[quick, stuck],
                hooks=[
                    hook("core.generation", after_response=after_response, after_tools=after_tools),
                    hook("core.tool", on_abort=on_abort),
                ],
            )
        ],
        responder=respond,
    )
    root = await harness.root(agent=FAUX)
    await (await root.submit(Input("go"))).wait()
    assert seen["after_response"] == ["toolUse", "stop"]
    [(assistant_id, result_ids)] = seen["after_tools"]
    assert len(result_ids) == 1 and result_ids[0] > assistant_id
    hanging = await root.submit(Input("hang"))
    await eventually(lambda: _tools_running(harness, root.id))
    await root.abort()
    assert (await hanging.wait()).reason == "aborted"
    assert seen["on_abort"] == ["stuck"]
    page = await root.entries(limit=5)
    results = [m for e in page.items for m in e.model or () if isinstance(m, ToolResultMessage)]
    assert "aborted by the operator" in results[0].text()
    await harness.close()
