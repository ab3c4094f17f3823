"""Runaway tools: the per-execution time limit (declared on the tool, overridden by the host) and the
event-loop lag watchdog that names a tool blocking the loop."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from harness_core import (
    HarnessSettings,
    Input,
    ToolApi,
    ToolSettings,
    WatchdogSettings,
    tool,
)
from harness_core.messages import ToolResultMessage
from harness_core.models.faux import faux_tool_call

from .helpers import FAUX, open_harness
from .test_tools import call_then_answer, result_entries


async def run_one_call(
    spec: object, settings: HarnessSettings | None = None, arguments: dict[str, object] | None = None
) -> tuple[ToolResultMessage, float]:
    """Let the model call `spec` once; return its result and how long the turn took."""
    name = spec.name  # type: ignore[attr-defined]
    respond = call_then_answer(faux_tool_call(name, arguments or {}, id="c1"))
    harness, _ = await open_harness(tools=[spec], responder=respond, settings=settings)  # type: ignore[list-item]
    try:
        root = await harness.root(agent=FAUX)
        started = time.monotonic()
        settled = await asyncio.wait_for((await root.submit(Input("go"))).wait(), 30)
        elapsed = time.monotonic() - started
        assert settled.status == "done"
        (result,) = await result_entries(root)
        return result, elapsed
    finally:
        await harness.close()


async def test_a_tool_past_its_declared_time_limit_is_cancelled_and_the_model_gets_an_error() -> None:
    cancelled = asyncio.Event()

    @tool(replay="safe", timeout=0.2)
    async def hang() -> str:
        """Never returns on its own."""
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "unreachable"

    result, elapsed = await run_one_call(hang)
    assert result.is_error
    assert "Tool hang did not finish within its time limit of 0.2 s and was stopped" in result.text()
    assert "partially run" not in result.text(), "a replay-safe tool did nothing that needs checking"
    assert cancelled.is_set()
    assert elapsed < 10  # functional: the turn ended instead of waiting for the tool


async def test_an_unsafe_tool_that_timed_out_may_have_partially_run_and_keeps_its_output() -> None:
    @tool
    async def migrate(api: ToolApi) -> str:
        """Streams progress, then stalls."""
        api.output("copied table users\n")
        await asyncio.sleep(3600)
        return "unreachable"

    settings = HarnessSettings(tools=ToolSettings(timeout=0.2))
    result, _ = await run_one_call(migrate, settings)
    assert result.is_error
    text = result.text()
    assert "copied table users" in text, "what it showed before the limit stays visible"
    assert "did not finish within its time limit of 0.2 s and was stopped; it may have partially run" in text


async def test_the_host_override_per_tool_wins_over_the_declaration() -> None:
    @tool(replay="safe", timeout=3600)
    async def slow() -> str:
        """Slow."""
        await asyncio.sleep(3600)
        return "unreachable"

    settings = HarnessSettings(tools=ToolSettings(timeout=3600, timeouts={"slow": 0.2}))
    result, _ = await run_one_call(slow, settings)
    assert "time limit of 0.2 s" in result.text()

    @tool(replay="safe", timeout=0.05)
    async def patient(api: ToolApi) -> str:
        """Needs longer than it declared; the host allows it."""
        await asyncio.sleep(0.3)
        return f"done within {api.time_limit}"

    lenient = HarnessSettings(tools=ToolSettings(timeouts={"patient": 30}))
    result, _ = await run_one_call(patient, lenient)
    assert not result.is_error and result.text() == "done within 30"


async def test_a_tool_that_swallows_its_cancellation_still_gets_the_time_limit_error() -> None:
    @tool(replay="safe", timeout=0.2)
    async def stubborn() -> str:
        """Catches the cancellation and pretends all went well."""
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return "all fine"
        return "unreachable"

    result, _ = await run_one_call(stubborn)
    assert result.is_error and "all fine" not in result.text()
    assert "did not finish within its time limit" in result.text()


async def test_a_tools_own_timeout_error_within_its_limit_is_an_ordinary_tool_error() -> None:
    @tool(replay="safe", timeout=30)
    async def remote() -> str:
        """Its own call times out first."""
        await asyncio.wait_for(asyncio.sleep(3600), 0.05)
        return "unreachable"

    result, _ = await run_one_call(remote)
    assert result.is_error
    assert "TimeoutError" in result.text() and "time limit" not in result.text()


def test_a_time_limit_must_be_positive() -> None:
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):

            @tool(timeout=bad)
            async def nope() -> str:
                """x"""
                return "x"


async def test_the_watchdog_names_a_tool_that_blocks_the_event_loop(caplog: pytest.LogCaptureFixture) -> None:
    @tool(replay="safe")
    def blocker() -> str:
        """Blocks the whole loop (what a tool must never do)."""
        time.sleep(0.6)
        return "woke up"

    settings = HarnessSettings(watchdog=WatchdogSettings(threshold_ms=300, interval_ms=20))
    with caplog.at_level(logging.WARNING, logger="harness_core.watchdog"):
        result, _ = await run_one_call(blocker, settings)
    assert result.text() == "woke up"
    warnings = [r for r in caplog.records if r.name == "harness_core.watchdog"]
    assert warnings, "the blocked loop was reported"
    message = warnings[0].getMessage()
    assert message.startswith("event loop blocked for ")
    assert "(blocker)" in message and "task " in message
    assert warnings[0].levelno == logging.WARNING


async def test_the_watchdog_stops_with_the_harness() -> None:
    harness, _ = await open_harness()
    harness.resume()
    task = harness.watchdog._task
    assert task is not None and not task.done()
    await harness.close()
    assert task.done()


async def test_a_lag_outside_any_tool_is_reported_without_naming_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = HarnessSettings(watchdog=WatchdogSettings(threshold_ms=200, interval_ms=20))
    harness, _ = await open_harness(settings=settings)
    try:
        harness.resume()
        await asyncio.sleep(0.05)  # the watchdog is sleeping
        with caplog.at_level(logging.WARNING, logger="harness_core.watchdog"):
            time.sleep(0.4)  # noqa: ASYNC251  (the point: the host itself blocks the loop)
            await asyncio.sleep(0.05)
        (record,) = [r for r in caplog.records if r.name == "harness_core.watchdog"]
        assert record.getMessage().endswith("ms; no tool was running")
    finally:
        await harness.close()


async def test_the_record_of_finished_tool_runs_is_bounded() -> None:
    from harness_core._watchdog import FINISHED_KEPT, ToolRuns

    runs = ToolRuns()
    for task_id in range(FINISHED_KEPT * 3):
        runs.end(runs.begin(task_id, "t"))
    still = runs.begin(10_000, "long")
    seen = runs.during(0, asyncio.get_running_loop().time())
    assert len(seen) == FINISHED_KEPT + 1 and seen[-1] is still
    assert runs.running() == [still]
