"""A `[tools] modules` plugin that brings its own task kind, for the `blocked` state of `inspect`.

`start_watch` creates a background `watch.timer` task in the conversation; the task waits durably for an hour.
Its code lives only in this module: open the same storage with a config that lacks the module and the task's
definition is missing, so the harness leaves it alone and `inspect` lists it as BLOCKED (missing_task).
"""

from __future__ import annotations

from harness_core import Complete, Extension, Task, TaskRuntime, ToolApi, Wait, define_task, tool

WATCH_KIND = "watch.timer"
HOUR_MS = 3_600_000


async def _arm(task: Task, runtime: TaskRuntime) -> None:
    deadline = runtime.now() + HOUR_MS
    await runtime.commit(lambda _tx, _t: Wait(checkpoint={"phase": "fire"}, deadline=deadline))


async def _fire(task: Task, runtime: TaskRuntime) -> None:
    await runtime.commit(lambda _tx, _t: Complete("fired"))


watch_timer = define_task(WATCH_KIND, phases={"arm": _arm, "fire": _fire})


@tool(replay="safe")
async def start_watch(api: ToolApi) -> str:
    """Start an hour-long background watch in this conversation."""
    task_id = await api.create_task(WATCH_KIND, background=True)
    return f"watch task {task_id} started"


extension = Extension("watch-tools", tools=[start_watch], tasks=[watch_timer])
