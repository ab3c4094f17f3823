"""`core.generation`: one model request of a run, as a durable task.

Phases:
- `prepare`: resolve the agent, append system-prompt changes, check compaction thresholds, pin the request.
- `request`: stream the response (partials committed at most every `progress.partial_interval_ms`), then
  classify it in one commit: a tool round (tool tasks owned by this generation; wait for them), an answer
  (final boundary), a retryable error (durable backoff), a context overflow (compact, then retry once), or a
  failure. A crash mid-stream resends the same request; the committed partial is kept as an aborted entry.
- `retry`: sleep until the backoff deadline (survives restarts), then prepare again.
- `tools`: after the round, start the next sequential call, or apply the post-tools boundary and hand the
  run to a successor generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from typing import TYPE_CHECKING, Any

from harness_core._inbox import STOPPED, end_run_unanswered, final_boundary, select, settle_inputs
from harness_core._json import clean_text
from harness_core._prompt import plan_system, render_sections
from harness_core.context import ContextView, provider_messages, replay_system
from harness_core.conversation import load_context
from harness_core.documents import AgentDoc, LiveDoc, ProviderDoc, UsageDoc
from harness_core.messages import AssistantMessage, Message, Usage, estimate_tokens
from harness_core.models import ModelRef, ModelRequest
from harness_core.records import CORE_ASSISTANT, CORE_RESET, EntryDraft, Task
from harness_core.tasks import Checkpoint, Complete, Fail, TaskRuntime, Wait, define_task

if TYPE_CHECKING:
    from harness_core._tx import Tx
    from harness_core.harness import Harness


def _ref(value: dict[str, Any]) -> ModelRef:
    return ModelRef(provider=value["provider"], model_id=value["model_id"])


async def _run_inputs(tx: Tx, task: Task) -> list[int]:
    live = await tx.doc(LiveDoc, task.conversation_id)
    run = live.value.get("run")
    if run is None or run.get("task_id") != task.id:
        return []
    return [int(i) for i in run.get("inputs", [])]


async def _fail_run(harness: Harness, tx: Tx, task: Task, reason: str, detail: str | None) -> Fail:
    await end_run_unanswered(harness, tx, task.conversation_id, task.id, reason=reason, detail=detail)
    return Fail(detail or reason, detail={"reason": reason})


async def _record_usage(tx: Tx, conversation_id: int, message: AssistantMessage) -> None:
    if not message.provider and not message.model:
        return
    doc = await tx.doc(UsageDoc, conversation_id)
    models = doc.value.setdefault("models", {})
    key = f"{message.provider}/{message.model}"
    models[key] = Usage.model_validate(models.get(key, {})).plus(message.usage).model_dump()


async def convert_partial(tx: Tx, conversation_id: int) -> None:
    """A committed partial from an interrupted attempt becomes an aborted assistant entry (kept, excluded from
    later contexts)."""
    live = await tx.doc(LiveDoc, conversation_id)
    generation = live.value.get("generation") or {}
    partial = generation.get("message")
    if partial is None:
        return
    message = AssistantMessage.model_validate(partial)
    message.stop_reason = "aborted"
    tx.append_entry(conversation_id, EntryDraft(kind=CORE_ASSISTANT, model=[message]))
    await _record_usage(tx, conversation_id, message)
    generation.pop("message", None)


async def clear_partial(tx: Tx, conversation_id: int) -> None:
    """Classification supersedes the committed partial: drop it."""
    live = await tx.doc(LiveDoc, conversation_id)
    generation = live.value.get("generation")
    if isinstance(generation, dict):
        generation.pop("message", None)


# --- prepare ---------------------------------------------------------------------------------------------------


async def _prepare(task: Task, runtime: TaskRuntime) -> None:
    harness: Harness = runtime.harness
    checkpoint = task.state.checkpoint or {}
    attempt = int(checkpoint.get("attempt", 1))
    compacted = checkpoint.get("compacted")
    agent = await harness.resolve_agent(task.conversation_id)
    info = harness.models.get_model(agent.model) if agent.model is not None else None
    if agent.model is None or info is None:
        detail = "no model configured" if agent.model is None else f"unknown model {agent.model}"
        await runtime.commit(lambda tx, t: _fail_run(harness, tx, t, "no_model", detail))
        return
    if checkpoint.get("overflow") is not None:
        compaction = await harness.get_task(int(compacted)) if compacted is not None else None
        result = (
            None
            if compaction is None or compaction.state.outcome is None
            else compaction.state.outcome.result
        )
        if not (isinstance(result, dict) and result.get("entry_id")):
            overflow_text = str(checkpoint["overflow"])
            await runtime.commit(lambda tx, t: _fail_run(harness, tx, t, "model_error", overflow_text))
            return

    env = None
    try:
        env = await harness.make_env(task.conversation_id)
    except Exception as exc:
        harness.report(exc)
    sections = await render_sections(agent, task.conversation_id, env, harness.report)
    # The context is read after the awaits above and let go before the commit below: a step holding a context
    # keeps it in the context cache's use (or alive after it left), so it is held only while it is used.
    view = await load_context(harness, task.conversation_id)
    drafts = plan_system(view, agent, sections)

    settings = harness.settings
    compaction_settings = settings.compaction
    background = False
    if compaction_settings.enabled and info.context_window > 0 and compacted is None:
        from harness_core._compaction import find_cut

        tokens = _estimate(view, drafts)
        blocking_at = info.context_window - compaction_settings.reserve_tokens
        background_at = blocking_at - compaction_settings.background_tokens
        over_background = compaction_settings.background_tokens > 0 and tokens > background_at
        # Finding a cut walks the whole range: only do it once a threshold is crossed.
        if (tokens > blocking_at or over_background) and find_cut(
            view, compaction_settings.keep_recent_tokens
        ):
            if tokens > blocking_at:
                await runtime.commit(
                    lambda tx, t: _start_blocking_compaction(harness, tx, t, attempt, "threshold", None)
                )
                return
            live = await harness.snapshot(LiveDoc, task.conversation_id) or {}
            background = not live.get("compactions")

    model_json = {"provider": agent.model.provider, "model_id": agent.model.model_id}
    known_tail = max([e.id for e in view.entries] + [0])
    del view

    async def commit(tx: Tx, t: Task) -> Checkpoint:
        for draft in drafts:
            tx.append_entry(t.conversation_id, draft)
        live = await tx.doc(LiveDoc, t.conversation_id)
        if not (live.value.get("generation") or {}).get(
            "message"
        ):  # a leftover partial is converted in request
            live.value["generation"] = {"attempt": attempt}
        if background:
            compaction = await harness.create_task_in(
                tx,
                "core.compaction",
                {"reason": "threshold"},
                conversation_id=t.conversation_id,
                background=True,
            )
            live = await tx.doc(LiveDoc, t.conversation_id)
            live.value.setdefault("compactions", []).append(
                {"task_id": compaction.id, "reason": "threshold", "blocking": False, "attempt": 1}
            )
        tail = max([e.id for e in tx.appended_entries()] + [known_tail])
        return Checkpoint(
            {
                "phase": "request",
                "attempt": attempt,
                "compacted": compacted,
                "model": model_json,
                "thinking_level": agent.thinking_level,
                "stream_options": dict(settings.stream),
                "cutoff": tail,
            }
        )

    await runtime.commit(commit)


def _estimate(view: ContextView, drafts: list[EntryDraft]) -> int:
    messages = provider_messages(view.messages)
    total = 0
    for message in reversed(messages):
        if isinstance(message, AssistantMessage) and message.usage.total_tokens > 0:
            total += (
                message.usage.input
                + message.usage.output
                + message.usage.cache_read
                + message.usage.cache_write
            )
            break
        total += estimate_tokens(message)
    for draft in drafts:
        for message in draft.model or ():
            total += estimate_tokens(message)
    return total


async def _start_blocking_compaction(
    harness: Harness, tx: Tx, task: Task, attempt: int, reason: str, overflow: str | None
) -> Wait:
    compaction = await harness.create_task_in(
        tx, "core.compaction", {"reason": reason}, owner_task_id=task.id
    )
    live = await tx.doc(LiveDoc, task.conversation_id)
    live.value.setdefault("compactions", []).append(
        {"task_id": compaction.id, "reason": reason, "blocking": True, "attempt": 1}
    )
    checkpoint: dict[str, Any] = {"phase": "prepare", "attempt": attempt, "compacted": compaction.id}
    if overflow is not None:
        checkpoint["overflow"] = overflow
    return Wait(checkpoint=checkpoint, on=[compaction.id])


# --- request ---------------------------------------------------------------------------------------------------


async def _request(task: Task, runtime: TaskRuntime) -> None:
    harness: Harness = runtime.harness
    checkpoint = task.state.checkpoint or {}
    attempt = int(checkpoint.get("attempt", 1))
    ref = _ref(checkpoint["model"])

    async def begin(tx: Tx, t: Task) -> None:
        await convert_partial(tx, t.conversation_id)
        live = await tx.doc(LiveDoc, t.conversation_id)
        live.value["generation"] = {"attempt": attempt}

    live_now = await harness.snapshot(LiveDoc, task.conversation_id) or {}
    if live_now.get("generation") != {"attempt": attempt}:
        await runtime.commit(begin)

    info = harness.models.get_model(ref)
    if info is None:
        await runtime.commit(lambda tx, t: _fail_run(harness, tx, t, "no_model", f"unknown model {ref}"))
        return
    agent = await harness.resolve_agent(task.conversation_id)
    provider_doc = await harness.snapshot(ProviderDoc, task.conversation_id) or {}
    # Read last before the model call (not across the awaits above), see `_prepare`.
    view = await load_context(harness, task.conversation_id, int(checkpoint["cutoff"]))
    prompt = replay_system(view.messages)
    messages: list[Message] = provider_messages(view.messages)
    for before in agent.hooks("core.generation", "before_request"):
        try:
            replaced = before({"messages": list(messages)}, runtime)
            if inspect.isawaitable(replaced):
                replaced = await replaced
            if isinstance(replaced, dict) and isinstance(replaced.get("messages"), list):
                messages = replaced["messages"]
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            harness.report(exc)
    request = ModelRequest(
        system_prompt=prompt.system_prompt(),
        messages=messages,
        tools=prompt.tools,
        session_id=provider_doc.get("session_id") or None,
        reasoning=checkpoint.get("thinking_level") or "off",
        options=dict(checkpoint.get("stream_options") or {}),
    )
    final = await _stream(harness, runtime, task, ref, request)
    # The context was in use while the model answered from it; the commits below only need the answer.
    offered = [t.name for t in prompt.tools]
    del view, messages, request, prompt
    for observer in agent.hooks("core.generation", "after_response"):
        try:
            result = observer(final, runtime)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            harness.report(exc)
    await _classify(harness, runtime, task, final, attempt, checkpoint, offered, agent)


async def _stream(
    harness: Harness, runtime: TaskRuntime, task: Task, ref: ModelRef, request: ModelRequest
) -> AssistantMessage:
    """Stream the response, committing partials at most every `partial_interval_ms` (one in flight, trailing
    writes coalesced). Returns the final message."""
    interval = harness.settings.progress.partial_interval_ms / 1000
    latest: dict[str, Any] = {"message": None, "dirty": False}
    wake = asyncio.Event()

    async def write_partials() -> None:
        while True:
            await wake.wait()
            # Throttle on the leading edge too: the first token starts the clock, so a response that is
            # complete within the interval writes no partial at all, and later changes coalesce.
            await asyncio.sleep(interval)
            wake.clear()
            if not latest["dirty"]:
                continue
            latest["dirty"] = False
            snapshot = latest["message"]

            async def commit(tx: Tx, t: Task, snapshot: Any = snapshot) -> None:
                live = await tx.doc(LiveDoc, t.conversation_id)
                generation = live.value.setdefault("generation", {})
                generation["message"] = snapshot

            await runtime.commit(commit)

    writer = asyncio.get_running_loop().create_task(write_partials(), name=f"generation-{task.id}-partials")
    final: AssistantMessage | None = None
    try:
        async with contextlib.aclosing(harness.models.stream(ref, request)) as stream:
            async for message in stream:
                if message.stop_reason is not None:
                    final = message.model_copy(deep=True)
                    break
                if message.content:
                    latest["message"] = message.model_dump(mode="json", exclude_none=True)
                    latest["dirty"] = True
                    wake.set()
    except asyncio.CancelledError:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        raise
    except Exception as exc:  # a provider bug must not look like a crash loop: treat it as a model error
        from harness_core.messages import ErrorInfo

        final = AssistantMessage(
            provider=ref.provider,
            model=ref.model_id,
            stop_reason="error",
            error=ErrorInfo(message=clean_text(f"{type(exc).__name__}: {exc}")),  # may quote model output
        )
    # Stop the throttle before classification so no stale partial lands after the outcome.
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)
    if final is None:
        from harness_core.messages import ErrorInfo

        final = AssistantMessage(
            provider=ref.provider,
            model=ref.model_id,
            stop_reason="error",
            error=ErrorInfo(message="the model stream ended without a final message", retryable=True),
        )
    if not final.provider:
        final.provider = ref.provider
    if not final.model:
        final.model = ref.model_id
    final.timestamp = harness.now()
    return final


async def _classify(
    harness: Harness,
    runtime: TaskRuntime,
    task: Task,
    message: AssistantMessage,
    attempt: int,
    checkpoint: dict[str, Any],
    offered: list[str],
    agent: Any,
) -> None:
    settings = harness.settings
    calls = message.tool_calls()
    if message.stop_reason == "toolUse" and calls:
        await runtime.commit(lambda tx, t: _start_tool_round(harness, tx, t, message, offered))
        return
    if message.stop_reason in ("stop", "length", "toolUse"):
        continuation = None
        for on_yield in agent.hooks("core.generation", "on_yield"):
            try:
                decision = on_yield(message, runtime)
                if inspect.isawaitable(decision):
                    decision = await decision
                if (
                    isinstance(decision, dict)
                    and decision.get("continue") is not None
                    and continuation is None
                ):
                    continuation = decision["continue"]
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                harness.report(exc)

        async def answer(tx: Tx, t: Task) -> Complete:
            await clear_partial(tx, t.conversation_id)
            entry = tx.append_entry(t.conversation_id, EntryDraft(kind=CORE_ASSISTANT, model=[message]))
            await _record_usage(tx, t.conversation_id, message)
            inputs = await _run_inputs(tx, t)
            await final_boundary(
                harness, tx, t.conversation_id, settle_inputs=(inputs, entry.id), continuation=continuation
            )
            return Complete({"entry_id": entry.id})

        await runtime.commit(answer)
        return
    error = message.error
    error_text = error.message if error is not None else f"model stopped with {message.stop_reason}"
    compaction = settings.compaction
    if error is not None and error.overflow and compaction.enabled and checkpoint.get("compacted") is None:
        from harness_core._compaction import find_cut

        view = await load_context(harness, task.conversation_id, int(checkpoint["cutoff"]))
        if find_cut(view, compaction.keep_recent_tokens) is not None:

            async def overflow(tx: Tx, t: Task) -> Wait:
                await _append_failed_attempt(tx, t, message)
                live = await tx.doc(LiveDoc, t.conversation_id)
                live.value.pop("generation", None)
                return await _start_blocking_compaction(harness, tx, t, attempt, "overflow", error_text)

            await runtime.commit(overflow)
            return
    retry = settings.retry
    if error is not None and error.retryable and retry.enabled and attempt <= retry.max_retries:
        until = harness.now() + retry.delay_ms(attempt, error.retry_after_ms)

        async def schedule_retry(tx: Tx, t: Task) -> Checkpoint:
            await _append_failed_attempt(tx, t, message)
            live = await tx.doc(LiveDoc, t.conversation_id)
            live.value["generation"] = {"attempt": attempt, "retry": {"at": until, "error": error_text}}
            return Checkpoint(
                {
                    "phase": "retry",
                    "attempt": attempt,
                    "compacted": checkpoint.get("compacted"),
                    "until": until,
                }
            )

        await runtime.commit(schedule_retry)
        return

    async def fail(tx: Tx, t: Task) -> Fail:
        await _append_failed_attempt(tx, t, message)
        return await _fail_run(harness, tx, t, "model_error", error_text)

    await runtime.commit(fail)


async def _append_failed_attempt(tx: Tx, task: Task, message: AssistantMessage) -> None:
    await clear_partial(tx, task.conversation_id)
    if message.stop_reason not in ("error", "aborted"):
        message.stop_reason = "error"
    tx.append_entry(task.conversation_id, EntryDraft(kind=CORE_ASSISTANT, model=[message]))
    await _record_usage(tx, task.conversation_id, message)


def _unique_call_ids(message: AssistantMessage) -> None:
    """Calls are addressed by id (tasks, slots, results): a repeated id in one message gets a suffix."""
    seen: set[str] = set()
    for call in message.tool_calls():
        if call.id in seen:
            suffix = 2
            while f"{call.id}_{suffix}" in seen:
                suffix += 1
            call.id = f"{call.id}_{suffix}"
        seen.add(call.id)


async def _start_tool_round(
    harness: Harness, tx: Tx, task: Task, message: AssistantMessage, offered: list[str]
) -> Wait | Complete:
    await clear_partial(tx, task.conversation_id)
    _unique_call_ids(message)
    entry = tx.append_entry(task.conversation_id, EntryDraft(kind=CORE_ASSISTANT, model=[message]))
    await _record_usage(tx, task.conversation_id, message)
    agent = await harness.resolve_agent(task.conversation_id)
    sequential = harness.settings.tool_execution == "sequential" or any(
        (spec := agent.tool(call.name)) is not None and spec.sequential and call.name in offered
        for call in message.tool_calls()
    )
    from harness_core._tool_task import _result_entry

    slots: list[dict[str, Any]] = []
    tasks: list[int] = []
    pending: list[str] = []
    for call in message.tool_calls():
        if call.name not in offered:
            entry_id = _result_entry(
                tx,
                task.conversation_id,
                call.id,
                call.name,
                [],
                is_error=True,
                diagnostics=[
                    {
                        "severity": "error",
                        "message": f"Tool {call.name} is not available",
                        "code": "tool_unavailable",
                    }
                ],
            )
            slots.append({"call_id": call.id, "name": call.name, "status": "done", "entry": entry_id})
            continue
        if sequential and tasks:
            slots.append({"call_id": call.id, "name": call.name, "status": "pending"})
            pending.append(call.id)
            continue
        tool_task = await harness.create_task_in(
            tx, "core.tool", {"assistant": entry.id, "call_id": call.id}, owner_task_id=task.id
        )
        tasks.append(tool_task.id)
        slots.append({"call_id": call.id, "name": call.name, "task_id": tool_task.id, "status": "pending"})
    live = await tx.doc(LiveDoc, task.conversation_id)
    live.value["tools"] = slots
    live.value.pop("generation", None)
    return Wait(
        checkpoint={"phase": "tools", "assistant": entry.id, "tools": tasks, "pending": pending},
        on=tasks,
    )


# --- retry -----------------------------------------------------------------------------------------------------


async def _retry(task: Task, runtime: TaskRuntime) -> None:
    checkpoint = task.state.checkpoint or {}
    await runtime.sleep(int(checkpoint["until"]))
    attempt = int(checkpoint.get("attempt", 1)) + 1

    async def commit(tx: Tx, t: Task) -> Checkpoint:
        live = await tx.doc(LiveDoc, t.conversation_id)
        live.value["generation"] = {"attempt": attempt}
        return Checkpoint({"phase": "prepare", "attempt": attempt, "compacted": checkpoint.get("compacted")})

    await runtime.commit(commit)


# --- tools -----------------------------------------------------------------------------------------------------


async def _tools(task: Task, runtime: TaskRuntime) -> None:
    harness: Harness = runtime.harness
    checkpoint = task.state.checkpoint or {}
    assistant_id = int(checkpoint["assistant"])
    pending = list(checkpoint.get("pending", []))
    tool_tasks = [int(t) for t in checkpoint.get("tools", [])]
    if pending:
        next_call = pending.pop(0)

        async def next_tool(tx: Tx, t: Task) -> Wait:
            created = await harness.create_task_in(
                tx, "core.tool", {"assistant": assistant_id, "call_id": next_call}, owner_task_id=t.id
            )
            live = await tx.doc(LiveDoc, t.conversation_id)
            for slot in live.value.get("tools", []):
                if slot["call_id"] == next_call:
                    slot["task_id"] = created.id
            tasks = [*tool_tasks, created.id]
            return Wait(
                checkpoint={"phase": "tools", "assistant": assistant_id, "tools": tasks, "pending": pending},
                on=[created.id],
            )

        await runtime.commit(next_tool)
        return

    outcomes = await runtime.outcomes(tool_tasks)
    live = await harness.snapshot(LiveDoc, task.conversation_id) or {}
    slots = list(live.get("tools", []))
    result_ids = [int(s["entry"]) for s in slots if s.get("entry") is not None]
    agent = await harness.resolve_agent(task.conversation_id)
    for observer in agent.hooks("core.generation", "after_tools"):
        try:
            result = observer(assistant_id, result_ids, runtime)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            harness.report(exc)
    controls: dict[int, dict[str, Any]] = {}
    for tool_task_id, outcome in zip(tool_tasks, outcomes, strict=True):
        if (
            outcome.status == "completed"
            and isinstance(outcome.result, dict)
            and outcome.result.get("control")
        ):
            controls[tool_task_id] = outcome.result["control"]
    task_slots = [s for s in slots if s.get("task_id") is not None]
    all_terminate = (
        bool(task_slots)
        and len(task_slots) == len(slots)
        and all(controls.get(int(s["task_id"]), {}).get("terminate") for s in task_slots)
    )
    handoffs = [
        c["handoff"] for c in (controls.get(int(s["task_id"])) for s in task_slots) if c and c.get("handoff")
    ]
    add_tools = [name for c in controls.values() for name in c.get("add_tools") or []]

    async def commit(tx: Tx, t: Task) -> Complete:
        if add_tools:
            agent_doc = await tx.doc(AgentDoc, t.conversation_id)
            filt = agent_doc.value.get("tools")
            if isinstance(filt, list):
                agent_doc.value["tools"] = [*filt, *[n for n in add_tools if n not in filt]]
            elif isinstance(filt, dict):
                filt["remove"] = [n for n in filt.get("remove", []) if n not in add_tools]
        live_doc = await tx.doc(LiveDoc, t.conversation_id)
        inputs = await _run_inputs(tx, t)
        if all_terminate or handoffs:
            if handoffs:
                from harness_core.messages import UserMessage

                tx.append_entry(
                    t.conversation_id,
                    EntryDraft(
                        kind=CORE_RESET,
                        head="self",
                        model=[UserMessage(content=handoffs[-1], timestamp=tx.now)],
                    ),
                )
            await final_boundary(harness, tx, t.conversation_id, settle_inputs=(inputs, assistant_id))
            return Complete({"entry_id": assistant_id})
        live_doc.value.pop("tools", None)
        selection = await select(harness, tx, t.conversation_id, "post_tools")
        run = live_doc.value.get("run")
        if selection.reset:
            await settle_inputs(tx, inputs, reason="reset")
            live_doc.value.pop("run", None)
            if selection.users:
                from harness_core._inbox import start_run

                await start_run(harness, tx, t.conversation_id, [int(i["id"]) for i in selection.users])
            return Complete({"entry_id": assistant_id})
        successor = await harness.create_task_in(tx, "core.generation", {}, conversation_id=t.conversation_id)
        if run is not None:
            run["task_id"] = successor.id
            run["inputs"] = [*run.get("inputs", []), *[int(i["id"]) for i in selection.users]]
        return Complete({"entry_id": assistant_id})

    await runtime.commit(commit)


# --- abort -----------------------------------------------------------------------------------------------------


async def _abort(task: Task, runtime: TaskRuntime) -> None:
    from harness_core._tool_task import _result_entry
    from harness_core.tasks import Aborted

    async def commit(tx: Tx, t: Task) -> Aborted:
        await convert_partial(tx, t.conversation_id)
        live = await tx.doc(LiveDoc, t.conversation_id)
        for slot in live.value.get("tools", []):
            if slot.get("status") == "pending" and slot.get("task_id") is None:
                _result_entry(
                    tx,
                    t.conversation_id,
                    slot["call_id"],
                    slot["name"],
                    [],
                    is_error=True,
                    diagnostics=[
                        {
                            "severity": "error",
                            "message": f"Tool {slot['name']} was aborted",
                            "code": "aborted",
                        }
                    ],
                )
        # Behind a single answer an operator cancelled, the queue goes on. `Conversation.abort` (a stop)
        # withdrew the queue; what arrived since stays queued, so the stop resolves once this ends.
        await end_run_unanswered(
            runtime.harness,
            tx,
            t.conversation_id,
            t.id,
            reason="aborted",
            queue_goes_on=t.abort_reason != STOPPED,
        )
        return Aborted(reason=t.abort_reason)

    await runtime.commit(commit)


GenerationTask = define_task(
    "core.generation",
    phases={"prepare": _prepare, "request": _request, "retry": _retry, "tools": _tools},
    initial=lambda _input: {"phase": "prepare", "attempt": 1},
    abort=_abort,
)
