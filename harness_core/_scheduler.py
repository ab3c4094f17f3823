"""The scheduler: reserves ready tasks and runs their phase handlers off the commit line.

Every invocation is an asyncio task owned by the scheduler and joined at close (no fire-and-forget). Before
each phase the invocation re-reads the committed task and stops when it is no longer running, the harness is
closing, or (in run mode) the task was marked for abort; a phase that raises or makes no durable progress
faults the task.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from harness_core._json import clean_text
from harness_core.logcontext import log_context
from harness_core.records import Outcome, Task, TaskErrorInfo, TaskState
from harness_core.tasks import Aborted, TaskRuntime

if TYPE_CHECKING:
    from harness_core._tx import Tx
    from harness_core.harness import Harness

log = logging.getLogger("harness_core.scheduler")


@dataclass
class Invocation:
    task_id: int
    mode: Literal["run", "abort"]
    runtime: TaskRuntime
    handle: asyncio.Task[None] | None = None
    cancelled_for_abort: bool = False


@dataclass(frozen=True)
class Blocked:
    reason: str  # missing_task | task_too_old | migration_failed
    error: str | None = None


class Scheduler:
    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.active = False
        self.closing = False
        self.invocations: dict[int, Invocation] = {}
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._failed_migrations: set[tuple[int, int]] = set()  # (task id, id of the definition object)

    # --- control ----------------------------------------------------------------------------------------------

    def resume(self) -> None:
        if self.active:
            return
        self.active = True
        self._loop_task = asyncio.get_running_loop().create_task(self._loop(), name="harness-scheduler")
        self.request_pass()

    def request_pass(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Stop reserving, signal every invocation and join them. Writes no outcomes."""
        self.closing = True
        self.active = False
        if self._timer is not None:
            self._timer.cancel()
        self._wake.set()
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        handles = [inv.handle for inv in self.invocations.values() if inv.handle is not None]
        for handle in handles:
            handle.cancel()
        await asyncio.gather(*handles, return_exceptions=True)

    async def _loop(self) -> None:
        while not self.closing:
            await self._wake.wait()
            self._wake.clear()
            if self.closing or not self.active:
                continue
            try:
                await self._pass()
            except (
                Exception
            ) as exc:  # a pass failing must not stop scheduling; it is retried on the next wake
                if self.harness.session.failed or self.harness.session.sealed:
                    return
                self.harness.report(exc)

    # --- what is ready ----------------------------------------------------------------------------------------

    def blocked(self, task: Task) -> Blocked | None:
        definition = self.harness.registry.task(task.kind)
        if definition is None:
            return Blocked("missing_task")
        if task.version > definition.version:
            return Blocked(
                "task_too_old", f"stored version {task.version} is newer than {definition.version}"
            )
        if task.version < definition.version and definition.migrate is None:
            return Blocked("migration_failed", f"no migrate() from version {task.version}")
        if (task.id, id(definition)) in self._failed_migrations:
            return Blocked("migration_failed")
        return None

    async def _pass(self) -> None:
        from harness_core._reconcile import LiveView, resumable

        harness = self.harness
        published = harness.session.published
        index = LiveView(published)
        now = harness.now()
        candidates: list[int] = []
        ids = set().union(*(published.by_status.get(s, set()) for s in ("pending", "running", "waiting")))
        for task_id in sorted(ids):
            task = published.live_tasks.get(task_id)
            if task is None or task.id in self.invocations or task.parked:
                continue
            status = task.state.status
            if status == "running":
                self.start(task)
            elif status == "pending" or (
                status == "waiting" and (resumable(task, index, now) or task.abort_requested)
            ):
                candidates.append(task.id)
        if candidates:
            reserved = await harness.session.commit(lambda tx: self._reserve(tx, candidates))
            for task in reserved:
                if task.state.status == "running" and task.id not in self.invocations:
                    self.start(task)
        self._arm_timer()

    async def _reserve(self, tx: Tx, candidates: list[int]) -> list[Task]:
        from harness_core._reconcile import ordinary_owned_work, resumable

        reserved: list[Task] = []
        index = tx.live_view()
        for task_id in candidates:
            task = await tx.task(task_id)
            if task is None or not task.live or task.parked or task.state.status in ("running", "completing"):
                continue
            if task.abort_requested:
                if await ordinary_owned_work(tx, index, task):
                    continue  # bottom-up: abort handlers below run first
                if self.blocked(task) is not None:
                    await self.harness.orphan(tx, task, self.blocked(task))
                    continue
            elif task.state.status == "waiting" and not resumable(task, index, self.harness.now()):
                continue
            blocked = self.blocked(task)
            if blocked is not None:
                continue
            definition = self.harness.registry.task(task.kind)
            assert definition is not None
            checkpoint = task.state.checkpoint
            task_input = task.input
            if task.version < definition.version and definition.migrate is not None:
                try:
                    task_input, checkpoint = definition.migrate(
                        task.input, dict(checkpoint or {}), task.version
                    )
                except Exception as exc:
                    self._failed_migrations.add((task.id, id(definition)))
                    self.harness.report(exc)
                    continue
            running = task.model_copy(
                update={
                    "input": task_input,
                    "version": definition.version,
                    "state": TaskState(status="running", checkpoint=checkpoint),
                    "started_at": task.started_at if task.started_at is not None else tx.now,
                }
            )
            tx.put_task(running)
            reserved.append(running)
        return reserved

    def _arm_timer(self) -> None:
        deadline = self.harness.next_deadline()
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is None or self.closing:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, (deadline - self.harness.now()) / 1000)
        self._timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.request_pass()

    # --- invocations ------------------------------------------------------------------------------------------

    def on_publication(self, tasks: list[Task]) -> None:
        """Called synchronously after a commit is stored."""
        need_pass = False
        for task in tasks:
            invocation = self.invocations.get(task.id)
            if task.state.status == "running":
                if invocation is None and self.active:
                    self.start(task)
            elif task.live and (task.state.status == "pending" or task.state.status == "waiting"):
                need_pass = True
            if task.abort_requested and invocation is not None and invocation.mode == "run":
                self.signal_abort(invocation)
            if not task.live:
                need_pass = True  # an owner may be ready to abort or resume
        if need_pass and self.active:
            self.request_pass()

    def start(self, task: Task) -> None:
        if not self.active or self.closing or task.id in self.invocations:
            return
        mode: Literal["run", "abort"] = "abort" if task.abort_requested else "run"
        runtime = TaskRuntime(self.harness, task, mode)
        invocation = Invocation(task_id=task.id, mode=mode, runtime=runtime)
        self.invocations[task.id] = invocation
        # The invocation's asyncio task inherits these ids: what it logs names its task and conversation.
        with log_context(task=task.id, conversation=task.conversation_id):
            invocation.handle = asyncio.get_running_loop().create_task(
                self._invoke(invocation), name=f"task-{task.id}-{task.kind}"
            )

    def signal_abort(self, invocation: Invocation) -> None:
        if (
            invocation.handle is not None
            and not invocation.handle.done()
            and not invocation.cancelled_for_abort
        ):
            invocation.cancelled_for_abort = True
            invocation.handle.cancel()

    async def join(self, task_id: int) -> None:
        invocation = self.invocations.get(task_id)
        if invocation is not None and invocation.handle is not None:
            await asyncio.gather(invocation.handle, return_exceptions=True)

    async def _invoke(self, invocation: Invocation) -> None:
        harness = self.harness
        runtime = invocation.runtime
        try:
            while True:
                task = harness.session.published.live_tasks.get(invocation.task_id)
                if task is None or task.state.status != "running" or self.closing:
                    return
                if invocation.mode == "run" and task.abort_requested:
                    return
                definition = harness.registry.task(task.kind)
                if definition is None:
                    return  # uninstalled between reservation and start; the task stays running until reopen
                before = runtime.progress
                if invocation.mode == "abort":
                    handler = definition.abort or _default_abort
                else:
                    phase = task.state.phase or ""
                    found = definition.phases.get(phase)
                    if found is None:
                        await self._fault(invocation, f"task {task.kind} has no phase {phase!r}")
                        return
                    handler = found
                try:
                    await handler(task, runtime)
                except asyncio.CancelledError:
                    if self.closing or invocation.cancelled_for_abort:
                        return
                    raise
                except Exception as exc:
                    if self.closing or invocation.cancelled_for_abort or runtime.ended:
                        return
                    log.warning("task %s (%s) faulted: %s", task.id, task.kind, exc, exc_info=exc)
                    await self._fault(invocation, f"{type(exc).__name__}: {exc}")
                    return
                if runtime.progress == before:
                    await self._fault(invocation, f"phase {task.state.phase!r} made no durable progress")
                    return
                if invocation.mode == "abort":
                    return
        finally:
            runtime.ended = True
            self.invocations.pop(invocation.task_id, None)
            if not self.closing:
                self.request_pass()

    async def _fault(self, invocation: Invocation, message: str) -> None:
        task_id = invocation.task_id

        async def write(tx: Tx) -> None:
            task = await tx.task(task_id)
            if task is None or not task.live or task.state.status == "completing":
                return
            # The message quotes an exception, which may quote outside text: made valid so the fault is storable.
            outcome = Outcome(status="faulted", error=TaskErrorInfo(message=clean_text(message)))
            tx.put_task(task.model_copy(update={"state": TaskState(status="terminal", outcome=outcome)}))

        try:
            await self.harness.session.commit(write)
        except Exception as exc:
            self.harness.report(exc)


async def _default_abort(task: Task, runtime: TaskRuntime) -> None:
    await runtime.commit(lambda _tx, _task: Aborted(reason=task.abort_reason))
