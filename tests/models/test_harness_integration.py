"""The HTTP providers driven by the harness (respx; no network): every case goes through `submit()`, the
durable `core.generation` and `core.tool` tasks and storage, and asserts on what the server received."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harness_core import (
    CORE_ASSISTANT,
    CORE_COMPACTION,
    CompactionSettings,
    Input,
    LiveDoc,
    ProviderDoc,
    RetrySettings,
    UsageDoc,
)
from harness_core._compaction import SUMMARY_SYSTEM_PROMPT
from harness_core.storage import SqliteStorage

from .harness_support import (
    Call,
    Dialect,
    Gate,
    GatedStream,
    OpenRig,
    Script,
    fast_settings,
    network_chunks,
    stream_response,
)

pytestmark = pytest.mark.timeout(10)


# -- answers ------------------------------------------------------------------------------------------------


async def test_plain_answer_and_session_id(dialect: Dialect, script: Script, open_rig: OpenRig) -> None:
    rig = await open_rig()
    script.add(stream_response(dialect.text_events("The capital of France ", "is Paris.")))
    submission = await rig.root.submit(Input("What is the capital of France?", request_id="q-1"))
    settled = await submission.wait()
    assert settled.status == "done"
    assert await rig.answer_text(settled.answer) == "The capital of France is Paris."

    (body,) = script.requests
    assert dialect.transcript(body) == [("user", "What is the capital of France?")]
    assert dialect.tool_names(body) == ["forecast"]
    assert body["model"] == dialect.model_id
    session = (await rig.harness.snapshot(ProviderDoc, rig.root.id))["session_id"]
    assert session and dialect.session_id(body) == session

    usage = (await rig.harness.snapshot(UsageDoc, rig.root.id))["models"][
        f"{dialect.name}/{dialect.model_id}"
    ]
    assert usage["input"] == 42 and usage["output"] == 7 and usage["cost"] > 0
    assert rig.reports == []


async def test_a_fork_sends_its_own_session_id(dialect: Dialect, script: Script, open_rig: OpenRig) -> None:
    rig = await open_rig()
    script.add(stream_response(dialect.text_events("Paris.")), stream_response(dialect.text_events("Lyon.")))
    settled = await (await rig.root.submit(Input("Capital of France?"))).wait()
    thread = await rig.root.fork(settled.answer or 0)
    assert (await (await thread.submit(Input("And its second city?"))).wait()).status == "done"
    root_session = (await rig.harness.snapshot(ProviderDoc, rig.root.id))["session_id"]
    thread_session = (await rig.harness.snapshot(ProviderDoc, thread.id))["session_id"]
    assert thread_session and thread_session != root_session
    assert [dialect.session_id(body) for body in script.requests] == [root_session, thread_session]
    assert dialect.transcript(script.requests[1]) == [
        ("user", "Capital of France?"),
        ("assistant", "Paris."),
        ("user", "And its second city?"),
    ]


async def test_streamed_answer_commits_partials_before_it_ends(
    dialect: Dialect, script: Script, open_rig: OpenRig
) -> None:
    rig = await open_rig()
    events = dialect.text_events("Zürich ", "is ", "cold ", "today, ", "bring a coat.")
    gate = Gate()
    # Hold the stream after "Zürich is cold " (network chunks split lines and the UTF-8 'ü').
    cut = dialect.lead + 3
    body = GatedStream([*network_chunks(events[:cut]), gate, *network_chunks(events[cut:])])
    script.add(stream_response(body))
    submission = await rig.root.submit(Input("Weather?"))
    await rig.live.partial("Zürich is cold ")
    assert (await submission.status()).status == "placed"  # the answer is still streaming
    gate.open()
    settled = await submission.wait()
    assert settled.status == "done"
    assert await rig.answer_text(settled.answer) == "Zürich is cold today, bring a coat."
    # Every committed partial extends the previous one, and the live partial is gone once answered.
    assert all(b.startswith(a) for a, b in zip(rig.live.partials, rig.live.partials[1:], strict=False))
    live = await rig.harness.snapshot(LiveDoc, rig.root.id)
    assert "generation" not in live and "run" not in live
    assert body.closed


# -- tools ----------------------------------------------------------------------------------------------------


async def test_two_parallel_tool_calls_with_fragmented_arguments(
    dialect: Dialect, script: Script, open_rig: OpenRig, tmp_path: Path
) -> None:
    rig = await open_rig(storage=await SqliteStorage.open(tmp_path / "tools.sqlite"))
    first = Call(dialect.call_ids[0], "forecast", {"city": "Zürich", "days": 3})
    second = Call(dialect.call_ids[1], "forecast", {"city": 'Oslo "Fornebu"', "days": 10})
    script.add(
        stream_response(dialect.tool_call_events([first, second], fragment=3)),
        stream_response(dialect.text_events("Sunny in Zürich ", "and at Fornebu.")),
    )
    submission = await rig.root.submit(Input("Weather in Zürich and Oslo?", request_id="w-1"))
    settled = await submission.wait()
    assert settled.status == "done"
    assert await rig.answer_text(settled.answer) == "Sunny in Zürich and at Fornebu."

    # Both tools ran once each, with exactly the arguments the model streamed in fragments.
    assert sorted(rig.executed, key=lambda c: c["city"]) == [
        {"city": 'Oslo "Fornebu"', "days": 10},
        {"city": "Zürich", "days": 3},
    ]
    assert len(script.requests) == 2
    sent = dialect.transcript(script.requests[1])
    assert sent[:3] == [
        ("user", "Weather in Zürich and Oslo?"),
        ("call", first.id, "forecast", first.arguments),
        ("call", second.id, "forecast", second.arguments),
    ]
    # Each result is mapped to its own call, after the calls.
    assert sorted(sent[3:]) == sorted(
        [
            ("result", first.id, "Zürich: sunny for 3 days", False),
            ("result", second.id, 'Oslo "Fornebu": sunny for 10 days', False),
        ]
    )
    kinds = [e.kind for e in await rig.all_entries()]
    assert kinds.count("core.tool-result") == 2 and kinds.count(CORE_ASSISTANT) == 2


# -- retries --------------------------------------------------------------------------------------------------


async def test_429_with_retry_after_is_retried_durably(
    dialect: Dialect, script: Script, open_rig: OpenRig
) -> None:
    # A base delay of a minute: the test only finishes in time if the server's retry-after (50 ms) is used.
    # The harness and the server share the event loop's clock, so "resent after the delay" is checkable.
    loop = asyncio.get_running_loop()
    script.clock = lambda: loop.time() * 1000
    rig = await open_rig(
        fast_settings(retry=RetrySettings(base_delay_ms=60_000, max_delay_ms=60_000)),
        now=lambda: int(loop.time() * 1000),
    )
    script.add(dialect.rate_limited(50), stream_response(dialect.text_events("Recovered.")))
    submission = await rig.root.submit(Input("Hello?"))
    settled = await submission.wait()
    assert settled.status == "done"
    assert await rig.answer_text(settled.answer) == "Recovered."

    failed, answered = await rig.assistant_entries()
    assert failed.stop_reason == "error" and failed.error is not None
    assert failed.error.status == 429 and failed.error.retryable and failed.error.retry_after_ms == 50
    assert "rate limit" in failed.error.message.lower()
    assert answered.stop_reason == "stop"
    # The retry was committed (core.live generation.retry) before the request was sent again...
    assert [e[0] for e in script.log] == ["request", "retry", "request"]
    _, at, error = script.log[1]
    assert "429" in error
    assert script.arrivals[1] >= at >= int(script.arrivals[0]) + 50  # resent no earlier than 50 ms later
    # ...and the resent request does not carry the failed attempt.
    assert script.requests[1]["messages"] == script.requests[0]["messages"]


async def test_500_then_success(dialect: Dialect, script: Script, open_rig: OpenRig) -> None:
    rig = await open_rig()
    script.add(dialect.server_error(), stream_response(dialect.text_events("Second time lucky.")))
    settled = await (await rig.root.submit(Input("Hello?"))).wait()
    assert settled.status == "done"
    assert await rig.answer_text(settled.answer) == "Second time lucky."
    failed, _ = await rig.assistant_entries()
    assert failed.error is not None and failed.error.status == 500 and failed.error.retryable
    assert [e[0] for e in script.log] == ["request", "retry", "request"]
    assert script.requests[1]["messages"] == script.requests[0]["messages"]


async def test_retries_are_bounded(dialect: Dialect, script: Script, open_rig: OpenRig) -> None:
    rig = await open_rig(fast_settings(retry=RetrySettings(max_retries=2, base_delay_ms=1)))
    script.add(dialect.server_error(), dialect.server_error(), dialect.server_error())
    settled = await (await rig.root.submit(Input("Hello?"))).wait()
    assert settled.status == "unanswered" and settled.reason == "model_error"
    assert settled.detail is not None and "500" in settled.detail
    assert len(script.requests) == 3


async def test_overflow_compacts_then_retries_outside_the_retry_budget(
    dialect: Dialect, script: Script, open_rig: OpenRig
) -> None:
    # One retry allowed: the request after the compaction fails with a 500 and is still retried, so the
    # overflow retry did not use the budget.
    rig = await open_rig(
        fast_settings(
            retry=RetrySettings(max_retries=1, base_delay_ms=1),
            compaction=CompactionSettings(keep_recent_tokens=1),
        )
    )
    summary = "Goal: geography quiz. Facts: the capital of France is Paris."
    script.add(
        stream_response(dialect.text_events("Paris.")),
        dialect.overflow(),
        stream_response(dialect.text_events(summary)),
        dialect.server_error(),
        stream_response(dialect.text_events("Berlin.")),
    )
    first = await (await rig.root.submit(Input("Capital of France?"))).wait()
    assert first.status == "done"
    settled = await (await rig.root.submit(Input("And of Germany?"))).wait()
    assert settled.status == "done", settled.detail
    assert await rig.answer_text(settled.answer) == "Berlin."

    assert len(script.requests) == 5
    overflowed, summarize, compacted, retried = script.requests[1:]
    assert dialect.transcript(overflowed) == [
        ("user", "Capital of France?"),
        ("assistant", "Paris."),
        ("user", "And of Germany?"),
    ]
    # The harness asked the model for a summary of the older part...
    assert dialect.system_prompt(summarize) == SUMMARY_SYSTEM_PROMPT
    ((role, prompt),) = dialect.transcript(summarize)
    assert role == "user" and "[User]: Capital of France?" in prompt and "[Assistant]: Paris." in prompt
    assert "And of Germany?" not in prompt
    # ...and the retried request starts from it.
    sent = dialect.transcript(compacted)
    assert len(sent) == 2 and summary in sent[0][1] and sent[1] == ("user", "And of Germany?")
    assert retried["messages"] == compacted["messages"]

    entries = await rig.all_entries()
    assert [e.kind for e in entries].count(CORE_COMPACTION) == 1
    errors = [m.error for m in await rig.assistant_entries() if m.stop_reason == "error"]
    assert [(e.overflow, e.status) for e in errors if e is not None] == [(True, 400), (False, 500)]


# -- failures that must not hang ---------------------------------------------------------------------------


async def test_malformed_sse_line_leaves_the_input_unanswered(
    dialect: Dialect, script: Script, open_rig: OpenRig
) -> None:
    rig = await open_rig()
    events = dialect.text_events("Fine so far")
    # A good start, then a line that is not SSE; the server keeps the connection open afterwards.
    body = GatedStream([*events[: dialect.lead + 1], b"<html>502 Bad Gateway</html>\n\n"], hang=True)
    script.add(stream_response(body))
    settled = await (await rig.root.submit(Input("Hello?"))).wait()
    assert settled.status == "unanswered" and settled.reason == "model_error"
    assert (
        settled.detail is not None
        and "malformed SSE line" in settled.detail
        and "502 Bad Gateway" in settled.detail
    )
    assert body.closed
    assert len(script.requests) == 1  # not retried: a broken stream format will not fix itself
    (failed,) = await rig.assistant_entries()
    assert failed.stop_reason == "error" and failed.error is not None and not failed.error.retryable
    assert "run" not in await rig.harness.snapshot(LiveDoc, rig.root.id)


@pytest.mark.parametrize("how", ["abort_task", "conversation_abort"])
async def test_abort_mid_stream_closes_the_response(
    dialect: Dialect, script: Script, open_rig: OpenRig, how: str
) -> None:
    rig = await open_rig()
    events = dialect.text_events("Once upon ", "a time", " there was")
    # The server stops after "Once upon a time" and keeps the connection open.
    body = GatedStream(network_chunks(events[: dialect.lead + 2]), hang=True)
    script.add(stream_response(body), stream_response(dialect.text_events("Sure.")))
    submission = await rig.root.submit(Input("Tell me a story"))
    await rig.live.partial("Once upon a time")
    await body.hanging.wait()
    if how == "abort_task":
        live = await rig.harness.snapshot(LiveDoc, rig.root.id)
        assert await rig.harness.abort_task(int(live["run"]["task_id"])) == "marked"
    else:
        await rig.root.abort()
    settled = await submission.wait()
    assert settled.status == "unanswered" and settled.reason == "aborted"
    assert body.closed

    (aborted,) = await rig.assistant_entries()
    assert aborted.stop_reason == "aborted" and aborted.text() == "Once upon a time"
    # The aborted partial is kept but never sent again.
    settled = await (await rig.root.submit(Input("Something short then"))).wait()
    assert settled.status == "done"
    assert dialect.transcript(script.requests[1]) == [
        ("user", "Tell me a story"),
        ("user", "Something short then"),
    ]


# -- restart ----------------------------------------------------------------------------------------------------


async def test_graceful_close_mid_stream_then_reopen_resends_the_request(
    dialect: Dialect, script: Script, open_rig: OpenRig, tmp_path: Path
) -> None:
    path = tmp_path / "restart.sqlite"
    rig = await open_rig(storage=await SqliteStorage.open(path))
    events = dialect.text_events("Deploying ", "now", "…")
    body = GatedStream(network_chunks(events[: dialect.lead + 2]), hang=True)
    script.add(stream_response(body), stream_response(events))
    submission = await rig.root.submit(Input("Deploy?", request_id="deploy-1"))
    await rig.live.partial("Deploying now")
    await rig.harness.close()  # a deploy: the process stops while the answer is streaming
    assert body.closed

    rig = await open_rig(storage=await SqliteStorage.open(path))
    again = await rig.root.submit(Input("Deploy?", request_id="deploy-1"))
    assert again.id == submission.id
    settled = await again.wait()
    assert settled.status == "done"
    assert await rig.answer_text(settled.answer) == "Deploying now…"
    assert script.requests[1] == script.requests[0]
    interrupted, answered = await rig.assistant_entries()
    assert (interrupted.stop_reason, interrupted.text()) == ("aborted", "Deploying now")
    assert answered.stop_reason == "stop"
