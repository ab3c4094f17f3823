"""`Detach` and `run_detached_tool`: a hook answers a call at once (its one tool result, not an error) so the
turn ends, and its own task runs the call later, once, under core.tool's replay rule."""

from __future__ import annotations

from typing import Any

from harness_core import (
    Checkpoint,
    Complete,
    Detach,
    Extension,
    Input,
    Task,
    TaskRuntime,
    ToolApi,
    ToolCallInfo,
    ToolHookApi,
    ToolResult,
    Tx,
    define_task,
    detached_intent,
    hook,
    run_detached_tool,
    tool,
)
from harness_core.messages import TextContent

from .helpers import FAUX, open_harness, task_reaches
from .test_tools import call_then_answer, result_entries


def extension(runs: list[tuple[str, int]], *, replay: str = "unsafe", start: str = "wait") -> Extension:
    @tool(replay=replay)  # type: ignore[call-overload]
    def act(target: str, api: ToolApi) -> str:
        """Act on a target."""
        runs.append((target, api.task_id))
        return f"acted on {target}"

    async def wait(task: Task, runtime: TaskRuntime) -> None:
        # The intent (final arguments, replay policy) is committed before the call runs.
        await runtime.commit(lambda _tx, _t: Checkpoint({"phase": "execute", "run": "now"}))
        result = await run_detached_tool(runtime, task.input["intent"], recovering=False)
        await runtime.commit(lambda _tx, _t: Complete({"text": _text(result), "error": result.is_error}))

    async def execute(task: Task, runtime: TaskRuntime) -> None:  # reached by recovery only
        result = await run_detached_tool(runtime, task.input["intent"], recovering=True)
        await runtime.commit(lambda _tx, _t: Complete({"text": _text(result), "error": result.is_error}))

    later = define_task(
        "t.later", phases={"wait": wait, "execute": execute}, initial=lambda _input: {"phase": start}
    )

    async def detach(call: ToolCallInfo, api: ToolHookApi) -> Any:
        intent = detached_intent(call, task_id=api.task_id)

        async def create(tx: Tx, task: Task) -> int:
            owner = await api.harness.create_task_in(
                tx, "t.later", {"intent": intent}, conversation_id=task.conversation_id, background=True
            )
            return int(owner.id)

        owner = await api.commit(create)
        return Detach(f"{call.name} runs later (task {owner})", details={"owner": owner})

    return Extension("later", tools=[act], hooks=[hook("core.tool", before_tool=detach)], tasks=[later])


async def test_a_detached_call_has_one_result_now_and_runs_once_later_with_its_own_task_id() -> None:
    runs: list[tuple[str, int]] = []
    harness, _ = await open_harness(
        extensions=[extension(runs)], responder=call_then_answer(*[_call("prod")])
    )
    root = await harness.root(agent=FAUX)
    settled = await (await root.submit(Input("go"))).wait()
    assert settled.status == "done"  # the turn ended on the detached result
    [result] = await result_entries(root)
    assert not result.is_error and result.text().startswith("act runs later (task ")
    owner = int(result.details["owner"])  # type: ignore[index]
    done = await task_reaches(harness, owner, "terminal")
    assert done.state.outcome.result == {"text": "acted on prod", "error": False}
    tool_task = [t for t in (await harness.session.storage.scan_tasks(kind="core.tool")).items]
    assert runs == [("prod", tool_task[0].id)]  # once, and ToolApi.task_id is the call's own task
    assert len(await result_entries(root)) == 1  # still exactly one result for the call
    await harness.close()


async def test_recovery_of_a_detached_call_reruns_only_a_replay_safe_tool() -> None:
    for replay, expected_runs, expected in (
        ("unsafe", 0, "Tool act was interrupted and may have partially run"),
        ("safe", 1, "acted on prod"),
    ):
        runs: list[tuple[str, int]] = []
        harness, _ = await open_harness(
            extensions=[extension(runs, replay=replay, start="execute")],
            responder=call_then_answer(*[_call("prod")]),
        )
        root = await harness.root(agent=FAUX)
        await (await root.submit(Input("go"))).wait()
        [result] = await result_entries(root)
        done = await task_reaches(harness, int(result.details["owner"]), "terminal")  # type: ignore[index]
        outcome = done.state.outcome.result
        assert (outcome["text"], len(runs)) == (expected, expected_runs), (replay, outcome, runs)
        assert outcome["error"] == (replay == "unsafe")
        await harness.close()


def _text(result: ToolResult) -> str:
    content = result.content
    if isinstance(content, str):
        return content
    return "".join(c.text for c in content or [] if isinstance(c, TextContent))


def _call(target: str) -> Any:
    from harness_core.models.faux import faux_tool_call

    return faux_tool_call("act", {"target": target}, id=f"call-{target}")
