"""`Harness`: one open storage plus the machinery that runs agents on it.

Open it over a storage, get or create conversations, submit inputs, `resume()` to start scheduling. A
restarted process opens the same storage and continues every unfinished task from its last checkpoint.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload

from harness_core._ancestry import ancestry, visible_in
from harness_core._context_cache import ContextCache
from harness_core._inbox import Input, Write, admit
from harness_core._json import WRAPPED_DEPTH, strict_copy
from harness_core._reconcile import LiveView, ordinary_owned_work, reconcile
from harness_core._scheduler import Blocked, Scheduler
from harness_core._session import CloseInfo, Publication, Session, TaskScope
from harness_core._tx import Tx
from harness_core._watchdog import LoopWatchdog, ToolRuns
from harness_core.agent import AgentChange, ResolvedAgent, resolve_agent
from harness_core.documents import (
    AgentDoc,
    DocDefinition,
    InboxDoc,
    LiveDoc,
    ProviderDoc,
    UsageDoc,
    address_of,
    migrated,
)
from harness_core.errors import HarnessClosed, InvalidOperation, NotFound
from harness_core.extensions import Registry
from harness_core.messages import Usage
from harness_core.models import Models
from harness_core.records import (
    ROOT_CONVERSATION_ID,
    Conversation,
    Entry,
    Ownerless,
    Ownership,
    Submission,
    Task,
    TaskState,
)
from harness_core.settings import HarnessSettings
from harness_core.storage._protocol import Storage
from harness_core.tasks import Aborted, Checkpoint, Complete, Fail, Transition, Wait, outcome_of

log = logging.getLogger("harness_core")
T = TypeVar("T")


def uuid7() -> str:
    """A time-ordered UUID (version 7) as text."""
    ms = int(time.time() * 1000)
    rand = secrets.randbits(74)
    value = (
        (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | (rand >> 62) << 64 | 0b10 << 62 | (rand & ((1 << 62) - 1))
    )
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


@dataclass
class TaskInspection:
    record: Task
    state: Literal["running", "ready", "waiting", "completing", "blocked", "parked"]
    reason: str | None = None
    waiting_on: list[int] = field(default_factory=list)


@dataclass
class Inspection:
    scheduling: Literal["paused", "running", "closing"]
    tasks: list[TaskInspection]
    submissions: list[Submission]

    def parked(self) -> list[TaskInspection]:
        return [t for t in self.tasks if t.state == "parked"]

    def blocked(self) -> list[TaskInspection]:
        return [t for t in self.tasks if t.state == "blocked"]


class Harness:
    def __init__(
        self,
        session: Session,
        *,
        models: Models,
        registry: Registry,
        settings: HarnessSettings,
        on_report: Callable[[BaseException], None] | None,
        env: Callable[[int, ResolvedAgent], Any] | None,
    ) -> None:
        self.session = session
        self.models = models
        self.registry = registry
        self.settings = settings
        self._on_report = on_report
        self._env_factory = env
        self.scheduler = Scheduler(self)
        self.context_cache = ContextCache(
            capacity=settings.context_cache_conversations, max_bytes=settings.context_cache_bytes
        )
        self.tool_runs = ToolRuns()  # tool executions in progress, named by the lag watchdog
        self.watchdog = LoopWatchdog(lambda: self.settings.watchdog, self.tool_runs)
        self._task_waiters: dict[int, list[asyncio.Future[Task]]] = {}
        self._submission_waiters: dict[int, list[asyncio.Future[Submission]]] = {}
        self._idle_waiters: list[tuple[int | None, asyncio.Future[None]]] = []
        self._publication_listeners: list[Callable[[Publication], None]] = []
        self._sleeps: dict[int, int] = {}
        self._close_task: asyncio.Future[CloseInfo] | None = None
        session.on_report = self.report
        session.add_creation_hook(self._on_conversation_created)
        session.add_prepare_hook(lambda tx: reconcile(self, tx))
        session.subscribe(self.context_cache.on_publication)
        session.subscribe(self._on_publication)
        # An uncertain storage failure closes the session without `close()`: its waiters must not hang.
        session.closed.add_done_callback(
            lambda closed: None if closed.cancelled() else self._reject_waiters(closed.result())
        )
        session.closed.add_done_callback(lambda _closed: self.watchdog.cancel())
        self._unsubscribe_registry = registry.subscribe(self.scheduler.request_pass)

    # --- lifecycle --------------------------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        storage: Storage,
        *,
        models: Models | None = None,
        registry: Registry | None = None,
        settings: HarnessSettings | None = None,
        on_report: Callable[[BaseException], None] | None = None,
        env: Callable[[int, ResolvedAgent], Any] | None = None,
        now: Callable[[], int] | None = None,
        read_only: bool = False,
    ) -> Harness:
        """Open a harness over `storage`. Reconciles what a previous process left; does not start scheduling
        (call `resume()`, or any call that waits for progress).

        `read_only=True` (for looking at a storage another process owns, e.g. `SqliteStorage.open_read_only`):
        reconciles nothing and shows tasks as stored (`running` is the owner running them); every commit,
        `resume()` and any wait that needs scheduling raise `InvalidOperation`; reads work as usual."""
        from harness_core._builtin import install_builtins

        meta = await storage.meta()
        session = Session(
            storage,
            next_id=meta.next_id,
            last_seq=meta.last_seq,
            now=now,
            id_stride=meta.id_stride,
            id_offset=meta.id_offset,
        )
        session.read_only = read_only
        registry = registry if registry is not None else Registry()
        install_builtins(registry)
        harness = cls(
            session,
            models=models or Models(),
            registry=registry,
            settings=settings or HarnessSettings(),
            on_report=on_report,
            env=env,
        )
        try:
            await harness._open_reconcile()
        except BaseException:
            await session.close()
            raise
        return harness

    async def _open_reconcile(self) -> None:
        """Load live tasks; tasks found `running` were running when their process died: back to `pending`,
        restart counter +1, parked past the restart limit."""
        live: dict[int, Task] = {}
        cursor = None
        while True:
            page = await self.session.storage.scan_tasks(live=True, limit=1000, cursor=cursor)
            for task in page.items:
                live[task.id] = task
            cursor = page.cursor
            if cursor is None:
                break
        self.session.published.load_tasks(live)
        if self.session.read_only:
            return
        limit = self.settings.restart_limit

        def fix(tx: Tx) -> list[Task]:
            parked: list[Task] = []
            for task in live.values():
                if task.state.status != "running":
                    if task.state.status in ("completing", "waiting"):
                        tx.put_task(task)  # re-evaluated by reconciliation (drained holds, satisfied waits)
                    continue
                restarts = task.restarts + 1
                fixed = task.model_copy(
                    update={
                        "state": task.state.model_copy(update={"status": "pending"}),
                        "restarts": restarts,
                        "parked": task.parked or restarts > limit,
                    }
                )
                if fixed.parked and not task.parked:
                    parked.append(fixed)
                tx.put_task(fixed)
            return parked

        if live:
            parked = await self.session.commit(fix)
            for task in parked:
                self.report(
                    RuntimeError(
                        f"task {task.id} ({task.kind}) was running when its process died {task.restarts} times "
                        f"in a row; parked until retry_task({task.id})"
                    )
                )

    def resume(self) -> None:
        """Start scheduling (idempotent), and the event-loop lag watchdog with it."""
        self.session.check_open()
        if self.session.read_only:
            raise InvalidOperation("this harness was opened read-only; only the storage's owner schedules")
        self.scheduler.resume()
        self.watchdog.start()

    @property
    def closed(self) -> asyncio.Future[CloseInfo]:
        return self.session.closed

    async def close(self) -> CloseInfo:
        """Stop scheduling, join running work (it is signalled, not finished), keep every task resumable."""
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._close())
        return await asyncio.shield(self._close_task)

    async def _close(self) -> CloseInfo:
        await self.scheduler.stop()
        await self.watchdog.stop()
        if not self.session.failed and not self.session.sealed and not self.session.read_only:
            # A graceful close is not a crash: running tasks go back to pending without counting a restart.
            def settle(tx: Tx) -> None:
                for task in tx.live_tasks().values():
                    if task.state.status == "running":
                        tx.put_task(
                            task.model_copy(
                                update={"state": task.state.model_copy(update={"status": "pending"})}
                            )
                        )

            try:
                await self.session.commit(settle)
            except HarnessClosed:
                pass
        self._unsubscribe_registry()
        info = await self.session.close()
        self._reject_waiters(info)
        return info

    def _reject_if_closed(self) -> None:
        closed = self.session.closed
        if closed.done() and not closed.cancelled():
            self._reject_waiters(closed.result())

    def _reject_waiters(self, info: CloseInfo) -> None:
        """Every pending wait (task, submission, idle) raises HarnessClosed: nothing will settle it now."""
        error = HarnessClosed(info.reason, info.error)
        pending: list[asyncio.Future[Any]] = [f for fs in self._task_waiters.values() for f in fs]
        pending += [f for fs in self._submission_waiters.values() for f in fs]
        pending += [future for _conversation, future in self._idle_waiters]
        for future in pending:
            if not future.done():
                future.set_exception(error)

    def report(self, error: BaseException) -> None:
        if self._on_report is not None:
            try:
                self._on_report(error)
                return
            except Exception as exc:  # a broken reporter must not take the harness down
                log.error("on_report raised: %s", exc)
        log.warning("harness report: %s", error, exc_info=error)

    def now(self) -> int:
        return self.session.now()

    # --- commits and conversations ------------------------------------------------------------------------------

    @overload
    async def commit(self, fn: Callable[[Tx], Awaitable[T]]) -> T: ...

    @overload
    async def commit(self, fn: Callable[[Tx], T]) -> T: ...

    async def commit(self, fn: Callable[[Tx], Any]) -> Any:
        """Run `fn(tx)` as one atomic commit and return its result once stored."""
        return await self.session.commit(fn)

    async def root(
        self, *, agent: AgentChange | None = None, init: Callable[[Tx, int], Any] | None = None
    ) -> ConversationHandle:
        """The root conversation (id 1), created on first use with `agent`/`init`; later calls write nothing.

        On a store split into partitions it lives in partition `1 % partitions`: a harness over another
        partition raises `InvalidOperation`."""
        if not self.session.owns_id(ROOT_CONVERSATION_ID):
            stride = self.session.id_stride
            raise InvalidOperation(
                f"the root conversation (id {ROOT_CONVERSATION_ID}) lives in partition "
                f"{ROOT_CONVERSATION_ID % stride} of {stride}; this harness owns partition "
                f"{self.session.id_offset}: use the harness of partition {ROOT_CONVERSATION_ID % stride}"
            )

        async def create(tx: Tx) -> None:
            if await tx.conversation(ROOT_CONVERSATION_ID) is not None:
                return
            await tx.create_conversation(Ownerless(), conversation_id=ROOT_CONVERSATION_ID)
            await self._apply_agent(tx, ROOT_CONVERSATION_ID, agent)
            if init is not None:
                result = init(tx, ROOT_CONVERSATION_ID)
                if inspect.isawaitable(result):
                    await result

        if await self.session.read_conversation(ROOT_CONVERSATION_ID) is None:
            await self.session.commit(create)
        return ConversationHandle(self, ROOT_CONVERSATION_ID)

    async def create_conversation(
        self,
        ownership: Ownership | None = None,
        *,
        agent: AgentChange | None = None,
        init: Callable[[Tx, int], Any] | None = None,
    ) -> ConversationHandle:
        async def create(tx: Tx) -> int:
            record = await tx.create_conversation(ownership or Ownerless())
            await self._apply_agent(tx, record.id, agent)
            if init is not None:
                result = init(tx, record.id)
                if inspect.isawaitable(result):
                    await result
            return record.id

        conversation_id = await self.session.commit(create)
        return ConversationHandle(self, conversation_id)

    async def conversation(self, conversation_id: int) -> ConversationHandle | None:
        record = await self.session.read_conversation(conversation_id)
        return None if record is None else ConversationHandle(self, conversation_id)

    async def conversation_record(self, conversation_id: int) -> Conversation | None:
        return await self.session.read_conversation(conversation_id)

    async def _apply_agent(self, tx: Tx, conversation_id: int, change: AgentChange | None) -> None:
        if change is None:
            return
        draft = await tx.doc(AgentDoc, conversation_id)
        draft.value = change.apply(draft.value)

    async def _on_conversation_created(self, tx: Tx, record: Conversation) -> None:
        await tx.doc(LiveDoc, record.id)
        await tx.doc(InboxDoc, record.id)
        await tx.doc(UsageDoc, record.id)
        provider = await tx.doc(ProviderDoc, record.id)
        provider.value = {"session_id": uuid7()}
        agent = await tx.doc(AgentDoc, record.id)
        if record.parent is None and record.owner_conversation_id is not None:
            # A subagent starts as a one-time copy of its owner's agent.
            owner_agent = await tx.snapshot(AgentDoc, record.owner_conversation_id)
            if owner_agent:
                agent.value = owner_agent

    # --- documents ----------------------------------------------------------------------------------------------

    async def snapshot(
        self, definition: DocDefinition, scope_id: int | None = None, key: str | None = None
    ) -> Any:
        """A document's committed value (None if it does not exist). Creates nothing."""
        state = await self.session.read_doc_state(address_of(definition, scope_id, key))
        if state is None:
            return None
        return migrated(definition, state.version, state.value)

    async def family(self, definition: DocDefinition, scope_id: int | None = None) -> dict[str, Any]:
        """Every alive document of a family in one scope, by key (creates nothing)."""
        records = await self.session.storage.scan_documents(
            scope=definition.scope,
            scope_id=None if definition.scope == "session" else scope_id,
            kind=definition.kind,
        )
        found: dict[str, Any] = {}
        for record in records:
            if record.key is None:
                continue
            value = await self.snapshot(definition, scope_id, record.key)
            if value is not None:
                found[record.key] = value
        return found

    async def snapshot_as_of(
        self, definition: DocDefinition, conversation_id: int, at: int, key: str | None = None
    ) -> Any:
        """A rewindable conversation document as it was when entry `at` (visible in the conversation) was
        committed; through fork ancestry."""
        if definition.history != "rewindable":
            raise InvalidOperation(f"document {definition.kind} keeps no history")
        entry = await self.session.storage.entry(at)
        if entry is None:
            raise NotFound(f"entry {at} does not exist")
        owner = await self._visible_owner(conversation_id, entry.id, entry.conversation_id)
        record = await self.session.storage.find_document(
            definition.kind, "conversation", owner, key, at_seq=entry.seq
        )
        if record is None:
            return None
        stored = await self.session.storage.document(record.id, at_seq=entry.seq)
        return None if stored is None else migrated(definition, stored.version, stored.value)

    async def _visible_owner(self, conversation_id: int, entry_id: int, entry_conversation: int) -> int:
        chain = await ancestry(conversation_id, self.session.read_conversation)
        owner = visible_in(chain, entry_conversation, entry_id)
        if owner is None:
            raise NotFound(f"entry {entry_id} is not visible in conversation {conversation_id}")
        return owner

    # --- agents -------------------------------------------------------------------------------------------------

    async def resolve_agent(self, conversation_id: int) -> ResolvedAgent:
        stored = await self.snapshot(AgentDoc, conversation_id) or {}
        return resolve_agent(stored, self.registry, self.settings)

    async def make_env(self, conversation_id: int) -> Any:
        if self._env_factory is None:
            return None
        agent = await self.resolve_agent(conversation_id)
        result = self._env_factory(conversation_id, agent)
        if inspect.isawaitable(result):
            result = await result
        return result

    def hooks_for(self, task_kind: str, name: str, agent: ResolvedAgent) -> list[Callable[..., Any]]:
        return agent.hooks(task_kind, name)

    # --- tasks --------------------------------------------------------------------------------------------------

    async def create_task_in(
        self,
        tx: Tx,
        kind: str,
        input: Any = None,
        *,
        owner_task_id: int | None = None,
        conversation_id: int | None = None,
        background: bool = False,
    ) -> Task:
        """Create a task inside a commit. Owned by a task (same conversation) or by its conversation."""
        definition = self.registry.task(kind)
        if definition is None:
            raise NotFound(f"no task definition named {kind!r} is installed")
        if owner_task_id is not None:
            if background:
                raise InvalidOperation("a task owned by another task cannot be background")
            owner = await tx.check_owner(owner_task_id)
            if conversation_id is not None and conversation_id != owner.conversation_id:
                raise InvalidOperation("a child task must live in its owner's conversation")
            conversation_id = owner.conversation_id
        if conversation_id is None:
            if tx.scope is None:
                raise InvalidOperation("create_task needs a conversation id")
            conversation_id = tx.scope.conversation_id
        if await tx.conversation(conversation_id) is None:
            raise NotFound(f"conversation {conversation_id} does not exist")
        clean_input = strict_copy(input, f"task {kind} input")
        task = Task(
            id=tx.mint_id(),
            conversation_id=conversation_id,
            kind=kind,
            version=definition.version,
            input=clean_input,
            owner_task_id=owner_task_id,
            background=background,
            state=TaskState(
                status="pending", checkpoint=_checkpoint_copy(definition.initial(clean_input), kind)
            ),
        )
        tx.put_task(task)
        return task

    async def entry(self, entry_id: int) -> Entry | None:
        """A stored entry by id (any conversation)."""
        return await self.session.storage.entry(entry_id)

    async def get_task(self, task_id: int) -> Task | None:
        return await self.session.read_task(task_id)

    async def _task_commit(self, runtime: Any, fn: Callable[[Tx, Task], Any]) -> Task:
        applied: list[bool] = []

        async def callback(tx: Tx) -> Task:
            if runtime.ended:
                raise _ended("the invocation is over")
            task = await tx.task(runtime.task_id)
            if task is None or not task.live or task.state.status == "completing":
                raise _ended(f"task {runtime.task_id} is no longer running")
            if runtime.mode == "run" and task.abort_requested:
                raise _ended(f"task {runtime.task_id} was marked for abort")
            result = fn(tx, task)
            if inspect.isawaitable(result):
                result = await result
            current = await tx.task(runtime.task_id)
            assert current is not None
            if isinstance(result, (Checkpoint, Wait, Complete, Fail, Aborted)):
                current = await self._apply_transition(tx, current, result)
                tx.put_task(current)
                applied.append(True)
            return current

        task = await self.session.commit(callback, scope=TaskScope(runtime.task_id, runtime.conversation_id))
        if applied:
            runtime.progress += 1
        return task

    async def _apply_transition(self, tx: Tx, task: Task, transition: Transition) -> Task:
        if isinstance(transition, Checkpoint):
            _check_checkpoint(transition.checkpoint)
            state = TaskState(status="running", checkpoint=_checkpoint_copy(transition.checkpoint, task.kind))
            return task.model_copy(update={"state": state, "restarts": 0, "seq": tx.seq})
        if isinstance(transition, Wait):
            _check_checkpoint(transition.checkpoint)
            for other in transition.on:
                if other == task.id:
                    raise InvalidOperation("a task cannot wait on itself")
                found = await tx.task(other)
                if found is None:
                    raise NotFound(f"task {other} does not exist")
                if found.owner_task_id != task.id and transition.policy == "fail_fast":
                    raise InvalidOperation("fail_fast waits only on tasks the waiter owns")
                chain = task.owner_task_id
                while chain is not None:
                    if chain == other:
                        raise InvalidOperation(f"task {task.id} cannot wait on its owner {other}")
                    owner = await tx.task(chain)
                    chain = None if owner is None else owner.owner_task_id
            state = TaskState(
                status="waiting",
                checkpoint=_checkpoint_copy(transition.checkpoint, task.kind),
                on=list(transition.on),
                policy=transition.policy,
                deadline=transition.deadline,
                woken=task.state.woken,  # a wake that arrived before this wait
            )
            return task.model_copy(update={"state": state, "restarts": 0, "seq": tx.seq})
        outcome = outcome_of(transition)
        outcome = outcome.model_copy(update={"result": strict_copy(outcome.result, "task result")})
        # The commit's seq is set here so put_task need not copy the record a second time.
        return task.model_copy(
            update={"state": TaskState(status="terminal", outcome=outcome), "restarts": 0, "seq": tx.seq}
        )

    async def _memo(self, runtime: Any, name: str, candidate: Any) -> Any:
        value = strict_copy(candidate, f"memo {name}")

        def write(tx: Tx, task: Task) -> None:
            if name not in task.memos:
                tx.put_task(task.model_copy(update={"memos": {**task.memos, name: value}}))

        task = await self._task_commit(runtime, write)
        return task.memos.get(name, value)

    async def _sleep_until(self, until: int) -> None:
        token = id(asyncio.current_task())
        self._sleeps[token] = until
        try:
            delay = (until - self.now()) / 1000
            if delay > 0:
                await asyncio.sleep(delay)
        finally:
            self._sleeps.pop(token, None)

    def next_deadline(self) -> int | None:
        """The earliest time (ms) a task waits for: a durable wait deadline or a running sleep."""
        published = self.session.published
        waiting = (published.live_tasks[i] for i in published.by_status.get("waiting", ()))
        deadlines = [t.state.deadline for t in waiting if t.state.deadline is not None and not t.parked]
        deadlines.extend(self._sleeps.values())
        return min(deadlines) if deadlines else None

    async def wake_task(self, tx: Tx, task_id: int) -> bool:
        """Inside a commit: an event the task waits for happened (e.g. an approval decision). A waiting task
        resumes at the next scheduling pass; a task that has not started waiting yet keeps the wake, and its
        next `Wait` resumes at once, so a wake that races ahead of the wait is never lost."""
        task = await tx.task(task_id)
        if task is None or task.state.status in ("terminal", "completing"):
            return False
        tx.put_task(task.model_copy(update={"state": task.state.model_copy(update={"woken": True})}))
        return True

    async def wait_for_task(self, task_id: int) -> Task:
        """Wait until the task is terminal; starts scheduling."""
        self.resume()
        task = await self.get_task(task_id)
        if task is None:
            raise NotFound(f"task {task_id} does not exist")
        if task.state.status == "terminal":
            return task
        future: asyncio.Future[Task] = asyncio.get_running_loop().create_future()
        self._task_waiters.setdefault(task_id, []).append(future)
        self._reject_if_closed()  # the harness may have closed during the read above
        try:
            task = await self.get_task(task_id)  # it may have finished while we registered
            if task is not None and task.state.status == "terminal" and not future.done():
                future.set_result(task)
            return await future
        finally:
            _forget(self._task_waiters, task_id, future)

    async def abort_task(self, task_id: int) -> Literal["marked", "terminal"]:
        """Mark the task for abort (its abort handler runs once the work below it finished)."""
        result: list[Literal["marked", "terminal"]] = []

        async def mark(tx: Tx) -> None:
            task = await tx.task(task_id)
            if task is None:
                raise NotFound(f"task {task_id} does not exist")
            if not task.live:
                result.append("terminal")
                return
            result.append("marked")
            marked = task.marked_for_abort(task.abort_reason or "aborted")
            blocked = self.scheduler.blocked(marked)
            index = tx.live_view()
            if (
                blocked is not None
                and task.id not in self.scheduler.invocations
                and task.state.status != "completing"
                and not await ordinary_owned_work(tx, index, task)
            ):
                await self.orphan(tx, marked, blocked)
            else:
                tx.put_task(marked)

        await self.session.commit(mark)
        invocation = self.scheduler.invocations.get(task_id)
        if invocation is not None and invocation.mode == "run":
            self.scheduler.signal_abort(invocation)
            await self.scheduler.join(task_id)
        self.scheduler.request_pass()
        return result[0]

    async def orphan(self, tx: Tx, task: Task, blocked: Blocked | None) -> None:
        """Settle a task whose code is missing and that was asked to abort: `orphaned`, nothing of it ran."""
        from harness_core.records import Outcome

        reason = blocked.reason if blocked is not None else "missing_task"
        outcome = Outcome(status="orphaned", reason=reason)
        tx.put_task(task.model_copy(update={"state": TaskState(status="terminal", outcome=outcome)}))

    async def on_task_failed(self, tx: Tx, task: Task) -> None:
        """Cleanup the built-in tasks' own code would have done, for a task that faulted or was orphaned."""
        from harness_core._builtin import cleanup_failed_task

        await cleanup_failed_task(self, tx, task)

    async def retry_task(self, task_id: int) -> None:
        """Clear a parked task's restart counter and schedule it again."""

        def clear(tx: Tx) -> Any:
            async def run() -> None:
                task = await tx.task(task_id)
                if task is None:
                    raise NotFound(f"task {task_id} does not exist")
                if not task.live:
                    raise InvalidOperation(f"task {task_id} already ended")
                tx.put_task(task.model_copy(update={"parked": False, "restarts": 0}))

            return run()

        await self.session.commit(clear)
        self.resume()
        self.scheduler.request_pass()

    async def wait_for_idle(self, conversation_id: int | None = None) -> None:
        """Wait until the conversation (or every ownerless conversation) has no live ordinary work."""
        self.resume()
        if self._idle(conversation_id):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = (conversation_id, future)
        self._idle_waiters.append(waiter)
        try:
            await future
        finally:
            if waiter in self._idle_waiters:  # cancelled: settled ones were removed by the publication
                self._idle_waiters.remove(waiter)

    def _idle(self, conversation_id: int | None) -> bool:
        published = self.session.published
        index = LiveView(published)
        if conversation_id is not None:
            return not index.ordinary_in_conversation(conversation_id)
        return all(index.root_is_background(task) for task in published.live_tasks.values())

    async def inspect(self) -> Inspection:
        """Every live task with its scheduling state, and the queued or placed submissions. Writes nothing."""
        scheduler = self.scheduler
        scheduling: Literal["paused", "running", "closing"] = (
            "closing"
            if scheduler.closing or self.session.sealed
            else "running"
            if scheduler.active
            else "paused"
        )
        tasks: list[TaskInspection] = []
        live = dict(self.session.published.live_tasks)
        for task in sorted(live.values(), key=lambda t: t.id):
            status = task.state.status
            blocked = scheduler.blocked(task) if status in ("pending", "waiting") else None
            if task.parked:
                tasks.append(TaskInspection(task, "parked", f"restarted {task.restarts} times"))
            elif blocked is not None:
                tasks.append(TaskInspection(task, "blocked", blocked.reason))
            elif status == "running":
                tasks.append(TaskInspection(task, "running"))
            elif status == "waiting":
                tasks.append(
                    TaskInspection(task, "waiting", waiting_on=[o for o in task.state.on if o in live])
                )
            elif status == "completing":
                tasks.append(TaskInspection(task, "completing"))
            else:
                tasks.append(TaskInspection(task, "ready"))
        submissions: list[Submission] = []
        statuses: tuple[Literal["queued"], Literal["placed"]] = ("queued", "placed")
        for status_name in statuses:
            cursor = None
            while True:
                page = await self.session.storage.scan_submissions(
                    status=status_name, limit=500, cursor=cursor
                )
                submissions.extend(page.items)
                cursor = page.cursor
                if cursor is None:
                    break
        submissions.sort(key=lambda s: s.id)
        return Inspection(scheduling=scheduling, tasks=tasks, submissions=submissions)

    async def usage(self) -> dict[str, Any]:
        """Token and cost totals over every conversation: {"models": {...}, "tools": {...}, "total": Usage}."""
        totals: dict[str, dict[str, Usage]] = {"models": {}, "tools": {}}
        cursor = None
        while True:
            page = await self.session.storage.scan_conversations(limit=500, cursor=cursor)
            for conversation in page.items:
                doc = await self.snapshot(UsageDoc, conversation.id) or {}
                for section in ("models", "tools"):
                    for name, raw in doc.get(section, {}).items():
                        usage = Usage.model_validate(raw)
                        totals[section][name] = totals[section].get(name, Usage()).plus(usage)
            cursor = page.cursor
            if cursor is None:
                break
        total = Usage()
        for usage in totals["models"].values():
            total = total.plus(usage)
        return {"models": totals["models"], "tools": totals["tools"], "total": total}

    # --- submissions --------------------------------------------------------------------------------------------

    async def submit_in(self, tx: Tx, conversation_id: int, draft: Input | Write) -> Submission:
        """Admit a submission inside an existing commit, so other writes (e.g. a delivery record) land with
        it atomically. Same rules as `ConversationHandle.submit`; call `resume()` afterwards."""
        return await admit(self, tx, conversation_id, draft)

    async def submission(self, submission_id: int) -> SubmissionHandle | None:
        """A submission by id (its record as committed now); works after a reopen too."""
        record = self.session.published.open_submissions.get(submission_id)
        if record is None:
            record = await self.session.storage.submission(submission_id)
        return None if record is None else SubmissionHandle(self, record)

    async def wait_submission(self, submission_id: int) -> Submission:
        self.resume()
        future: asyncio.Future[Submission]
        if submission_id in self.session.published.open_submissions:
            # Unsettled as of the last stored commit. The commit that settles it is adopted and then published
            # to `_on_publication` with no await in between, so a waiter registered here (no await since the
            # check) is always resolved: no storage read needed.
            future = asyncio.get_running_loop().create_future()
            self._submission_waiters.setdefault(submission_id, []).append(future)
            try:
                return await future
            finally:
                _forget(self._submission_waiters, submission_id, future)
        record = await self.session.storage.submission(submission_id)
        if record is None:
            raise NotFound(f"submission {submission_id} does not exist")
        if _settled(record):
            return record
        future = asyncio.get_running_loop().create_future()
        self._submission_waiters.setdefault(submission_id, []).append(future)
        self._reject_if_closed()  # the harness may have closed during the read above
        try:
            record = await self.session.storage.submission(submission_id)
            if record is not None and _settled(record) and not future.done():
                future.set_result(record)
            return await future
        finally:
            _forget(self._submission_waiters, submission_id, future)

    # --- publication ----------------------------------------------------------------------------------------------

    def add_publication_listener(self, listener: Callable[[Publication], None]) -> Callable[[], None]:
        self._publication_listeners.append(listener)
        return lambda: (
            self._publication_listeners.remove(listener) if listener in self._publication_listeners else None
        )

    def _on_publication(self, publication: Publication) -> None:
        if publication.tasks:
            self.scheduler.on_publication(publication.tasks)
            for task in publication.tasks:
                if task.state.status == "terminal":
                    for task_future in self._task_waiters.pop(task.id, []):
                        if not task_future.done():
                            task_future.set_result(task)
            if self._idle_waiters:
                remaining: list[tuple[int | None, asyncio.Future[None]]] = []
                for conversation_id, idle_future in self._idle_waiters:
                    if idle_future.done():
                        continue
                    if self._idle(conversation_id):
                        idle_future.set_result(None)
                    else:
                        remaining.append((conversation_id, idle_future))
                self._idle_waiters = remaining
        for submission in publication.submissions:
            if _settled(submission):
                for submission_future in self._submission_waiters.pop(submission.id, []):
                    if not submission_future.done():
                        submission_future.set_result(submission)
        for listener in list(self._publication_listeners):
            try:
                listener(publication)
            except Exception as exc:
                self.report(exc)


def _forget(waiters: dict[int, list[Any]], key: int, future: asyncio.Future[Any]) -> None:
    """Drop a waiter that is over (a cancelled wait would otherwise stay until the record settles)."""
    found = waiters.get(key)
    if found is not None and future in found:
        found.remove(future)
        if not found:
            del waiters[key]


def _settled(submission: Submission) -> bool:
    return submission.status in ("done", "unanswered")


def _check_checkpoint(checkpoint: dict[str, Any]) -> None:
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("phase"), str):
        raise InvalidOperation(f"a checkpoint must be a dict with a 'phase' string, got {checkpoint!r}")


def _checkpoint_copy(checkpoint: Any, kind: str) -> Any:
    # Checkpoints carry values given to the harness (a tool call's arguments), so they get the wrapped limit.
    return strict_copy(checkpoint, f"task {kind} checkpoint", limit=WRAPPED_DEPTH)


def _ended(why: str) -> Exception:
    from harness_core.tasks import InvocationEnded

    return InvocationEnded(why)


from harness_core.conversation import ConversationHandle, SubmissionHandle  # noqa: E402  (cycle: handles use Harness)
