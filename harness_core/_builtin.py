"""The three built-in task kinds, always installed, and the cleanup their own code cannot do when a task
faulted (crashed in a phase) or was orphaned (its code is missing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness_core._compaction import CompactionTask
from harness_core._generation import GenerationTask, convert_partial
from harness_core._inbox import end_run_unanswered
from harness_core.documents import LiveDoc
from harness_core.extensions import Registry
from harness_core.records import Task

if TYPE_CHECKING:
    from harness_core._tx import Tx
    from harness_core.harness import Harness


def install_builtins(registry: Registry) -> None:
    from harness_core._tool_task import ToolTask

    for definition in (GenerationTask, ToolTask, CompactionTask):
        registry.define_builtin(definition)


async def cleanup_failed_task(harness: Harness, tx: Tx, task: Task) -> None:
    outcome = task.state.outcome
    assert outcome is not None
    live = await tx.doc(LiveDoc, task.conversation_id)
    if task.kind == "core.generation":
        run = live.value.get("run")
        if run is None or run.get("task_id") != task.id:
            return
        await convert_partial(tx, task.conversation_id)
        reason = "faulted" if outcome.status == "faulted" else (outcome.reason or "missing_task")
        detail = outcome.error.message if outcome.error is not None else None
        await end_run_unanswered(harness, tx, task.conversation_id, task.id, reason=reason, detail=detail)
    elif task.kind == "core.tool":
        for slot in live.value.get("tools", []):
            if slot.get("task_id") == task.id:
                slot["status"] = "done"
                for key in ("output", "details"):
                    slot.pop(key, None)
    elif task.kind == "core.compaction":
        compactions = [c for c in live.value.get("compactions", []) if c.get("task_id") != task.id]
        if compactions:
            live.value["compactions"] = compactions
        else:
            live.value.pop("compactions", None)
