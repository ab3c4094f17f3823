"""Durable tasks: state machines that checkpoint every step, so a restarted process continues from the last one.

A definition names its phases. The scheduler runs the handler of the task's current phase off the commit line;
the handler ends by committing a transition through `runtime.commit`: a new checkpoint (`Checkpoint`), a
durable wait (`Wait`), or an outcome (`Complete`, `Fail`, `Aborted`). A phase that returns without committing
any transition made no durable progress and faults the task; so does an exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from harness_core._json import clean_text, strict_copy
from harness_core.errors import HarnessClosed, InvalidOperation
from harness_core.records import Outcome, Task, TaskErrorInfo, WaitPolicy

if TYPE_CHECKING:
    from harness_core._tx import Tx
    from harness_core.harness import Harness

T = TypeVar("T")

PhaseHandler = Callable[[Task, "TaskRuntime"], Awaitable[None]]
AbortHandler = Callable[[Task, "TaskRuntime"], Awaitable[None]]


@dataclass(frozen=True, eq=False)
class TaskDefinition:
    name: str
    phases: dict[str, PhaseHandler]
    initial: Callable[[Any], dict[str, Any]]
    version: int = 1
    abort: AbortHandler | None = None
    migrate: Callable[[Any, dict[str, Any], int], tuple[Any, dict[str, Any]]] | None = None


def define_task(
    name: str,
    *,
    phases: dict[str, PhaseHandler],
    initial: Callable[[Any], dict[str, Any]] | None = None,
    version: int = 1,
    abort: AbortHandler | None = None,
    migrate: Callable[[Any, dict[str, Any], int], tuple[Any, dict[str, Any]]] | None = None,
) -> TaskDefinition:
    """Define a task kind. `initial(input)` gives the first checkpoint (default: the first phase)."""
    if not phases:
        raise ValueError(f"task {name}: at least one phase is needed")
    first = next(iter(phases))
    return TaskDefinition(
        name=name,
        phases=dict(phases),
        initial=initial or (lambda _input: {"phase": first}),
        version=version,
        abort=abort,
        migrate=migrate,
    )


# --- transitions a phase commits -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """Move on: store a new checkpoint (it must have a `phase`)."""

    checkpoint: dict[str, Any]


@dataclass(frozen=True)
class Wait:
    """Wait durably, holding no invocation, until every task in `on` is terminal, the `deadline` (ms, harness
    clock) passes, or the task is woken; then resume at `checkpoint`."""

    checkpoint: dict[str, Any]
    on: list[int] = field(default_factory=list)
    policy: WaitPolicy = "all_settled"
    deadline: int | None = None


@dataclass(frozen=True)
class Complete:
    result: Any = None


@dataclass(frozen=True)
class Fail:
    message: str
    detail: Any = None
    result: Any = None


@dataclass(frozen=True)
class Aborted:
    reason: str | None = None
    result: Any = None


Transition = Checkpoint | Wait | Complete | Fail | Aborted


def outcome_of(transition: Complete | Fail | Aborted) -> Outcome:
    if isinstance(transition, Complete):
        return Outcome(status="completed", result=transition.result)
    if isinstance(transition, Fail):
        # An error message is text for people, often built from an exception that quotes outside input: made
        # valid, never refused. The detail is data: strict.
        return Outcome(
            status="failed",
            result=transition.result,
            error=TaskErrorInfo(
                message=clean_text(str(transition.message)),
                detail=strict_copy(transition.detail, "task error detail"),
            ),
        )
    reason = None if transition.reason is None else clean_text(transition.reason)
    return Outcome(status="aborted", result=transition.result, reason=reason)


class InvocationEnded(HarnessClosed):
    """A runtime operation after the invocation ended (closed, aborted, or the task moved on)."""

    def __init__(self, why: str) -> None:
        super().__init__("closed")
        self.args = (f"task invocation ended: {why}",)


_MISSING: Any = object()


class TaskRuntime:
    """What a phase handler gets. Every operation is bound to one invocation of one task."""

    def __init__(self, harness: Harness, task: Task, mode: Literal["run", "abort"]) -> None:
        self.harness = harness
        self.task_id = task.id
        self.conversation_id = task.conversation_id
        self.kind = task.kind
        self.mode = mode
        self.progress = 0  # committed transitions in this invocation
        self.ended = False
        self._phase_progress = 0

    @property
    def settings(self) -> Any:
        return self.harness.settings

    @property
    def models(self) -> Any:
        return self.harness.models

    @property
    def registry(self) -> Any:
        return self.harness.registry

    def now(self) -> int:
        return self.harness.now()

    def report(self, error: BaseException) -> None:
        self.harness.report(error)

    def _check(self) -> None:
        if self.ended:
            raise InvocationEnded("the invocation is over")

    async def commit(
        self, fn: Callable[[Tx, Task], Transition | Awaitable[Transition | None] | None]
    ) -> Task:
        """Commit on behalf of this task. `fn(tx, task)` may write anything and return a transition.

        The commit is refused if the invocation ended, the harness is closing, the task is no longer live,
        or (in run mode) the task was marked for abort. Returns the task record as committed.
        """
        self._check()
        return await self.harness._task_commit(self, fn)

    async def memo(self, name: str, candidate: Any = _MISSING) -> Any:
        """First writer wins: store `candidate` under `name` unless a value exists; return the stored value.
        Without a candidate, read the stored value (None if absent)."""
        self._check()
        if candidate is _MISSING:
            task = await self.harness.session.read_task(self.task_id)
            return None if task is None else task.memos.get(name)
        return await self.harness._memo(self, name, candidate)

    async def sleep(self, until: int) -> None:
        """Sleep until `until` (ms on the harness clock). Keeps the invocation; use `Wait(deadline=...)` for
        waits that should hold nothing."""
        self._check()
        await self.harness._sleep_until(until)

    async def get_task(self, task_id: int) -> Task | None:
        return await self.harness.get_task(task_id)

    async def wait_for_task(self, task_id: int) -> Task:
        self._check()
        return await self.harness.wait_for_task(task_id)

    async def outcomes(self, task_ids: list[int]) -> list[Outcome]:
        """The outcomes of terminal tasks, in order (raises if one is not terminal)."""
        out: list[Outcome] = []
        for task_id in task_ids:
            task = await self.harness.get_task(task_id)
            if task is None or task.state.status != "terminal" or task.state.outcome is None:
                raise InvalidOperation(f"task {task_id} is not terminal")
            out.append(task.state.outcome)
        return out

    async def agent(self) -> Any:
        return await self.harness.resolve_agent(self.conversation_id)

    async def env(self) -> Any:
        return await self.harness.make_env(self.conversation_id)

    def hooks(self, name: str, agent: Any) -> list[Callable[..., Any]]:
        return self.harness.hooks_for(self.kind, name, agent)


async def sleep_until(now: Callable[[], int], until: int) -> None:
    delay = (until - now()) / 1000
    if delay > 0:
        await asyncio.sleep(delay)
