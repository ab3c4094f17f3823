"""A tool that was executing when its process stopped: replayed only when both its stored intent and its current
declaration say `replay="safe"`; otherwise the model gets an "interrupted" result carrying the output the tool
had streamed (committed while it ran). Also the `after_tool` hook."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

import pytest

from harness_core import Extension, Input, LiveDoc, ToolApi, ToolCallInfo, ToolHookApi, ToolResult, hook, tool
from harness_core.messages import ToolResultMessage
from harness_core.models.faux import faux_tool_call
from harness_core.storage import SqliteStorage

from .helpers import FAUX, eventually, open_harness
from .test_tools import call_then_answer, result_entries

Replay = Literal["safe", "unsafe"]


def make_probe(replay: Replay, runs: list[str], *, block: bool) -> Any:
    """`probe` streams a line of output, then blocks (the first process) or finishes (a later one)."""

    @tool(replay=replay)
    async def probe(target: str, api: ToolApi) -> str:
        """Probe a target."""
        runs.append(target)
        api.output(f"probing {target}: step 1 of 3\n")
        if block:
            await asyncio.Event().wait()
        return f"{target} is healthy"

    return probe


async def output_committed(harness: Any, conversation_id: int) -> bool:
    live = await harness.snapshot(LiveDoc, conversation_id)
    slots = (live or {}).get("tools") or []
    return bool(slots) and "step 1" in str(slots[0].get("output") or "")


async def interrupted_run(
    tmp_path: Path, first: Replay, second: Replay
) -> tuple[list[str], ToolResultMessage]:
    """Run `probe` under declaration `first` until its output is committed, stop the harness while it
    executes, reopen with the declaration `second`; return the executions and the result the model got."""
    path = tmp_path / "agent.sqlite"
    runs: list[str] = []
    respond = call_then_answer(faux_tool_call("probe", {"target": "db-1"}, id="p1"))
    harness, _ = await open_harness(
        storage=await SqliteStorage.open(path), tools=[make_probe(first, runs, block=True)], responder=respond
    )
    root = await harness.root(agent=FAUX)
    await root.submit(Input("check db-1"))
    harness.resume()
    await eventually(lambda: output_committed(harness, root.id))
    await harness.close()  # like a process that stops mid-execute: the call stays in its execute phase

    reopened, _ = await open_harness(
        storage=await SqliteStorage.open(path),
        tools=[make_probe(second, runs, block=False)],
        responder=respond,
    )
    try:
        reopened.resume()
        await reopened.wait_for_idle()
        (result,) = await result_entries(await reopened.root())
    finally:
        await reopened.close()
    return runs, result


async def test_a_call_safe_in_intent_and_declaration_is_executed_again(tmp_path: Path) -> None:
    runs, result = await interrupted_run(tmp_path, "safe", "safe")
    assert runs == ["db-1", "db-1"]
    assert not result.is_error
    assert result.text() == "db-1 is healthy"


@pytest.mark.parametrize(
    ("first", "second"),
    [("unsafe", "unsafe"), ("unsafe", "safe"), ("safe", "unsafe")],
    ids=["unsafe", "declared-safe-after-the-intent", "intent-safe-but-no-longer-declared-safe"],
)
async def test_otherwise_the_model_is_told_it_was_interrupted_with_the_output_so_far(
    tmp_path: Path, first: Replay, second: Replay
) -> None:
    runs, result = await interrupted_run(tmp_path, first, second)
    assert runs == ["db-1"]  # never executed again
    assert result.is_error
    assert "Tool probe was interrupted and may have partially run" in result.text()
    assert "probing db-1: step 1 of 3" in result.text()


async def test_after_tool_can_replace_the_result_and_a_failing_hook_is_reported() -> None:
    seen: list[tuple[str, str]] = []

    @tool
    async def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}: s3cr3t-token"

    def redact(info: ToolCallInfo, result: ToolResult, api: ToolHookApi) -> ToolResult:
        content = result.content
        text = content if isinstance(content, str) else "".join(getattr(c, "text", "") for c in content or [])
        seen.append((info.name, text))
        return ToolResult(content=text.replace("s3cr3t-token", "[redacted]"))

    def broken(info: ToolCallInfo, result: ToolResult, api: ToolHookApi) -> None:
        raise RuntimeError("observer bug")

    reports: list[BaseException] = []
    harness, _ = await open_harness(
        tools=[lookup],
        extensions=[
            Extension(
                "guards", hooks=[hook("core.tool", after_tool=redact), hook("core.tool", after_tool=broken)]
            )
        ],
        responder=call_then_answer(faux_tool_call("lookup", {"key": "api"}, id="l1")),
        reports=reports,
    )
    root = await harness.root(agent=FAUX)
    await (await root.submit(Input("what is the api key?"))).wait()
    (result,) = await result_entries(root)
    await harness.close()
    assert seen == [("lookup", "value of api: s3cr3t-token")]
    assert result.text() == "value of api: [redacted]"
    assert any("observer bug" in str(r) for r in reports)  # reported; the call still completed
