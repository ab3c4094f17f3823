"""`schedule`: a tool that arms a durable timer; when it fires, an input is submitted into the same place
(with a stable request id, so a restart around the firing never submits it twice) and answered there."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from adapters.bridge.docs import PlaceOfDoc, ReplyDoc, ScheduleDoc
from harness_core import Complete, Input, Task, TaskRuntime, ToolApi, ToolSpec, Tx, Wait, define_task, tool

if TYPE_CHECKING:
    from adapters.bridge.bridge import Bridge

MAX_DELAY_MINUTES = 60 * 24 * 30


async def _arm(task: Task, runtime: TaskRuntime) -> None:
    until = int(task.input["at"])
    await runtime.commit(lambda _tx, _task: Wait(checkpoint={"phase": "fire"}, deadline=until))


async def _fire(task: Task, runtime: TaskRuntime) -> None:
    harness = runtime.harness
    conversation_id = int(task.input["conversation_id"])

    async def commit(tx: Tx, current: Task) -> Complete:
        text = f"(scheduled) {task.input['text']}"
        submission = await harness.submit_in(
            tx, conversation_id, Input(text, request_id=f"schedule:{current.id}")
        )
        place_of = await tx.snapshot(PlaceOfDoc, conversation_id) or {}
        if place_of.get("place") is not None:
            await tx.create_doc(  # keyed by the submission minted just above
                ReplyDoc,
                key=str(submission.id),
                seed={
                    "conversation_id": conversation_id,
                    "target": place_of["place"],
                    "requester": None,
                    "parts": [],
                },
            )
        return Complete({"submission_id": submission.id})

    await runtime.commit(commit)
    harness.resume()


def _in_words(minutes: float) -> str:
    seconds = max(1, round(minutes * 60))
    if seconds < 90:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    if minutes < 90:
        whole = round(minutes)
        return f"{whole} minute{'s' if whole != 1 else ''}"
    hours = minutes / 60
    return f"{hours:.1f} hours" if hours < 48 else f"{hours / 24:.1f} days"


ScheduledTask = define_task("bridge.scheduled", phases={"arm": _arm, "fire": _fire})


def schedule_tool(bridge: Bridge) -> ToolSpec:
    @tool(replay="safe", name="schedule")
    async def schedule(message: str, delay_minutes: float, api: ToolApi) -> str:
        """Post `message` into this conversation after `delay_minutes` minutes. The timer is durable: it fires
        once even if the bot restarts in between."""
        if not 0 < delay_minutes <= MAX_DELAY_MINUTES:
            raise ValueError(f"delay_minutes must be between 0 and {MAX_DELAY_MINUTES}")

        async def arm(tx: Tx, task: Task) -> tuple[int, int]:
            existing = await tx.snapshot(ScheduleDoc, key=str(task.id))
            if existing:  # re-executed after a crash: the timer already exists
                return int(existing["timer_task_id"]), int(existing["at"])
            at = tx.now + int(delay_minutes * 60_000)
            timer = await bridge.harness.create_task_in(
                tx,
                ScheduledTask.name,
                {"at": at, "text": message, "conversation_id": task.conversation_id},
                conversation_id=task.conversation_id,
                background=True,
            )
            await tx.doc(ScheduleDoc, key=str(task.id), seed={"timer_task_id": timer.id, "at": at})
            return timer.id, at

        timer_id, at = await api.commit(arm)
        # Relative first: it means the same in every reader's time zone (the UTC time is for the record).
        when = dt.datetime.fromtimestamp(at / 1000, tz=dt.UTC).strftime("%H:%M UTC")
        return f"Scheduled in {_in_words(delay_minutes)} (at {when}; timer {timer_id})."

    return schedule
