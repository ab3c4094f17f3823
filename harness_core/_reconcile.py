"""Task-state rules applied inside every commit, after its callback (so they land atomically with it).

- A task that finishes while work it owns is still live holds `completing`; when that work drains it becomes
  terminal. A held outcome other than `completed` cancels the work below it.
- An abort mark cascades to the live work below the task (not across background tasks) and withdraws queued
  inputs of conversations it owns.
- A terminal task retires its task-scoped documents, lets its waiting owner (or any waiter) resume, and under
  `fail_fast` marks the waiter's other tasks for abort.
- While the scheduler runs, a new pending task or a resumable waiting task is reserved (`running`) in the same
  commit, saving a commit per step; the scheduler starts its invocation once the commit is stored.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness_core._layers import Layer, Published
from harness_core.records import Conversation, Outcome, Task, TaskState

if TYPE_CHECKING:
    from harness_core._tx import Tx
    from harness_core.harness import Harness


class LiveView:
    """The live tasks as one commit sees them: the published indexes overlaid with the group's and the
    commit's own task writes. Cheap to build; reads the layers as they change."""

    def __init__(self, published: Published, layers: tuple[Layer, ...] = ()) -> None:
        self.published = published
        self.layers = layers  # most recent first

    def live(self, task_id: int) -> Task | None:
        for layer in self.layers:
            found = layer.tasks.get(task_id)
            if found is not None:
                return found if found.live else None
        return self.published.live_tasks.get(task_id)

    def _ids(self, candidates: list[set[int] | None], matches: Callable[[Task], bool]) -> list[Task]:
        # Candidates from the published index and each layer's index are a superset; the task as this commit
        # sees it decides.
        ids: set[int] = set()
        for found_ids in candidates:
            if found_ids:
                ids.update(found_ids)
        found = [self.live(i) for i in ids]
        return sorted((t for t in found if t is not None and matches(t)), key=lambda t: t.id)

    def children(self, owner_id: int) -> list[Task]:
        return self._ids(
            [self.published.by_owner.get(owner_id), *(la.task_owners.get(owner_id) for la in self.layers)],
            lambda t: t.owner_task_id == owner_id,
        )

    def in_conversation(self, conversation_id: int) -> list[Task]:
        return self._ids(
            [
                self.published.by_conversation.get(conversation_id),
                *(la.task_conversations.get(conversation_id) for la in self.layers),
            ],
            lambda t: t.conversation_id == conversation_id,
        )

    def waiters_of(self, task_id: int) -> list[Task]:
        return self._ids(
            [self.published.waiters.get(task_id), *(la.task_waiters.get(task_id) for la in self.layers)],
            lambda t: t.state.status == "waiting" and task_id in t.state.on,
        )

    def root_is_background(self, task: Task) -> bool:
        current: Task | None = task
        while current is not None and current.owner_task_id is not None:
            current = self.live(current.owner_task_id)
        return current is not None and current.background

    def ordinary_in_conversation(self, conversation_id: int) -> list[Task]:
        return [t for t in self.in_conversation(conversation_id) if not self.root_is_background(t)]

    def all(self) -> dict[int, Task]:
        merged = dict(self.published.live_tasks)
        for layer in reversed(self.layers):
            for task in layer.tasks.values():
                if task.live:
                    merged[task.id] = task
                else:
                    merged.pop(task.id, None)
        return merged


async def owned_conversations(tx: Tx, task_id: int) -> list[Conversation]:
    return await tx.conversations_owned_by(task_id)


async def ordinary_owned_work(tx: Tx, index: LiveView, task: Task) -> list[Task]:
    """Live non-background tasks below `task`: its children and the tasks of conversations it owns."""
    found: list[Task] = [child for child in index.children(task.id) if not child.background]
    for conversation in await owned_conversations(tx, task.id):
        found.extend(index.ordinary_in_conversation(conversation.id))
    return found


def resumable(task: Task, index: LiveView, now: int) -> bool:
    """A waiting task may resume: its deadline passed, every task it waits on is terminal, or (for a wait on
    no tasks) it was woken or has no deadline. A wake never cuts short a wait on tasks."""
    state = task.state
    if state.status != "waiting":
        return False
    if state.deadline is not None and now >= state.deadline:
        return True
    if not state.on:
        return state.woken or state.deadline is None
    return all(index.live(other) is None for other in state.on)


class Reconciler:
    def __init__(self, harness: Harness, tx: Tx) -> None:
        self.harness = harness
        self.tx = tx
        self._index: LiveView = tx.live_view()
        self.queue: deque[int] = deque()

    def index(self) -> LiveView:
        return self._index

    def put(self, task: Task) -> Task:
        self.tx.put_task(task)
        self.queue.append(task.id)
        return task

    async def run(self) -> None:
        written = self.tx.written_tasks()
        if not written:
            return
        self.queue.extend(written.keys())
        steps = 0
        while self.queue:
            steps += 1
            if steps > 100_000:  # a cycle would be a bug; fail the commit loudly instead of hanging the line
                raise RuntimeError("task reconciliation did not converge")
            task = self.tx.local.tasks[self.queue.popleft()]
            await self._step(task)

    async def _step(self, task: Task) -> None:
        status = task.state.status
        if task.abort_requested and task.live:
            await self._cascade(task)
        if status == "pending" and not task.abort_requested:
            self._maybe_reserve(task)
        elif status == "waiting":
            if resumable(task, self.index(), self.tx.now) and not task.abort_requested:
                self._resume(task)
        elif status == "completing":
            if not await ordinary_owned_work(self.tx, self.index(), task):
                await self._finalize(task, task.state.outcome)
            elif task.state.outcome is not None and task.state.outcome.status != "completed":
                await self._cascade(task)
        elif status == "terminal" and task.state.outcome is not None and task.ended_at is None:
            # Freshly finished: hold while owned work lives, otherwise finish for real.
            if await ordinary_owned_work(self.tx, self.index(), task):
                self.put(
                    task.model_copy(
                        update={
                            "state": TaskState(status="completing", outcome=task.state.outcome),
                            "memos": {},
                            "seq": self.tx.seq,
                        }
                    )
                )
            else:
                await self._finalize(task, task.state.outcome)

    def _maybe_reserve(self, task: Task) -> None:
        harness = self.harness
        if not harness.scheduler.active or task.parked:
            return
        definition = harness.registry.task(task.kind)
        if definition is None or definition.version != task.version:
            return  # blocked or needs migration: the scheduler pass handles it
        self.put(
            task.model_copy(
                update={
                    "state": task.state.model_copy(update={"status": "running"}),
                    "started_at": task.started_at if task.started_at is not None else self.tx.now,
                    "seq": self.tx.seq,  # stamped here: put_task would copy the record again for it
                }
            )
        )

    def _resume(self, task: Task) -> None:
        # Reserved (running) at once while the scheduler runs and the definition is installed; one copy.
        reserve = self.harness.scheduler.active and self.harness.registry.task(task.kind) is not None
        state = TaskState(status="running" if reserve else "pending", checkpoint=task.state.checkpoint)
        self.put(task.model_copy(update={"state": state, "seq": self.tx.seq}))

    async def _cascade(self, task: Task) -> None:
        """Mark every live non-background task below `task` for abort; withdraw inputs queued in owned
        conversations."""
        from harness_core._inbox import withdraw_inputs

        index = self.index()
        for child in await ordinary_owned_work(self.tx, index, task):
            if not child.abort_requested:
                self.put(child.marked_for_abort("cascade"))
        for conversation in await owned_conversations(self.tx, task.id):
            await withdraw_inputs(self.tx, conversation.id)

    async def _finalize(self, task: Task, outcome: Outcome | None) -> None:
        assert outcome is not None
        final = task.model_copy(
            update={
                "state": TaskState(status="terminal", outcome=outcome),
                "memos": {},
                "ended_at": self.tx.now,
                "seq": self.tx.seq,
            }
        )
        self.tx.put_task(final)
        for record in await self.tx.scan_documents("task", task.id):
            await self.tx.retire_address((record.kind, record.scope, record.scope_id, record.key))
        if outcome.status in ("faulted", "orphaned"):
            await self.harness.on_task_failed(self.tx, final)
        await self._after_terminal(final)

    async def _after_terminal(self, task: Task) -> None:
        index = self.index()
        owner_ids: list[int] = []
        if task.owner_task_id is not None:
            owner_ids.append(task.owner_task_id)
        conversation = await self.tx.conversation(task.conversation_id)
        if conversation is not None and conversation.owner_task_id is not None:
            owner_ids.append(conversation.owner_task_id)
        failed = task.state.outcome is not None and task.state.outcome.status != "completed"
        for waiter in index.waiters_of(task.id):
            if failed and waiter.state.policy == "fail_fast":
                for other_id in waiter.state.on:
                    other = index.live(other_id)
                    if other is not None and not other.abort_requested:
                        self.put(other.marked_for_abort("fail_fast"))
            if waiter.id not in owner_ids:
                owner_ids.append(waiter.id)
        for owner_id in owner_ids:
            owner = index.live(owner_id)
            if owner is None:
                continue
            if owner.state.status == "completing":
                self.queue.append(owner.id) if owner.id in self.tx.local.tasks else self.put(owner)
            elif owner.state.status == "waiting" and resumable(owner, index, self.tx.now):
                if owner.abort_requested:
                    self.put(owner)  # the scheduler starts its abort invocation once work below drained
                else:
                    self._resume(owner)
            elif owner.abort_requested:
                self.harness.scheduler.request_pass()


async def reconcile(harness: Harness, tx: Tx) -> None:
    await Reconciler(harness, tx).run()
