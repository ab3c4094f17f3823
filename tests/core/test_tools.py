"""Tool rounds and the `core.tool` task: declarations, validation, hooks, intent before execute, output,
results and controls."""

from __future__ import annotations

import asyncio
from typing import Any

from harness_core import (
    Block,
    Entry,
    Extension,
    HarnessSettings,
    Input,
    LiveDoc,
    OutputLimits,
    Rewrite,
    ToolApi,
    ToolCallInfo,
    ToolControl,
    ToolHookApi,
    ToolResult,
    hook,
    tool,
)
from harness_core.messages import AssistantMessage, ToolResultMessage, UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import faux_assistant, faux_text, faux_tool_call

from .helpers import FAUX, open_harness


def results_in(request: ModelRequest) -> list[ToolResultMessage]:
    return [m for m in request.messages if isinstance(m, ToolResultMessage)]


def call_then_answer(*calls: Any) -> Any:
    """First request: the given calls; afterwards: summarize the tool results."""

    def respond(request: ModelRequest) -> AssistantMessage:
        if isinstance(request.messages[-1], ToolResultMessage):
            return faux_assistant([faux_text("done: " + " | ".join(r.text() for r in results_in(request)))])
        return faux_assistant(list(calls))

    return respond


async def result_entries(root: Any) -> list[ToolResultMessage]:
    page = await root.entries(limit=100, order="asc")
    out: list[ToolResultMessage] = []
    for entry in page.items:
        for message in entry.model or ():
            if isinstance(message, ToolResultMessage):
                out.append(message)
    return out


def test_tool_decorator_builds_schema_from_type_hints() -> None:
    @tool
    def open_ticket(title: str, priority: int = 3, api: ToolApi | None = None) -> str:
        """Open a ticket in the tracker."""
        return title

    assert open_ticket.name == "open_ticket"
    assert open_ticket.description == "Open a ticket in the tracker."
    assert open_ticket.replay == "unsafe"
    schema = open_ticket.parameters
    assert schema["required"] == ["title"]
    assert schema["properties"]["priority"] == {"default": 3, "type": "integer"}

    @tool(replay="safe", name="grep", description="custom")
    async def search(pattern: str, api: ToolApi) -> str:
        return pattern

    assert (search.name, search.description, search.replay) == ("grep", "custom", "safe")
    assert "api" not in search.parameters["properties"]


async def test_parallel_round_creates_all_tool_tasks_at_once() -> None:
    started: list[str] = []
    both_started = asyncio.Event()

    @tool
    async def slow(name: str) -> str:
        """Waits for its sibling."""
        started.append(name)
        if len(started) == 2:
            both_started.set()
        await asyncio.wait_for(both_started.wait(), 5)
        return f"{name} ok"

    respond = call_then_answer(
        faux_tool_call("slow", {"name": "a"}, id="a"), faux_tool_call("slow", {"name": "b"}, id="b")
    )
    harness, faux = await open_harness(tools=[slow], responder=respond)
    root = await harness.root(agent=FAUX)
    settled = await (await root.submit(Input("go"))).wait()
    assert settled.status == "done"
    assert sorted(started) == ["a", "b"]
    assert [r.text() for r in results_in(faux.requests[-1])] == ["a ok", "b ok"]
    await harness.close()


async def test_sequential_tools_run_one_at_a_time_in_call_order() -> None:
    order: list[str] = []
    running = 0

    @tool(sequential=True)
    async def step(name: str) -> str:
        """One at a time."""
        nonlocal running
        running += 1
        assert running == 1
        order.append(name)
        await asyncio.sleep(0.01)
        running -= 1
        return name

    respond = call_then_answer(*[faux_tool_call("step", {"name": n}, id=n) for n in ("x", "y", "z")])
    harness, _ = await open_harness(tools=[step], responder=respond)
    root = await harness.root(agent=FAUX)
    assert (await (await root.submit(Input("go"))).wait()).status == "done"
    assert order == ["x", "y", "z"]
    await harness.close()


async def test_unoffered_tool_gets_unavailable_result_without_a_task() -> None:
    respond = call_then_answer(faux_tool_call("nope", {}, id="n1"))
    harness, _ = await open_harness(responder=respond)
    root = await harness.root(agent=FAUX)
    assert (await (await root.submit(Input("go"))).wait()).status == "done"
    [result] = await result_entries(root)
    assert result.is_error and "not available" in result.text()
    tools = [t for t in (await harness.session.storage.scan_tasks(kind="core.tool")).items]
    assert tools == []
    await harness.close()


async def test_invalid_arguments_are_reported_to_the_model() -> None:
    @tool
    def add(a: int, b: int) -> str:
        """Add."""
        return str(a + b)

    respond = call_then_answer(faux_tool_call("add", {"a": "x"}, id="c1"))
    harness, _ = await open_harness(tools=[add], responder=respond)
    root = await harness.root(agent=FAUX)
    assert (await (await root.submit(Input("go"))).wait()).status == "done"
    [result] = await result_entries(root)
    assert result.is_error
    assert "invalid arguments for add" in result.text() and "b" in result.text()
    await harness.close()


async def test_intent_is_committed_before_execute() -> None:
    seen: dict[str, Any] = {}

    @tool
    async def check(value: str, api: ToolApi) -> str:
        """Look at our own task."""
        task = await api.harness.get_task(api.task_id)
        live = await api.harness.snapshot(LiveDoc, api.conversation_id)
        seen["checkpoint"] = task.state.checkpoint
        seen["slot"] = live["tools"][0]["status"]
        return "ok"

    harness, _ = await open_harness(
        tools=[check], responder=call_then_answer(faux_tool_call("check", {"value": "v"}, id="c"))
    )
    root = await harness.root(agent=FAUX)
    await (await root.submit(Input("go"))).wait()
    assert seen["checkpoint"] == {"phase": "execute", "arguments": {"value": "v"}, "replay": "unsafe"}
    assert seen["slot"] == "running"
    await harness.close()


async def test_before_tool_block_rewrite_and_throw() -> None:
    executed: list[dict[str, Any]] = []

    @tool
    def act(target: str) -> str:
        """Act."""
        executed.append({"target": target})
        return f"acted on {target}"

    def guard(call: ToolCallInfo, api: ToolHookApi) -> Any:
        if call.arguments["target"] == "prod":
            return Block("production is off limits")
        if call.arguments["target"] == "typo":
            return Rewrite({"target": "fixed"})
        if call.arguments["target"] == "boom":
            raise RuntimeError("hook exploded")
        return None

    calls = [faux_tool_call("act", {"target": t}, id=t) for t in ("prod", "typo", "boom", "dev")]
    harness, _ = await open_harness(
        extensions=[Extension("guard", tools=[act], hooks=[hook("core.tool", before_tool=guard)])],
        responder=call_then_answer(*calls),
    )
    root = await harness.root(agent=FAUX)
    await (await root.submit(Input("go"))).wait()
    results = {r.tool_call_id: r for r in await result_entries(root)}
    assert results["prod"].is_error and "production is off limits" in results["prod"].text()
    assert results["typo"].text() == "acted on fixed"
    assert results["boom"].is_error and "hook exploded" in results["boom"].text()
    assert results["dev"].text() == "acted on dev"
    assert sorted(e["target"] for e in executed) == ["dev", "fixed"]
    await harness.close()


async def test_execute_error_becomes_tool_error_and_run_continues() -> None:
    @tool
    def broken() -> str:
        """Always fails."""
        raise ValueError("tracker is down")

    harness, faux = await open_harness(
        tools=[broken], responder=call_then_answer(faux_tool_call("broken", {}, id="b"))
    )
    root = await harness.root(agent=FAUX)
    assert (await (await root.submit(Input("go"))).wait()).status == "done"
    [result] = await result_entries(root)
    assert result.is_error and "tracker is down" in result.text()
    assert len(faux.requests) == 2
    tasks = (await harness.session.storage.scan_tasks(kind="core.tool")).items
    assert tasks[0].state.outcome is not None and tasks[0].state.outcome.status == "failed"
    await harness.close()


async def test_output_is_bounded_with_a_truncation_diagnostic_and_used_as_content() -> None:
    @tool(output_limits=OutputLimits(max_lines=5, max_bytes=10_000))
    def chatty(api: ToolApi) -> ToolResult:
        """Prints a lot."""
        for i in range(12):
            api.output(f"line {i}\n")
        return ToolResult()

    harness, _ = await open_harness(
        tools=[chatty], responder=call_then_answer(faux_tool_call("chatty", {}, id="c"))
    )
    root = await harness.root(agent=FAUX)
    await (await root.submit(Input("go"))).wait()
    [result] = await result_entries(root)
    text = result.text()
    assert text.startswith("line 0\nline 1\nline 2\nline 3\nline 4\n")
    assert "line 5" not in text
    assert "<harness>\n[warn] Output truncated: 7 lines" in text
    await harness.close()


async def test_details_replace_and_the_last_value_is_kept() -> None:
    @tool
    async def progress(api: ToolApi) -> str:
        """Reports progress."""
        await api.details({"step": 1})
        await api.details({"step": 2})
        return "ok"

    harness, _ = await open_harness(
        tools=[progress], responder=call_then_answer(faux_tool_call("progress", {}, id="p"))
    )
    root = await harness.root(agent=FAUX)
    await (await root.submit(Input("go"))).wait()
    [result] = await result_entries(root)
    assert result.details == {"step": 2}
    await harness.close()


async def test_terminate_control_ends_the_run_without_another_request() -> None:
    @tool
    def finish() -> ToolResult:
        """Ends the run."""
        return ToolResult(content="bye", control=ToolControl(terminate=True))

    harness, faux = await open_harness(
        tools=[finish], responder=call_then_answer(faux_tool_call("finish", {}, id="f"))
    )
    root = await harness.root(agent=FAUX)
    settled = await (await root.submit(Input("go"))).wait()
    assert settled.status == "done"
    assert len(faux.requests) == 1
    answer = await harness.session.storage.entry(settled.answer or 0)
    assert answer is not None and answer.model is not None
    assert isinstance(answer.model[0], AssistantMessage) and answer.model[0].tool_calls()
    await harness.close()


async def test_handoff_control_resets_the_context() -> None:
    @tool
    def hand_over() -> ToolResult:
        """Hands over."""
        return ToolResult(content="ok", control=ToolControl(handoff="Continue the audit from step 3."))

    def respond(request: ModelRequest) -> AssistantMessage:
        users = [user_text(m) for m in request.messages if isinstance(m, UserMessage)]
        if users == ["go"]:
            return faux_assistant([faux_tool_call("hand_over", {}, id="h")])
        return faux_assistant([faux_text("context: " + " / ".join(users))])

    harness, faux = await open_harness(tools=[hand_over], responder=respond)
    root = await harness.root(agent=FAUX)
    await (await root.submit(Input("go"))).wait()
    await (await root.submit(Input("next"))).wait()
    assert [user_text(m) for m in faux.requests[-1].messages if isinstance(m, UserMessage)] == [
        "Continue the audit from step 3.",
        "next",
    ]
    await harness.close()


async def test_add_tools_control_extends_an_array_tool_filter() -> None:
    from harness_core import AgentChange, ModelRef

    @tool
    def unlock() -> ToolResult:
        """Unlock the second tool."""
        return ToolResult(content="unlocked", control=ToolControl(add_tools=["second"]))

    @tool
    def second() -> str:
        """Second."""
        return "2"

    harness, faux = await open_harness(
        tools=[unlock, second], responder=call_then_answer(faux_tool_call("unlock", {}, id="u"))
    )
    root = await harness.root(
        agent=AgentChange(model=ModelRef(provider="faux", model_id="m"), tools=["unlock"])
    )
    await (await root.submit(Input("go"))).wait()
    assert [t.name for t in faux.requests[0].tools] == ["unlock"]
    assert [t.name for t in faux.requests[1].tools] == ["unlock", "second"]
    await harness.close()


async def test_parallel_setting_sequential_runs_round_in_order() -> None:
    order: list[str] = []

    @tool
    async def note(name: str) -> str:
        """Note."""
        order.append(name)
        return name

    respond = call_then_answer(*[faux_tool_call("note", {"name": n}, id=n) for n in ("1", "2", "3")])
    harness, _ = await open_harness(
        tools=[note], responder=respond, settings=HarnessSettings(tool_execution="sequential")
    )
    root = await harness.root(agent=FAUX)
    await (await root.submit(Input("go"))).wait()
    assert order == ["1", "2", "3"]
    await harness.close()


def _entry_kinds(entries: list[Entry]) -> list[str]:
    return [e.kind for e in entries]


async def test_duplicate_call_ids_in_one_message_each_run_with_their_own_arguments() -> None:
    ran: list[str] = []

    @tool
    def forecast(city: str) -> str:
        """Forecast."""
        ran.append(city)
        return f"{city}: sunny"

    respond = call_then_answer(
        faux_tool_call("forecast", {"city": "Zurich"}, id="same"),
        faux_tool_call("forecast", {"city": "Oslo"}, id="same"),
    )
    harness, faux = await open_harness(tools=[forecast], responder=respond)
    root = await harness.root(agent=FAUX)
    assert (await (await root.submit(Input("weather?"))).wait()).status == "done"
    assert sorted(ran) == ["Oslo", "Zurich"]
    assert sorted(r.text() for r in results_in(faux.requests[-1])) == ["Oslo: sunny", "Zurich: sunny"]
    await harness.close()


async def test_a_tool_mutating_its_nested_arguments_leaves_the_stored_call_and_later_contexts_alone() -> None:
    # The call's arguments come from the assistant entry, which may be served from the context cache: the tool
    # must get its own copy, or its in-place edits change the cached entry and every later model request.
    from harness_core import ToolSpec

    async def poke(arguments: dict[str, Any], _api: ToolApi) -> str:
        arguments["options"]["tags"].append("mutated")
        arguments["options"]["seen"] = True
        return "poked"

    spec = ToolSpec(name="poke", description="Poke.", parameters={"type": "object"}, execute=poke)
    seen: list[dict[str, Any]] = []

    def respond(request: ModelRequest) -> AssistantMessage:
        if isinstance(request.messages[-1], ToolResultMessage):
            for message in request.messages:
                if isinstance(message, AssistantMessage):
                    seen.extend(dict(call.arguments) for call in message.tool_calls())
            return faux_assistant([faux_text("done")])
        call = faux_tool_call("poke", {"options": {"tags": ["a"]}}, id="p1")
        return faux_assistant([call], stop_reason="toolUse")

    harness, _ = await open_harness(responder=respond, tools=[spec])
    root = await harness.root(agent=FAUX)
    settled = await (await root.submit(Input("go"))).wait()
    assert settled.status == "done"
    assert seen == [{"options": {"tags": ["a"]}}]  # what the model sent, not what the tool did to its copy
    view = await root.context()
    stored = [await harness.entry(e.id) for e in view.entries]
    assert [e.model for e in view.entries] == [e.model for e in stored if e is not None]
    await harness.close()
