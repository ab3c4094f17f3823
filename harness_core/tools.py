"""Tools: declared with `@tool`, executed as durable `core.tool` tasks.

The decorator reads the function: its name is the tool name, its docstring the description, its type hints the
argument schema (validated and coerced by pydantic). A parameter annotated `ToolApi` receives the execution API
instead of a model argument. Return a `str` or a `ToolResult`; anything else fails the call (the model gets an
error result). Output and result text are tool output, text from outside: unpaired surrogates become U+FFFD.
`ToolResult.details` (and `api.details()`) must be strict JSON (DESIGN.md §2.3; its strings are cleaned the same
way): details that are not fail the call with an error result naming the path.

Replay: after a crash inside `execute`, a tool runs again only if it was declared `replay="safe"` both when its
intent was committed and now. Everything else gets an "interrupted" error result and the model decides. A
safe tool with external effects still needs an idempotency key of its own (derive it from `api.task_id`).

Time limit: every execution runs under one (`@tool(timeout=...)` seconds, overridden by the host through
`HarnessSettings.tools`; 60 s by default). Past it the tool is cancelled and the model gets an error result
(for a replay-unsafe tool: "may have partially run"). So a tool must never block the event loop: no blocking
I/O, `time.sleep` or long CPU work in `async def` code (use `asyncio.to_thread` for short blocking calls, and
in a thread check a stop flag so the work ends when the tool is cancelled), and it must let `CancelledError`
propagate. A loop blocked anyway is reported by the harness's lag watchdog (a WARNING naming the tool).
`api.time_limit` tells a tool its limit, e.g. to return partial results before it.
A call a hook detached (`Detach`, e.g. behind an approval gate) runs later, in its owner's task, with the same
`ToolApi` (`task_id` is still the call's own task) and the same replay rule; only the time differs.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from harness_core.errors import StrictJsonError
from harness_core.messages import ImageContent, TextContent, ToolDeclaration, Usage

if TYPE_CHECKING:
    from harness_core._tx import Tx
    from harness_core.conversation import ConversationHandle
    from harness_core.records import Task

Replay = Literal["safe", "unsafe"]


@dataclass
class ToolControl:
    terminate: bool = False  # end the run after this round without another model request
    handoff: str | None = None  # reset the context to this text and end the run
    add_tools: list[str] = field(default_factory=list)


@dataclass
class ToolResult:
    content: str | list[TextContent | ImageContent] | None = None
    is_error: bool = False
    details: Any = None
    usage: Usage | None = None
    control: ToolControl | None = None


@dataclass(frozen=True)
class OutputLimits:
    max_bytes: int = 51_200
    max_lines: int = 2_000
    retain: Literal["head", "tail"] = "head"


async def commit_returning(runtime: Any, fn: Callable[[Tx, Task], Any]) -> Any:
    """A task-runtime commit that leaves the task's state alone and returns what `fn` returned."""
    box: list[Any] = []

    async def wrapped(tx: Tx, task: Task) -> None:
        result = fn(tx, task)
        if inspect.isawaitable(result):
            result = await result
        box.append(result)

    await runtime.commit(wrapped)
    return box[0] if box else None


class ToolApi:
    """What a running tool gets. Bound to one tool task invocation."""

    def __init__(
        self,
        *,
        harness: Any,
        runtime: Any,
        task_id: int,
        conversation_id: int,
        call_id: str,
        tool_name: str,
        env: Any,
        on_output: Callable[[str], None],
        on_details: Callable[[Any], Awaitable[None]],
        time_limit: float | None = None,
    ) -> None:
        self.harness = harness
        self.time_limit = time_limit  # seconds this execution may take (None: no limit); see the module doc
        self._runtime = runtime
        self.task_id = task_id
        self.conversation_id = conversation_id
        self.call_id = call_id
        self.tool_name = tool_name
        self.env = env
        self._on_output = on_output
        self._on_details = on_details

    def output(self, text: str) -> None:
        """Stream output; it is committed (throttled) so a crash keeps what was shown."""
        self._on_output(text)

    async def details(self, value: Any) -> None:
        """Replace the running details (any JSON); the last value becomes the result's details."""
        await self._on_details(value)

    async def memo(self, name: str, *candidate: Any) -> Any:
        """`memo(name, candidate)`: first writer wins, stored on the tool task (survives crashes, ends with the
        task); returns the stored value. `memo(name)` reads it (None when absent)."""
        return await self._runtime.memo(name, *candidate)

    async def commit(self, fn: Callable[[Tx, Task], Any]) -> Any:
        """A commit on behalf of this tool task; returns what `fn` returns (state is left unchanged)."""
        return await commit_returning(self._runtime, fn)

    async def conversation(self, conversation_id: int) -> ConversationHandle | None:
        handle: ConversationHandle | None = await self.harness.conversation(conversation_id)
        return handle

    async def create_task(self, kind: str, input: Any = None, *, background: bool = False) -> int:
        """Create a task owned by this tool task (or, with background=True, by its conversation)."""

        async def create(tx: Tx, _task: Task) -> int:
            record = await self.harness.create_task_in(
                tx,
                kind,
                input,
                owner_task_id=None if background else self.task_id,
                conversation_id=self.conversation_id,
                background=background,
            )
            return int(record.id)

        created: int = await self.commit(create)
        return created

    async def wait_for_task(self, task_id: int) -> Task:
        task: Task = await self.harness.wait_for_task(task_id)
        return task


ToolFunction = Callable[..., Any]


@dataclass(frozen=True, eq=False)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]
    execute: Callable[[dict[str, Any], ToolApi], Awaitable[str | ToolResult]]
    replay: Replay = "unsafe"
    sequential: bool = False
    args_model: type[BaseModel] | None = None
    output_limits: OutputLimits = field(default_factory=OutputLimits)
    function: ToolFunction | None = None
    timeout: float | None = None  # seconds; None: the host's default (HarnessSettings.tools)

    def declaration(self) -> ToolDeclaration:
        return ToolDeclaration(name=self.name, description=self.description, parameters=self.parameters)

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Validate and coerce model-given arguments; raises ValueError with a readable message."""
        if not isinstance(arguments, dict):
            raise ValueError(f"arguments must be a JSON object, got {type(arguments).__name__}")
        if self.args_model is None:
            return dict(arguments)
        try:
            model = self.args_model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}" for err in exc.errors()
            )
            raise ValueError(f"invalid arguments for {self.name}: {problems}") from None
        return model.model_dump(mode="json")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.function is None:
            raise TypeError(f"tool {self.name} has no Python function to call")
        return self.function(*args, **kwargs)


@overload
def tool(fn: ToolFunction, /) -> ToolSpec: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    replay: Replay = "unsafe",
    sequential: bool = False,
    output_limits: OutputLimits | None = None,
    timeout: float | None = None,
) -> Callable[[ToolFunction], ToolSpec]: ...


def tool(
    fn: ToolFunction | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    replay: Replay = "unsafe",
    sequential: bool = False,
    output_limits: OutputLimits | None = None,
    timeout: float | None = None,
) -> ToolSpec | Callable[[ToolFunction], ToolSpec]:
    """Declare a tool: `@tool`, `@tool()` or `@tool(replay="safe", name=..., description=...)`.

    `timeout`: the time limit of one execution in seconds, when the host's default (60 s) does not suit the
    tool; the host can still override it per tool name."""

    def build(function: ToolFunction) -> ToolSpec:
        return _build_tool(
            function, name, description, replay, sequential, output_limits or OutputLimits(), timeout
        )

    if fn is not None:
        return build(fn)
    return build


def _build_tool(
    function: ToolFunction,
    name: str | None,
    description: str | None,
    replay: Replay,
    sequential: bool,
    output_limits: OutputLimits,
    timeout: float | None = None,
) -> ToolSpec:
    if replay not in ("safe", "unsafe"):
        raise ValueError(f"replay must be 'safe' or 'unsafe', got {replay!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds (or None), got {timeout!r}")
    tool_name = name or function.__name__
    signature = inspect.signature(function)
    hints = get_type_hints(function)
    fields: dict[str, Any] = {}
    api_param: str | None = None
    for param in signature.parameters.values():
        annotation = hints.get(param.name, Any)
        if annotation is ToolApi or ToolApi in get_args(annotation):
            api_param = param.name
            continue
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f"tool {tool_name}: *args/**kwargs cannot be described to a model")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    args_model = create_model(f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    schema = args_model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    doc = inspect.getdoc(function) or ""
    is_async = inspect.iscoroutinefunction(function)

    async def execute(arguments: dict[str, Any], api: ToolApi) -> str | ToolResult:
        kwargs = dict(arguments)
        if api_param is not None:
            kwargs[api_param] = api
        result = function(**kwargs)
        if is_async or inspect.isawaitable(result):
            result = await result
        if isinstance(result, (str, ToolResult)):
            return result
        # Storing repr() of whatever came back would be silent coercion: the call fails and the model is told.
        raise StrictJsonError(
            f"tool {tool_name} returned {type(result).__name__}; return a str or a ToolResult "
            "(structured data goes in ToolResult.details)"
        )

    return ToolSpec(
        name=tool_name,
        description=description if description is not None else doc,
        parameters=schema,
        execute=execute,
        replay=replay,
        sequential=sequential,
        args_model=args_model,
        output_limits=output_limits,
        function=function,
        timeout=timeout,
    )


# --- hook decisions (before_tool) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """Do not run the call; the model gets a `blocked` error result with this reason."""

    reason: str


@dataclass(frozen=True)
class Rewrite:
    """Run the call with these arguments instead (validated again)."""

    arguments: dict[str, Any]


@dataclass(frozen=True)
class Defer:
    """Wait durably (no invocation, no memory) until the tool task is woken or `until` (ms) passes; then the
    hooks run again. Used by approval gates: decide, memoize the decision, wake the task."""

    until: int | None = None


@dataclass(frozen=True)
class Detach:
    """Do not run the call in this turn: it gets `result` as its tool result (not an error) at once, so the
    run's turn ends and the conversation keeps taking messages. Used by approval gates, so a pending gate never
    blocks its conversation.

    The hook must already have committed the call's durable owner (e.g. a background task of the
    conversation), which later runs the call once with `run_detached_tool` (the same intent-before-execute
    and replay rules as `core.tool`) or drops it, and then commits the outcome as an entry of its own. The
    model sees a consistent transcript: the call has exactly one tool result (this one); the later outcome is
    a separate entry. The tool sees the same `ToolApi` (its `task_id` is the original call's task), except
    that it may run long after the turn that asked for it. A hook that runs again after a crash must return
    the same `Detach` without committing a second owner."""

    result: str
    details: Any = None


@dataclass(frozen=True)
class ToolCallInfo:
    call_id: str
    name: str
    arguments: dict[str, Any]
    spec: ToolSpec | None
    assistant_entry_id: int


class ToolHookApi:
    """What tool hooks get: identity, memos (first writer wins, on the tool task) and commits."""

    def __init__(self, harness: Any, runtime: Any) -> None:
        self.harness = harness
        self._runtime = runtime
        self.task_id: int = runtime.task_id
        self.conversation_id: int = runtime.conversation_id

    async def memo(self, name: str, *candidate: Any) -> Any:
        return await self._runtime.memo(name, *candidate)

    async def commit(self, fn: Callable[[Tx, Task], Any]) -> Any:
        """A commit on behalf of the tool task; returns what `fn` returns (state is left unchanged)."""
        return await commit_returning(self._runtime, fn)

    def now(self) -> int:
        now: int = self.harness.now()
        return now
