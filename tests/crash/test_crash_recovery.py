"""Crash recovery with real processes and real SIGKILL (issue "Agent runtime", DESIGN.md §2.7).

Each test runs the worker (`worker.py`) as a subprocess on one SQLite file, kills it at a precise point
(the tool kills its own process, or the test kills it when the worker reports a moment), starts it again,
and checks what the store and the external ledger say.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness_core import CORE_ASSISTANT, Harness
from harness_core.messages import AssistantMessage, ToolResultMessage

from .support import ledger, open_storage, run_worker

# Every crash test runs on SQLite and on PostgreSQL (the `crash_backend` fixture, tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("crash_backend")]


async def transcript(workdir: Path, conversation_id: int = 1) -> list[Any]:
    harness = await Harness.open(await open_storage(workdir))
    handle = await harness.conversation(conversation_id)
    assert handle is not None
    page = await handle.entries(limit=500, order="asc")
    await harness.close()
    return page.items


def tool_results(entries: list[Any]) -> dict[str, ToolResultMessage]:
    return {m.tool_name: m for e in entries for m in e.model or () if isinstance(m, ToolResultMessage)}


async def test_seed_experiment_unsafe_tool_killed_mid_execute(tmp_path: Path) -> None:
    crashed = await run_worker(tmp_path, "triage", {"crash": True})
    assert crashed.killed
    recovered = await run_worker(tmp_path, "triage")
    assert recovered.event("settled")["status"] == "done"
    lines = ledger(tmp_path)
    assert lines.count("search_logs NullPointerException") == 1  # finished before the crash: not re-run
    assert lines.count("open_ticket NPE in OrderService") == 1  # unsafe: never re-run
    results = tool_results(await transcript(tmp_path))
    assert not results["search_logs"].is_error
    assert results["open_ticket"].is_error
    assert "Tool open_ticket was interrupted and may have partially run" in results["open_ticket"].text()


@pytest.mark.parametrize(
    ("policy", "tickets", "is_error", "names"),
    [("default", 1, True, None), ("safe-naive", 2, False, "TICKET-2"), ("safe-keyed", 1, False, "TICKET-1")],
)
async def test_seed_experiment_tracker_table(
    tmp_path: Path, policy: str, tickets: int, is_error: bool, names: str | None
) -> None:
    crashed = await run_worker(tmp_path, "tracker", {"policy": policy, "crash": True})
    assert crashed.killed
    assert (
        len(json.loads((tmp_path / "tracker.json").read_text())) == 1
    )  # the effect landed, the result did not
    recovered = await run_worker(tmp_path, "tracker", {"policy": policy})
    assert recovered.event("settled")["status"] == "done"
    assert len(json.loads((tmp_path / "tracker.json").read_text())) == tickets
    result = tool_results(await transcript(tmp_path))["open_ticket"]
    assert result.is_error is is_error
    if names is not None:
        assert names in result.text()
    else:
        assert "TICKET" not in result.text()  # the harness never learned the ticket id


async def test_kill_mid_generation_resends_request_and_keeps_partial_as_aborted(tmp_path: Path) -> None:
    options = {"delay_ms": 15, "chunk_size": 6}
    crashed = await run_worker(tmp_path, "slow_answer", options, kill_on="partial", kill_after=2)
    assert crashed.killed
    recovered = await run_worker(tmp_path, "slow_answer", options)
    settled = recovered.event("settled")
    assert settled["status"] == "done"
    assistants = [
        m
        for e in await transcript(tmp_path)
        if e.kind == CORE_ASSISTANT
        for m in e.model
        if isinstance(m, AssistantMessage)
    ]
    assert [m.stop_reason for m in assistants] == ["aborted", "stop"]
    assert assistants[0].text() and assistants[1].text().startswith(assistants[0].text())
    assert assistants[1].text().count("The order failures") == 6


async def test_kill_during_parallel_round_does_not_rerun_finished_tools(tmp_path: Path) -> None:
    crashed = await run_worker(tmp_path, "parallel_round", {"crash": True})
    assert crashed.killed
    recovered = await run_worker(tmp_path, "parallel_round")
    assert recovered.event("settled")["status"] == "done"
    lines = ledger(tmp_path)
    assert lines.count("fast_a") == 1
    assert lines.count("fast_b") == 1
    assert lines.count("slow_c") == 2  # replay-safe and unfinished: executed again with its stored arguments
    answer = [
        m
        for e in await transcript(tmp_path)
        if e.kind == CORE_ASSISTANT
        for m in e.model
        if isinstance(m, AssistantMessage)
    ][-1]
    assert answer.text() == "all: a done, b done, c done"


async def test_tool_that_kills_its_process_is_parked_then_retried(tmp_path: Path) -> None:
    options: dict[str, Any] = {"restart_limit": 2}
    runs = [await run_worker(tmp_path, "crash_loop", options)]
    for _ in range(2):
        runs.append(await run_worker(tmp_path, "crash_loop", {**options, "action": "resume"}))
    assert all(run.killed for run in runs)
    parked = await run_worker(tmp_path, "crash_loop", {**options, "action": "inspect"})
    inspection = parked.event("inspect")
    assert len(inspection["parked"]) == 1
    assert (
        ledger(tmp_path).count("fragile") == 3
    )  # the first run and two restarts; the third restart parks it
    # Parked means not scheduled: a plain restart does not run it again.
    await run_worker(tmp_path, "crash_loop", {**options, "action": "inspect"})
    assert ledger(tmp_path).count("fragile") == 3
    (tmp_path / "repaired").touch()
    retried = await run_worker(
        tmp_path, "crash_loop", {**options, "action": "retry", "task_id": inspection["parked"][0]}
    )
    assert retried.event("idle")
    assert ledger(tmp_path).count("fragile") == 4
    assert tool_results(await transcript(tmp_path))["fragile"].text() == "worked this time"


async def test_approval_decision_survives_kill_and_is_never_asked_again(tmp_path: Path) -> None:
    asked = await run_worker(tmp_path, "approval", kill_on="asked")
    assert asked.killed
    task_id = asked.event("asked")["task_id"]
    decided = await run_worker(
        tmp_path,
        "approval",
        {"action": "decide", "task_id": task_id, "decision": "approved", "crash_after_memo": True},
    )
    assert decided.killed
    assert decided.event("decided")["decision"] == "approved"
    finished = await run_worker(tmp_path, "approval", {"action": "resume"})
    assert finished.event("idle")
    assert [e for e in finished.events if e["event"] in ("asked", "decided")] == []  # the memo answered
    lines = ledger(tmp_path)
    assert lines.count("asked") == 1
    assert lines.count("deploy api") == 1
    assert tool_results(await transcript(tmp_path))["deploy"].text() == "deployed api"


@pytest.mark.parametrize(
    ("kind", "kill_on"), [("test.timer", "waiting"), ("test.nap", "sleeping")], ids=["wait-deadline", "sleep"]
)
async def test_a_timer_killed_while_it_waits_fires_once_and_not_early(
    tmp_path: Path, kind: str, kill_on: str
) -> None:
    started = await run_worker(
        tmp_path, "timer", {"action": "start_timer", "delay_ms": 1500, "kind": kind}, kill_on=kill_on
    )
    assert started.killed
    until = started.event("armed")["until"]
    storage = await open_storage(tmp_path)
    (task,) = (await storage.scan_tasks(kind=kind)).items
    await storage.close()
    if kind == "test.timer":  # killed with the wait committed: nothing runs, the deadline is stored
        assert (task.state.status, task.state.deadline) == ("waiting", until)
    else:  # killed inside its phase, which holds `until` in its input
        assert task.state.status == "running"
    fired = await run_worker(tmp_path, "timer", {"action": "resume"})
    assert fired.event("idle")
    again = await run_worker(tmp_path, "timer", {"action": "resume"})
    assert again.event("idle")
    assert [line for line in ledger(tmp_path) if line.startswith("fired")] == [f"fired {kind} early_by_ms=0"]


async def test_subagent_killed_mid_child_run_continues_the_same_child(tmp_path: Path) -> None:
    crashed = await run_worker(tmp_path, "subagent", {"crash_in_child": True})
    assert crashed.killed
    recovered = await run_worker(tmp_path, "subagent", {"action": "resume"})
    assert recovered.event("idle")
    lines = ledger(tmp_path)
    assert lines.count("child created") == 1
    assert lines.count("investigate") == 2  # replay-safe tool ran again and found its child
    storage = await open_storage(tmp_path)
    tools = (await storage.scan_tasks(kind="core.tool")).items
    children = (await storage.scan_conversations(owner_task_id=tools[0].id)).items
    child_inputs = (await storage.scan_submissions(conversation_id=children[0].id)).items
    await storage.close()
    assert len(children) == 1
    assert [s.request_id for s in child_inputs] == [f"subagent:{tools[0].id}"]
    assert (
        tool_results(await transcript(tmp_path))["investigate"].text()
        == "child says: the root cause is a null id"
    )


async def test_follow_ups_answered_in_order_and_request_ids_not_rerun_after_restart(tmp_path: Path) -> None:
    texts = ["one", "two", "three"]
    options = {"action": "submit_many", "texts": texts, "delay_ms": 5}
    crashed = await run_worker(tmp_path, "echo", options, kill_on="settled")
    assert crashed.killed
    recovered = await run_worker(tmp_path, "echo", options)
    settled = [e for e in recovered.events if e["event"] == "settled"]
    assert [e["status"] for e in settled] == ["done", "done", "done"]
    entries = await transcript(tmp_path)
    users = [e for e in entries if e.kind == "core.user"]
    answers = [
        m.text()
        for e in entries
        if e.kind == CORE_ASSISTANT
        for m in e.model
        if isinstance(m, AssistantMessage) and m.stop_reason == "stop"
    ]
    assert len(users) == 3  # resubmitting the same request ids wrote nothing new
    assert answers == ["answer to one", "answer to two", "answer to three"]
    assert [e["answer"] for e in settled] == sorted(e["answer"] for e in settled)
