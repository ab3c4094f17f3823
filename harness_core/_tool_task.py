"""`core.tool`: one model tool call as a durable task.

Phases: `call` validates the arguments, runs `before_tool` hooks, commits the intent (final arguments and the
replay policy) and only then executes. `execute` is reached only by recovery after a crash mid-execution: the
call runs again with the stored arguments only if both the stored intent and the current declaration say
`replay="safe"`; otherwise the model gets an "interrupted" error result and decides.

A `before_tool` hook may detach the call (`Detach`): the call gets the hook's text as its one tool result at
once, so the round and the run's turn end (approval gates: a pending gate never blocks its conversation). The
hook's own durable task runs the call later, once, with `run_detached_tool` under the same rules (intent
committed before execute; an unsafe call interrupted by a crash is reported, never run twice) and commits its
outcome as a separate entry.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness_core._json import clean_json, clean_text
from harness_core.documents import LiveDoc, UsageDoc
from harness_core.errors import StrictJsonError
from harness_core.messages import ImageContent, TextContent, ToolResultMessage, Usage
from harness_core.models._json import argument_problem
from harness_core.records import CORE_TOOL_RESULT, EntryDraft, Task
from harness_core.tasks import Aborted, Checkpoint, Complete, Fail, TaskRuntime, Wait, define_task
from harness_core.tools import (
    Block,
    Defer,
    Detach,
    OutputLimits,
    Rewrite,
    ToolApi,
    ToolCallInfo,
    ToolControl,
    ToolHookApi,
    ToolResult,
    ToolSpec,
)

if TYPE_CHECKING:
    from harness_core._tx import Tx
    from harness_core.harness import Harness


def _bound(text: str, limits: OutputLimits) -> tuple[str, int, int]:
    """Keep whole lines within the limits (head or tail); returns (text, dropped lines, dropped bytes).

    Tool output is text from outside: control characters go, unpaired surrogates become U+FFFD (after joining
    the chunks, so a pair split across two `output()` calls stays one character)."""
    text = "".join(ch for ch in clean_text(text) if ch in "\t\n" or ch >= " " or ord(ch) > 127)
    lines = text.splitlines(keepends=True)
    keep = lines if limits.retain == "head" else list(reversed(lines))
    kept: list[str] = []
    size = 0
    for line in keep:
        encoded = len(line.encode())
        if len(kept) >= limits.max_lines or size + encoded > limits.max_bytes:
            if not kept and encoded > limits.max_bytes:
                cut = line.encode()[: limits.max_bytes].decode(errors="ignore")
                kept.append(cut)
                size += len(cut.encode())
            break
        kept.append(line)
        size += encoded
    if limits.retain == "tail":
        kept.reverse()
    out = "".join(kept)
    return out, max(0, len(lines) - len(kept)), max(0, len(text.encode()) - len(out.encode()))


class _Output:
    """Invocation-owned output buffer with throttled commits into the tool's slot."""

    def __init__(self, limits: OutputLimits) -> None:
        self.limits = limits
        self.chunks: list[str] = []
        self.size = 0
        self.dropped_lines = 0  # already dropped while compacting the buffer
        self.dropped_bytes = 0
        self.dirty = asyncio.Event()

    def append(self, text: str) -> None:
        self.chunks.append(text)
        self.size += len(text)
        if self.size > 4 * self.limits.max_bytes:  # keep memory bounded for chatty tools
            joined, lines, size = _bound("".join(self.chunks), self.limits)
            self.dropped_lines += lines
            self.dropped_bytes += size
            self.chunks = [joined]
            self.size = len(joined)
        self.dirty.set()

    def retained(self) -> str:
        return _bound("".join(self.chunks), self.limits)[0]

    def bounded(self) -> tuple[str, int, int]:
        text, lines, size = _bound("".join(self.chunks), self.limits)
        return text, lines + self.dropped_lines, size + self.dropped_bytes


def _result_entry(
    tx: Tx,
    conversation_id: int,
    call_id: str,
    tool_name: str,
    content: list[TextContent | ImageContent],
    *,
    is_error: bool,
    details: Any = None,
    usage: Usage | None = None,
    duration_ms: int | None = None,
    diagnostics: list[dict[str, Any]] | None = None,
) -> int:
    # Messages quote exceptions, which may quote outside text: made valid, so the result is always storable.
    diagnostics = [{**d, "message": clean_text(str(d["message"]))} for d in diagnostics or []]
    if diagnostics:
        block = "\n".join(f"[{d['severity']}] {d['message']}" for d in diagnostics)
        content = [*content, TextContent(text=f"<harness>\n{block}\n</harness>")]
    message = ToolResultMessage(
        tool_call_id=call_id,
        tool_name=tool_name,
        content=content,
        details=details,
        usage=usage,
        is_error=is_error,
        duration_ms=duration_ms,
        timestamp=tx.now,
    )
    entry = tx.append_entry(
        conversation_id, EntryDraft(kind=CORE_TOOL_RESULT, model=[message], data={"diagnostics": diagnostics})
    )
    return entry.id


async def _set_slot(tx: Tx, conversation_id: int, call_id: str, **changes: Any) -> None:
    live = await tx.doc(LiveDoc, conversation_id)
    for slot in live.value.get("tools", []):
        if slot["call_id"] == call_id:
            for key, value in changes.items():
                if value is None:
                    slot.pop(key, None)
                else:
                    slot[key] = value


async def _slot(harness: Harness, conversation_id: int, call_id: str) -> dict[str, Any]:
    live = await harness.snapshot(LiveDoc, conversation_id) or {}
    for slot in live.get("tools", []):
        if slot["call_id"] == call_id:
            return dict(slot)
    return {}


async def _call_of(harness: Harness, task: Task) -> tuple[str, dict[str, Any], int]:
    name, arguments, assistant_id, _raw = await _call_details(harness, task)
    return name, arguments, assistant_id


async def _call_details(harness: Harness, task: Task) -> tuple[str, dict[str, Any], int, str | None]:
    """The call as the model sent it. `raw` is set when its argument JSON did not parse (providers keep the
    raw text in `partial_json` of a finished call)."""
    assistant_id = int(task.input["assistant"])
    call_id = str(task.input["call_id"])
    entry = harness.context_cache.entry(task.conversation_id, assistant_id)
    if entry is None:  # not in the cached active range: read it
        entry = await harness.session.storage.entry(assistant_id)
    if entry is None or not entry.model:
        raise RuntimeError(f"tool task {task.id}: assistant entry {assistant_id} is missing")
    for message in entry.model:
        if message.role == "assistant":
            for call in message.tool_calls():
                if call.id == call_id:
                    # A deep copy: the entry may be the context cache's, shared with every later context, and
                    # the tool, its hooks and its validation may edit nested arguments in place.
                    return call.name, copy.deepcopy(call.arguments), assistant_id, call.partial_json
    raise RuntimeError(f"tool task {task.id}: call {call_id} not found in entry {assistant_id}")


def _as_result(name: str, raw: Any) -> ToolResult:
    """What a tool's execute returned, as a result; anything but a str or a ToolResult is refused (its repr
    would be stored instead of what the tool meant)."""
    if isinstance(raw, str):
        return ToolResult(content=raw)
    if isinstance(raw, ToolResult):
        return raw
    raise StrictJsonError(
        f"tool {name} returned {type(raw).__name__}; return a str or a ToolResult "
        "(structured data goes in ToolResult.details)"
    )


def _checked_details(name: str, details: Any) -> Any:
    """A result's details: tool output, so strings are made valid; otherwise strict JSON (StrictJsonError)."""
    return None if details is None else clean_json(details, f"details of tool {name}")


def _defer_commit(until: int | None) -> Any:
    def commit(_tx: Tx, _task: Task) -> Wait:
        return Wait(checkpoint={"phase": "call"}, on=[], deadline=until)

    return commit


def _error_transition(outcome: str, entry_id: int, message: str) -> Complete | Fail:
    if outcome == "complete":
        return Complete({"entry_id": entry_id})
    return Fail(message, result={"entry_id": entry_id})


async def _finish_with_error(
    runtime: TaskRuntime,
    task: Task,
    name: str,
    code: str,
    message: str,
    *,
    outcome: str = "complete",
    output: str = "",
    details: Any = None,
) -> None:
    call_id = str(task.input["call_id"])
    diagnostics = [{"severity": "error", "message": message, "code": code}]
    content: list[TextContent | ImageContent] = [TextContent(text=output)] if output else []

    async def commit(tx: Tx, _task: Task) -> Complete | Fail:
        entry_id = _result_entry(
            tx,
            task.conversation_id,
            call_id,
            name,
            content,
            is_error=True,
            details=details,
            diagnostics=diagnostics,
        )
        await _set_slot(
            tx, task.conversation_id, call_id, status="done", entry=entry_id, output=None, details=None
        )
        return _error_transition(outcome, entry_id, message)

    await runtime.commit(commit)


async def _finish_detached(runtime: TaskRuntime, task: Task, name: str, decision: Detach) -> None:
    """The call is answered now with the hook's text (not an error), so the round and the run's turn can end;
    the hook's own durable task runs it later (see `Detach`)."""
    call_id = str(task.input["call_id"])

    async def commit(tx: Tx, _task: Task) -> Complete:
        entry_id = _result_entry(
            tx,
            task.conversation_id,
            call_id,
            name,
            [TextContent(text=decision.result)],
            is_error=False,
            details=decision.details,
        )
        await _set_slot(
            tx, task.conversation_id, call_id, status="done", entry=entry_id, output=None, details=None
        )
        return Complete({"entry_id": entry_id, "detached": True})

    await runtime.commit(commit)


def detached_intent(call: ToolCallInfo, *, task_id: int) -> dict[str, Any]:
    """What a detached call's owner stores before it runs the call: the final arguments and the replay policy
    the tool declares now (with the call's identity). Commit it in the owner's checkpoint *before*
    `run_detached_tool(..., recovering=False)`, exactly as `core.tool` commits its intent before execute."""
    return {
        "tool": call.name,
        "arguments": copy.deepcopy(call.arguments),
        "replay": call.spec.replay if call.spec is not None else "unsafe",
        "call_id": call.call_id,
        "assistant": call.assistant_entry_id,
        "task_id": task_id,
    }


async def run_detached_tool(runtime: TaskRuntime, intent: dict[str, Any], *, recovering: bool) -> ToolResult:
    """Run a call that a `before_tool` hook detached (`Detach`), inside its owner task, once.

    `intent` comes from `detached_intent` and must already be committed in the owner's checkpoint. With
    `recovering=True` (the owner's checkpoint says it was executing when the process died) the call runs
    again only if the stored intent and the tool's current declaration both say `replay="safe"`; otherwise
    nothing runs and the result is the "interrupted and may have partially run" error, as for `core.tool`.
    The tool gets the same `ToolApi` as in a turn (`task_id` is the original call's task) and its
    `after_tool` hooks run. Nothing is committed here: the owner commits the returned result as its outcome.
    """
    harness: Harness = runtime.harness
    name = str(intent["tool"])
    agent = await harness.resolve_agent(runtime.conversation_id)
    spec = agent.tool(name)
    if spec is None:
        return ToolResult(content=f"Tool {name} is not available", is_error=True)
    if recovering and not (intent.get("replay") == "safe" and spec.replay == "safe"):
        return ToolResult(content=f"Tool {name} was interrupted and may have partially run", is_error=True)
    try:
        arguments = spec.validate(copy.deepcopy(dict(intent.get("arguments") or {})))
    except ValueError as exc:
        return ToolResult(content=f"invalid arguments for {name}: {exc}", is_error=True)
    done = await _invoke(
        runtime,
        spec,
        arguments,
        int(intent.get("assistant", 0)),
        call_id=str(intent["call_id"]),
        task_id=int(intent["task_id"]),
        stream_to_slot=False,
    )
    content = list(done.content)
    if done.error is not None:
        content.append(TextContent(text=f"{type(done.error).__name__}: {done.error}"))
    if done.timed_out is not None:
        content.append(TextContent(text=done.timed_out))
    if done.invalid is not None:
        content.append(TextContent(text=str(done.invalid)))
    return ToolResult(content=content, is_error=done.is_error, details=done.details, usage=done.usage)


async def _call_phase(task: Task, runtime: TaskRuntime) -> None:
    harness: Harness = runtime.harness
    name, raw_arguments, assistant_id, unparsed = await _call_details(harness, task)
    agent = await harness.resolve_agent(task.conversation_id)
    spec = agent.tool(name)
    if spec is None:
        await _finish_with_error(runtime, task, name, "tool_unavailable", f"Tool {name} is not available")
        return
    if unparsed is not None:
        message = f"invalid arguments for {name}: {argument_problem(unparsed)}: {unparsed[:500]}"
        await _finish_with_error(runtime, task, name, "invalid_arguments", message)
        return
    try:
        arguments = spec.validate(raw_arguments)
    except ValueError as exc:
        await _finish_with_error(runtime, task, name, "invalid_arguments", str(exc))
        return
    hook_api = ToolHookApi(harness, runtime)
    for before in agent.hooks("core.tool", "before_tool"):
        info = ToolCallInfo(
            call_id=str(task.input["call_id"]),
            name=name,
            arguments=dict(arguments),
            spec=spec,
            assistant_entry_id=assistant_id,
        )
        try:
            decision = before(info, hook_api)
            if inspect.isawaitable(decision):
                decision = await decision
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await _finish_with_error(runtime, task, name, "blocked", f"Blocked: {exc}")
            return
        if isinstance(decision, Block):
            await _finish_with_error(runtime, task, name, "blocked", decision.reason)
            return
        if isinstance(decision, Defer):
            await runtime.commit(_defer_commit(decision.until))
            return
        if isinstance(decision, Detach):
            await _finish_detached(runtime, task, name, decision)
            return
        if isinstance(decision, Rewrite):
            try:
                arguments = spec.validate(decision.arguments)
            except ValueError as exc:
                await _finish_with_error(runtime, task, name, "invalid_arguments", str(exc))
                return
    call_id = str(task.input["call_id"])

    async def intent(tx: Tx, _task: Task) -> Checkpoint:
        await _set_slot(tx, task.conversation_id, call_id, status="running", arguments=arguments)
        return Checkpoint({"phase": "execute", "arguments": arguments, "replay": spec.replay})

    await runtime.commit(intent)
    await _execute(task, runtime, spec, arguments, assistant_id)


async def _execute_phase(task: Task, runtime: TaskRuntime) -> None:
    """Recovery: the process died while this call was executing."""
    harness: Harness = runtime.harness
    name, _raw, assistant_id = await _call_of(harness, task)
    checkpoint = task.state.checkpoint or {}
    agent = await harness.resolve_agent(task.conversation_id)
    spec = agent.tool(name)
    call_id = str(task.input["call_id"])
    if checkpoint.get("replay") == "safe" and spec is not None and spec.replay == "safe":

        async def clear(tx: Tx, _task: Task) -> None:
            await _set_slot(tx, task.conversation_id, call_id, output=None, details=None)

        await runtime.commit(clear)
        await _execute(task, runtime, spec, dict(checkpoint.get("arguments", {})), assistant_id)
        return
    slot = await _slot(harness, task.conversation_id, call_id)
    await _finish_with_error(
        runtime,
        task,
        name,
        "interrupted",
        f"Tool {name} was interrupted and may have partially run",
        outcome="fail",
        output=str(slot.get("output", "")),
        details=slot.get("details"),
    )


@dataclass
class _Invoked:
    """One finished execution, bounded and ready to commit."""

    content: list[TextContent | ImageContent]
    is_error: bool
    error: Exception | None
    details: Any
    usage: Usage | None
    duration_ms: int
    diagnostics: list[dict[str, Any]]
    control: ToolControl | None
    timed_out: str | None = None  # past its time limit: the task fails with this message
    invalid: StrictJsonError | None = None  # the tool's result was not strict JSON: the task fails with it


async def _execute(
    task: Task, runtime: TaskRuntime, spec: ToolSpec, arguments: dict[str, Any], assistant_id: int
) -> None:
    call_id = str(task.input["call_id"])
    done = await _invoke(
        runtime, spec, arguments, assistant_id, call_id=call_id, task_id=task.id, stream_to_slot=True
    )
    await _commit_result(runtime, task.conversation_id, call_id, spec.name, done)


async def _invoke(
    runtime: TaskRuntime,
    spec: ToolSpec,
    arguments: dict[str, Any],
    assistant_id: int,
    *,
    call_id: str,
    task_id: int,
    stream_to_slot: bool,
) -> _Invoked:
    """Run the tool and its `after_tool` hooks; bound the result. Commits only streamed output (into the
    call's live slot, when `stream_to_slot`)."""
    harness: Harness = runtime.harness
    conversation_id = runtime.conversation_id
    output = _Output(spec.output_limits)
    details_box: list[Any] = []
    interval = harness.settings.progress.output_interval_ms / 1000

    async def flush_output() -> None:
        while True:
            await output.dirty.wait()
            output.dirty.clear()
            text = output.retained()

            async def write(tx: Tx, _task: Task, text: str = text) -> None:
                await _set_slot(tx, conversation_id, call_id, output=text)

            await runtime.commit(write)
            await asyncio.sleep(interval)

    async def on_details(value: Any) -> None:
        # Checked here, so a tool passing something that is not strict JSON gets the error at its call.
        value = clean_json(value, f"details of tool {spec.name}")
        details_box[:] = [value]
        if not stream_to_slot:
            return

        async def write(tx: Tx, _task: Task) -> None:
            await _set_slot(tx, conversation_id, call_id, details=value)

        await runtime.commit(write)

    limit = harness.settings.tools.time_limit(spec.name, spec.timeout)
    api = ToolApi(
        harness=harness,
        runtime=runtime,
        task_id=task_id,
        conversation_id=conversation_id,
        call_id=call_id,
        tool_name=spec.name,
        env=None,
        on_output=output.append,
        on_details=on_details,
        time_limit=limit,
    )
    # A storage shared by processes (PostgreSQL) may have passed to another owner since the intent commit: no
    # tool effect unless this process still safely owns it (raises LeaseLost; the task is then the new owner's).
    check_owner = getattr(runtime.harness.session.storage, "check_owner", None)
    if check_owner is not None:
        check_owner()
    started = time.monotonic()
    error: Exception | None = None
    result: ToolResult
    flusher: asyncio.Task[None] | None = None
    if stream_to_slot:
        flusher = asyncio.get_running_loop().create_task(flush_output(), name=f"tool-{task_id}-output")
    run = harness.tool_runs.begin(task_id, spec.name)
    deadline = asyncio.timeout(limit)
    try:
        api.env = await runtime.env()
        async with deadline:
            raw = await spec.execute(arguments, api)
        result = _as_result(spec.name, raw)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if not deadline.expired():
            error = exc
        result = ToolResult(content=None, is_error=True)
    finally:
        harness.tool_runs.end(run)
        if flusher is not None:
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
    duration_ms = int((time.monotonic() - started) * 1000)
    timed_out = _timed_out_message(spec, limit) if limit is not None and deadline.expired() else None
    if timed_out is not None:  # what the tool returned after its cancellation (if it did) does not count
        result = ToolResult(content=None, is_error=True)

    content: list[TextContent | ImageContent]
    diagnostics: list[dict[str, Any]] = []
    retained, dropped_lines, dropped_bytes = output.bounded()
    if result.content is None:
        content = [TextContent(text=retained)] if retained else []
        if dropped_lines or dropped_bytes:
            diagnostics.append(
                {
                    "severity": "warn",
                    "message": f"Output truncated: {dropped_lines} lines, {dropped_bytes} bytes dropped",
                    "code": "truncated",
                }
            )
    elif isinstance(result.content, str):
        content = [TextContent(text=result.content)]
    else:
        content = list(result.content)
    if error is not None:
        diagnostics.append(
            {"severity": "error", "message": f"{type(error).__name__}: {error}", "code": "tool_error"}
        )
    if timed_out is not None:
        diagnostics.append({"severity": "error", "message": timed_out, "code": "timeout"})
    details = result.details if result.details is not None else (details_box[0] if details_box else None)
    result = ToolResult(
        content=content, is_error=result.is_error, details=details, usage=result.usage, control=result.control
    )
    agent = await harness.resolve_agent(conversation_id)
    info = ToolCallInfo(
        call_id=call_id, name=spec.name, arguments=arguments, spec=spec, assistant_entry_id=assistant_id
    )
    for after in agent.hooks("core.tool", "after_tool"):
        try:
            replaced = after(info, result, ToolHookApi(harness, runtime))
            if inspect.isawaitable(replaced):
                replaced = await replaced
            if isinstance(replaced, ToolResult):
                result = replaced
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            harness.report(exc)
    invalid: StrictJsonError | None = None
    try:
        result_details = _checked_details(spec.name, result.details)
    except StrictJsonError as exc:
        invalid, result_details = exc, None
        diagnostics.append({"severity": "error", "message": str(exc), "code": "invalid_details"})
    bounded: list[TextContent | ImageContent] = []
    content_items = (
        result.content if isinstance(result.content, list) else [TextContent(text=result.content or "")]
    )
    for item in content_items:
        if isinstance(item, TextContent):
            text, lines, size = _bound(item.text, spec.output_limits)
            if lines or size:
                diagnostics.append(
                    {
                        "severity": "warn",
                        "message": f"Output truncated: {lines} lines, {size} bytes dropped",
                        "code": "truncated",
                    }
                )
            bounded.append(TextContent(text=text))
        elif isinstance(item, ImageContent):
            bounded.append(ImageContent(data=clean_text(item.data), mime_type=clean_text(item.mime_type)))
        else:
            invalid = StrictJsonError(
                f"tool {spec.name} returned a content item of type {type(item).__name__}; "
                "content is a str or a list of TextContent and ImageContent"
            )
            diagnostics.append({"severity": "error", "message": str(invalid), "code": "invalid_content"})
    return _Invoked(
        content=bounded,
        is_error=result.is_error or error is not None or invalid is not None,
        error=error,
        details=result_details,
        usage=result.usage,
        duration_ms=duration_ms,
        diagnostics=diagnostics,
        control=result.control,
        timed_out=timed_out,
        invalid=invalid,
    )


async def _add_usage(tx: Tx, conversation_id: int, tool_name: str, usage: Usage | None) -> None:
    if usage is not None:
        doc = await tx.doc(UsageDoc, conversation_id)
        tools = doc.value.setdefault("tools", {})
        tools[tool_name] = Usage.model_validate(tools.get(tool_name, {})).plus(usage).model_dump()


async def _commit_result(
    runtime: TaskRuntime, conversation_id: int, call_id: str, tool_name: str, done: _Invoked
) -> None:
    error, control, timed_out, invalid = done.error, done.control, done.timed_out, done.invalid

    async def commit(tx: Tx, _task: Task) -> Complete | Fail:
        entry_id = _result_entry(
            tx,
            conversation_id,
            call_id,
            tool_name,
            done.content,
            is_error=done.is_error,
            details=done.details,
            usage=done.usage,
            duration_ms=done.duration_ms,
            diagnostics=done.diagnostics,
        )
        await _set_slot(
            tx, conversation_id, call_id, status="done", entry=entry_id, output=None, details=None
        )
        await _add_usage(tx, conversation_id, tool_name, done.usage)
        if error is not None:
            return Fail(f"{type(error).__name__}: {error}", result={"entry_id": entry_id})
        if timed_out is not None:
            return Fail(timed_out, result={"entry_id": entry_id})
        if invalid is not None:
            return Fail(str(invalid), result={"entry_id": entry_id})
        control_json = None
        if control is not None:
            control_json = {
                "terminate": control.terminate,
                "handoff": control.handoff,
                "add_tools": control.add_tools,
            }
        return Complete({"entry_id": entry_id, "control": control_json})

    await runtime.commit(commit)


def _timed_out_message(spec: ToolSpec, limit: float) -> str:
    """The error a tool past its time limit gets. An unsafe tool may have done part of its effect: the model
    is told so, as after an interruption, and decides (check before repeating)."""
    message = f"Tool {spec.name} did not finish within its time limit of {limit:g} s and was stopped"
    if spec.replay != "safe":
        return message + "; it may have partially run"
    return message


async def _abort(task: Task, runtime: TaskRuntime) -> None:
    harness: Harness = runtime.harness
    try:
        name, arguments, assistant_id = await _call_of(harness, task)
    except RuntimeError:
        await runtime.commit(lambda _tx, _t: Aborted(reason=task.abort_reason))
        return
    call_id = str(task.input["call_id"])
    slot = await _slot(harness, task.conversation_id, call_id)
    output = str(slot.get("output", ""))
    result = ToolResult(
        content=[TextContent(text=output)] if output else [], is_error=True, details=slot.get("details")
    )
    agent = await harness.resolve_agent(task.conversation_id)
    spec = agent.tool(name)
    info = ToolCallInfo(
        call_id=call_id, name=name, arguments=arguments, spec=spec, assistant_entry_id=assistant_id
    )
    for on_abort in agent.hooks("core.tool", "on_abort"):
        try:
            replaced = on_abort(info, result, ToolHookApi(harness, runtime))
            if inspect.isawaitable(replaced):
                replaced = await replaced
            if isinstance(replaced, ToolResult):
                result = replaced
        except Exception as exc:
            harness.report(exc)
    content = [
        TextContent(text=clean_text(c.text)) if isinstance(c, TextContent) else c
        for c in (
            result.content if isinstance(result.content, list) else [TextContent(text=result.content or "")]
        )
        if isinstance(c, (TextContent, ImageContent))
    ]
    diagnostics = [{"severity": "error", "message": f"Tool {name} was aborted", "code": "aborted"}]
    try:
        abort_details = _checked_details(name, result.details)
    except StrictJsonError as exc:
        abort_details = None
        diagnostics.append({"severity": "error", "message": str(exc), "code": "invalid_details"})

    async def commit(tx: Tx, _task: Task) -> Aborted:
        entry_id = _result_entry(
            tx,
            task.conversation_id,
            call_id,
            name,
            [c for c in content if not (isinstance(c, TextContent) and not c.text)],
            is_error=True,
            details=abort_details,
            diagnostics=diagnostics,
        )
        await _set_slot(
            tx, task.conversation_id, call_id, status="done", entry=entry_id, output=None, details=None
        )
        return Aborted(reason=task.abort_reason, result={"entry_id": entry_id})

    await runtime.commit(commit)


ToolTask = define_task(
    "core.tool",
    phases={"call": _call_phase, "execute": _execute_phase},
    initial=lambda _input: {"phase": "call"},
    abort=_abort,
)
