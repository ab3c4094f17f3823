"""`core.compaction`: summarize older entries so a long-lived conversation fits the model's window.

Stored history is never deleted: a `core.compaction` entry carries the summary and a head marker pointing at
the first kept entry, so later contexts start there. Blocking compactions (owned by a generation that waits)
append directly; background and manual ones place their summary as a write submission, and the stale rule
(a head reaching before the active range start) lets the later cut win when several run at once.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import TYPE_CHECKING, Any

from harness_core._inbox import Write, admit
from harness_core.context import ContextView, _arrange
from harness_core.conversation import load_context
from harness_core.documents import LiveDoc, UsageDoc
from harness_core.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    TextContent,
    ThinkingContent,
    ToolResultMessage,
    Usage,
    UserMessage,
    estimate_tokens,
    user_text,
)
from harness_core.models import ModelRef, ModelRequest
from harness_core.records import CORE_COMPACTION, EntryDraft, Task
from harness_core.tasks import Aborted, Checkpoint, Complete, Fail, TaskRuntime, define_task

if TYPE_CHECKING:
    from harness_core._tx import Tx
    from harness_core.harness import Harness

SUMMARY_SYSTEM_PROMPT = (
    "You write checkpoint summaries of a conversation between a user and an AI assistant so that the "
    "assistant can continue the work from the summary alone. Keep every fact, decision, open question, "
    "file or resource name, identifier and pending action. If the conversation starts with an earlier "
    "summary, carry its content forward. Answer with the summary only."
)
SUMMARY_INSTRUCTION = (
    "Summarize the conversation above as a structured checkpoint: Goal, Progress (done / in progress), "
    "Key decisions, Facts and identifiers, Next steps."
)


def find_cut(view: ContextView, keep_recent_tokens: int) -> int | None:
    """The first entry to keep, or None when there is nothing worth compacting."""
    start = 1 if view.head is not None else 0
    entries = view.entries[start:]
    contributions = view.contributions[start:]
    candidates: list[int] = []
    for index, messages in enumerate(contributions):
        if messages and isinstance(messages[0], (UserMessage, AssistantMessage)):
            candidates.append(index)
    if not candidates:
        return None
    total = 0
    reached: int | None = None
    for index in range(len(entries) - 1, -1, -1):
        total += sum(estimate_tokens(m) for m in contributions[index])
        if total >= keep_recent_tokens:
            reached = index
            break
    if reached is None:
        return None
    following = [c for c in candidates if c >= reached]
    cut = following[0] if following else candidates[-1]
    if not any(contributions[i] for i in range(cut)) and view.head is None:
        return None
    if cut == 0 and view.head is None:
        return None
    return entries[cut].id


def summarized_messages(view: ContextView, first_kept: int) -> list[Message]:
    start = 1 if view.head is not None else 0
    messages: list[Message] = list(view.contributions[0]) if view.head is not None else []
    for entry, contributed in zip(view.entries[start:], view.contributions[start:], strict=True):
        if entry.id >= first_kept:
            break
        messages.extend(contributed)
    return _arrange(messages)


def serialize(messages: list[Message]) -> str:
    lines: list[str] = []
    for message in messages:
        if isinstance(message, UserMessage):
            lines.append(f"[User]: {user_text(message)}")
        elif isinstance(message, AssistantMessage):
            for part in message.content:
                if isinstance(part, ThinkingContent):
                    lines.append(f"[Assistant thinking]: {part.thinking}")
                elif isinstance(part, TextContent):
                    lines.append(f"[Assistant]: {part.text}")
            calls = message.tool_calls()
            if calls:
                rendered = ", ".join(f"{c.name}({c.arguments})" for c in calls)
                lines.append(f"[Assistant tool calls]: {rendered}")
        elif isinstance(message, ToolResultMessage):
            lines.append(f"[Tool result]: {message.text()[:2000]}")
        elif isinstance(message, SystemMessage):
            continue
    return "\n".join(lines)


def wrap_summary(summary: str) -> str:
    return (
        "The conversation history before this point was compacted into the following summary:\n\n"
        f"<summary>\n{summary}\n</summary>"
    )


async def _remove_status(tx: Tx, task: Task) -> None:
    live = await tx.doc(LiveDoc, task.conversation_id)
    compactions = [c for c in live.value.get("compactions", []) if c.get("task_id") != task.id]
    if compactions:
        live.value["compactions"] = compactions
    else:
        live.value.pop("compactions", None)


async def _place(harness: Harness, tx: Tx, task: Task, summary: str, first_kept: int) -> Complete:
    reason = (task.input or {}).get("reason", "manual")
    draft = EntryDraft(
        kind=CORE_COMPACTION,
        head=first_kept,
        model=[UserMessage(content=wrap_summary(summary), timestamp=tx.now)],
        data={"reason": reason},
    )
    await _remove_status(tx, task)
    if task.owner_task_id is not None:
        entry = tx.append_entry(task.conversation_id, draft)
        return Complete({"entry_id": entry.id})
    submission = await admit(
        harness, tx, task.conversation_id, Write(entry=draft, request_id=f"compaction:{task.id}")
    )
    return Complete({"submission_id": submission.id})


def _place_commit(harness: Harness, summary: str, first_kept: int) -> Any:
    async def commit(tx: Tx, task: Task) -> Complete:
        return await _place(harness, tx, task, summary, first_kept)

    return commit


async def _select(task: Task, runtime: TaskRuntime) -> None:
    harness: Harness = runtime.harness
    agent = await harness.resolve_agent(task.conversation_id)
    info = harness.models.get_model(agent.model) if agent.model is not None else None
    if agent.model is None or info is None:

        async def no_model(tx: Tx, t: Task) -> Fail:
            await _remove_status(tx, t)
            return Fail("no model for compaction", detail={"reason": "no_model"})

        await runtime.commit(no_model)
        return
    view = await load_context(harness, task.conversation_id)
    keep = harness.settings.compaction.keep_recent_tokens
    cut = find_cut(view, keep)
    if cut is None:

        async def nothing(tx: Tx, t: Task) -> Complete:
            await _remove_status(tx, t)
            return Complete({})

        await runtime.commit(nothing)
        return
    messages = summarized_messages(view, cut)
    instructions = (task.input or {}).get("instructions")
    for before in agent.hooks("core.compaction", "before_compact"):
        try:
            decision = before(
                {
                    "reason": (task.input or {}).get("reason"),
                    "messages": messages,
                    "first_kept": cut,
                    "instructions": instructions,
                },
                runtime,
            )
            if inspect.isawaitable(decision):
                decision = await decision
        except Exception as exc:
            harness.report(exc)
            continue
        if isinstance(decision, dict) and decision.get("decline"):

            async def declined(tx: Tx, t: Task) -> Complete:
                await _remove_status(tx, t)
                return Complete({})

            await runtime.commit(declined)
            return
        if isinstance(decision, dict) and isinstance(decision.get("summary"), str):
            await runtime.commit(_place_commit(harness, str(decision["summary"]), cut))
            return
    tail = view.entries[-1].id if view.entries else cut
    reserve = harness.settings.compaction.reserve_tokens
    max_tokens = int(0.8 * reserve)
    if info.max_tokens > 0:
        max_tokens = min(max_tokens, info.max_tokens)
    await runtime.commit(
        lambda _tx, _t: Checkpoint(
            {
                "phase": "summarize",
                "attempt": 1,
                "model": {"provider": agent.model.provider, "model_id": agent.model.model_id}
                if agent.model
                else None,
                "max_tokens": max_tokens,
                "tail": tail,
                "first_kept": cut,
            }
        )
    )


async def _summarize(task: Task, runtime: TaskRuntime) -> None:
    harness: Harness = runtime.harness
    checkpoint = task.state.checkpoint or {}
    model_json = checkpoint["model"]
    ref = ModelRef(provider=model_json["provider"], model_id=model_json["model_id"])
    view = await load_context(harness, task.conversation_id, int(checkpoint["tail"]))
    first_kept = int(checkpoint["first_kept"])
    text = serialize(summarized_messages(view, first_kept))
    instructions = (task.input or {}).get("instructions")
    prompt = f"<conversation>\n{text}\n</conversation>\n\n{SUMMARY_INSTRUCTION}"
    if instructions:
        prompt += f"\n\nAdditional focus: {instructions}"
    request = ModelRequest(
        system_prompt=SUMMARY_SYSTEM_PROMPT,
        messages=[UserMessage(content=prompt)],
        max_tokens=int(checkpoint.get("max_tokens") or 0) or None,
    )
    final: AssistantMessage | None = None
    async with contextlib.aclosing(harness.models.stream(ref, request)) as stream:
        async for message in stream:
            if message.stop_reason is not None:
                final = message.model_copy(deep=True)
                break
    if final is None:
        from harness_core.messages import ErrorInfo

        final = AssistantMessage(
            stop_reason="error", error=ErrorInfo(message="stream ended early", retryable=True)
        )
    attempt = int(checkpoint.get("attempt", 1))
    summary = final.text().strip()
    usage = final.usage

    async def record(tx: Tx, t: Task) -> None:
        doc = await tx.doc(UsageDoc, t.conversation_id)
        models = doc.value.setdefault("models", {})
        key = f"{final.provider or ref.provider}/{final.model or ref.model_id}"
        models[key] = Usage.model_validate(models.get(key, {})).plus(usage).model_dump()

    if final.stop_reason == "stop" and summary and not final.tool_calls():

        async def place(tx: Tx, t: Task) -> Complete:
            await record(tx, t)
            return await _place(harness, tx, t, summary, first_kept)

        await runtime.commit(place)
        return
    retry = harness.settings.retry
    error = final.error
    if error is not None and error.retryable and retry.enabled and attempt <= retry.max_retries:
        until = harness.now() + retry.delay_ms(attempt, error.retry_after_ms)

        async def schedule(tx: Tx, t: Task) -> Checkpoint:
            await record(tx, t)
            live = await tx.doc(LiveDoc, t.conversation_id)
            for status in live.value.get("compactions", []):
                if status.get("task_id") == t.id:
                    status["attempt"] = attempt + 1
                    status["retry"] = {"at": until, "error": error.message}
            return Checkpoint({**checkpoint, "phase": "retry", "until": until})

        await runtime.commit(schedule)
        return
    detail = error.message if error is not None else f"summary ended with {final.stop_reason}"

    async def fail(tx: Tx, t: Task) -> Fail:
        await record(tx, t)
        await _remove_status(tx, t)
        return Fail(detail, detail={"reason": "model_error"})

    await runtime.commit(fail)


async def _retry(task: Task, runtime: TaskRuntime) -> None:
    checkpoint: dict[str, Any] = dict(task.state.checkpoint or {})
    await runtime.sleep(int(checkpoint["until"]))
    checkpoint.pop("until", None)
    await runtime.commit(
        lambda _tx, _t: Checkpoint(
            {**checkpoint, "phase": "summarize", "attempt": int(checkpoint["attempt"]) + 1}
        )
    )


async def _abort(task: Task, runtime: TaskRuntime) -> None:
    async def commit(tx: Tx, t: Task) -> Aborted:
        await _remove_status(tx, t)
        return Aborted(reason=t.abort_reason)

    await runtime.commit(commit)


CompactionTask = define_task(
    "core.compaction",
    phases={"select": _select, "summarize": _summarize, "retry": _retry},
    initial=lambda _input: {"phase": "select"},
    abort=_abort,
)
