"""The commit line: one serialized sequence of atomic commits over one storage.

Commit callbacks run one at a time. Callbacks that are queued together form a group: each runs against the
state left by the previous ones (the group overlay), then the whole group is written to storage in one
transaction, and only then is anything published (listeners, caches, callers' results). A storage failure at
that point is uncertain, so the session closes with reason `failed`; an exception inside a callback only
discards that callback's writes. Preparing a commit is never uncertain: values are checked in `Tx.prepare`, and
a backend that still refuses a group while serializing it (before any write) raises `StrictJsonError`, which
fails that group's commits and leaves the session open.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from harness_core.documents import DocAddress
from harness_core.errors import HarnessClosed, InvalidOperation, StorageError, StrictJsonError
from harness_core.records import Conversation, DocumentRecord, Entry, Submission, Task
from harness_core.storage._protocol import CommitBatch, Storage

log = logging.getLogger("harness_core")

T = TypeVar("T")
MAX_GROUP = 256


@dataclass(frozen=True)
class TaskScope:
    """Commits made on behalf of a task: entries get `by_task_id`, created tasks default to its conversation."""

    task_id: int
    conversation_id: int


@dataclass
class DocPublication:
    record: DocumentRecord
    value: Any  # the new value; None after retirement
    ops: list[dict[str, Any]] | None  # the RFC 6902 patch, or None when the value was replaced wholesale
    created: bool = False
    retired: bool = False


@dataclass
class Publication:
    """Everything one commit wrote, handed to listeners after it is stored."""

    seq: int
    conversations: list[Conversation] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)
    submissions: list[Submission] = field(default_factory=list)
    docs: list[DocPublication] = field(default_factory=list)

    def touches_conversation(self, conversation_id: int) -> bool:
        return (
            any(e.conversation_id == conversation_id for e in self.entries)
            or any(
                d.record.scope_id == conversation_id and d.record.scope == "conversation" for d in self.docs
            )
            or any(s.conversation_id == conversation_id for s in self.submissions)
            or any(t.conversation_id == conversation_id for t in self.tasks)
        )


@dataclass(frozen=True)
class CloseInfo:
    reason: str  # "closed" | "failed"
    error: BaseException | None = None


@dataclass
class _Pending:
    fn: Callable[[Any], Any]
    future: asyncio.Future[Any]
    scope: TaskScope | None


PrepareHook = Callable[[Any], Awaitable[None]]
CreationHook = Callable[[Any, Conversation], Awaitable[None]]
Listener = Callable[[Publication], None]


class Session:
    def __init__(
        self,
        storage: Storage,
        *,
        next_id: int,
        last_seq: int,
        now: Callable[[], int] | None = None,
        id_stride: int = 1,
        id_offset: int = 0,
    ) -> None:
        from harness_core._layers import Published

        if id_stride < 1 or not 0 <= id_offset < id_stride:
            raise ValueError(f"id_offset {id_offset} must be in 0..{id_stride - 1} (id_stride {id_stride})")
        self.storage = storage
        self.published = Published()
        # A partition of a shared store mints only its own ids (`id % id_stride == id_offset`), so ids are
        # unique across the store and say their partition. Id 1 is reserved for the root conversation.
        self.id_stride = id_stride
        self.id_offset = id_offset
        self._next_id = first_id_from(max(next_id, 2), id_stride, id_offset)
        self._next_seq = last_seq + 1
        self.last_seq = last_seq
        self.now: Callable[[], int] = now or (lambda: int(time.time() * 1000))
        self._queue: deque[_Pending] = deque()
        self._wakeup = asyncio.Event()
        self._sealed = False
        self.read_only = False  # set by Harness.open(read_only=True): commits and scheduling refused
        self._failure: BaseException | None = None
        self.closed: asyncio.Future[CloseInfo] = asyncio.get_running_loop().create_future()
        self._listeners: list[Listener] = []
        self._prepare_hooks: list[PrepareHook] = []
        self._creation_hooks: list[CreationHook] = []
        self.on_report: Callable[[BaseException], None] = lambda exc: log.error(
            "reported: %s", exc, exc_info=exc
        )
        self._line = asyncio.get_running_loop().create_task(self._run_line(), name="harness-commit-line")

    # --- admission --------------------------------------------------------------------------------------------

    @property
    def failed(self) -> bool:
        return self._failure is not None

    @property
    def finishes_ingress(self) -> bool:
        """Whether the storage keeps ingress records and finishes them in the commit that takes them in
        (an optional storage capability: only the PostgreSQL store declares it)."""
        return bool(getattr(self.storage, "finishes_ingress", False))

    @property
    def sealed(self) -> bool:
        return self._sealed

    def check_open(self) -> None:
        if self._failure is not None:
            raise HarnessClosed("failed", self._failure)
        if self._sealed:
            raise HarnessClosed("closed")

    @overload
    async def commit(self, fn: Callable[[Any], Awaitable[T]], *, scope: TaskScope | None = None) -> T: ...

    @overload
    async def commit(self, fn: Callable[[Any], T], *, scope: TaskScope | None = None) -> T: ...

    async def commit(self, fn: Callable[[Any], Any], *, scope: TaskScope | None = None) -> Any:
        """Run `fn(tx)` on the line; return its result once its writes are stored.

        Cancelling the caller does not cancel an admitted commit: it still lands (or fails) as a whole.
        """
        self.check_open()
        if self.read_only:
            raise InvalidOperation("this harness was opened read-only; commits need the storage's owner")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_consume_exception)
        self._queue.append(_Pending(fn, future, scope))
        self._wakeup.set()
        return await asyncio.shield(future)

    def mint_id(self) -> int:
        value = self._next_id
        self._next_id += self.id_stride
        return value

    def owns_id(self, record_id: int) -> bool:
        """Whether `record_id` belongs to this session's partition (always, on a one-process store)."""
        return record_id % self.id_stride == self.id_offset

    # --- hooks and listeners ----------------------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)

        def dispose() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return dispose

    def add_prepare_hook(self, hook: PrepareHook) -> None:
        """Runs inside every commit after its callback, before its writes are prepared."""
        self._prepare_hooks.append(hook)

    def add_creation_hook(self, hook: CreationHook) -> None:
        """Runs inside the commit that creates or forks a conversation, right after the record is made."""
        self._creation_hooks.append(hook)

    async def run_creation_hooks(self, tx: Any, conversation: Conversation) -> None:
        for hook in self._creation_hooks:
            await hook(tx, conversation)

    # --- the line ---------------------------------------------------------------------------------------------

    async def _run_line(self) -> None:
        from harness_core._layers import Layer
        from harness_core._tx import Tx

        while True:
            if not self._queue:
                if self._sealed or self._failure is not None:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            overlay = Layer()
            group: list[tuple[_Pending, CommitBatch, Publication, Any]] = []
            while self._queue and len(group) < MAX_GROUP:
                pending = self._queue.popleft()
                tx = Tx(self, overlay, seq=self._next_seq, scope=pending.scope)
                try:
                    result = pending.fn(tx)
                    if inspect.isawaitable(result):
                        result = await result
                    for hook in self._prepare_hooks:
                        await hook(tx)
                    batch, publication = await tx.prepare()
                except Exception as exc:  # the callback's writes are discarded; the session stays healthy
                    tx.revoke()
                    if not pending.future.done():
                        pending.future.set_exception(exc)
                    continue
                tx.revoke()
                self._next_seq += 1
                batch.next_id = self._next_id
                overlay.merge(tx.local)
                group.append((pending, batch, publication, result))
            if not group:
                continue
            try:
                await self.storage.commit([item[1] for item in group])
            except StrictJsonError as exc:
                # The backend refused the group while serializing it, before writing anything: certain, not
                # uncertain. The group's commits fail with the error and the line goes on (their ids and seqs
                # are skipped, which storage allows).
                log.error("storage refused a commit before writing it: %s", exc)
                for pending, *_ in group:
                    if not pending.future.done():
                        pending.future.set_exception(exc)
                continue
            except BaseException as exc:
                self._fail(exc, [item[0] for item in group])
                if not isinstance(exc, Exception):
                    raise
                return
            self.published.adopt(overlay)
            for pending, batch, publication, result in group:
                self.last_seq = batch.seq
                for listener in list(self._listeners):
                    try:
                        listener(publication)
                    except Exception as exc:  # a listener must not break the line
                        self.on_report(exc)
                if not pending.future.done():
                    pending.future.set_result(result)

    def _fail(self, exc: BaseException, group: Sequence[_Pending]) -> None:
        log.error("storage failed during a commit; the harness closes: %s", exc)
        self._failure = exc
        self._sealed = True
        error = HarnessClosed("failed", exc)
        for pending in [*group, *self._queue]:
            if not pending.future.done():
                pending.future.set_exception(error)
        self._queue.clear()
        if not self.closed.done():
            self.closed.set_result(CloseInfo("failed", exc))

    async def close(self) -> CloseInfo:
        """Seal admission, let admitted commits settle, close the storage."""
        self._sealed = True
        self._wakeup.set()
        await asyncio.gather(self._line, return_exceptions=True)
        try:
            await self.storage.close()
        except StorageError as exc:
            self.on_report(exc)
        if not self.closed.done():
            self.closed.set_result(CloseInfo("closed"))
        return self.closed.result()

    # --- reads (outside commits: durable state only) ------------------------------------------------------------

    async def read_task(self, task_id: int) -> Task | None:
        found = self.published.live_tasks.get(task_id)
        if found is not None:
            return found
        hit, ended = self.published.ended.get(task_id)
        if hit:
            return ended
        return await self.storage.task(task_id)

    async def read_conversation(self, conversation_id: int) -> Conversation | None:
        hit, found = self.published.conversations.get(conversation_id)
        if hit:
            return found
        return await self.storage.conversation(conversation_id)

    async def read_doc_state(self, address: DocAddress) -> Any:
        from harness_core._layers import DocState

        hit, state = self.published.docs.get(address)
        if hit:
            return state
        record = await self.storage.find_document(*address)
        if record is None:
            return None
        stored = await self.storage.document(record.id)
        if stored is None:
            return None
        return DocState(stored.record, stored.version, stored.value, stored.deltas_since_base)


def first_id_from(start: int, stride: int, offset: int) -> int:
    """The smallest id >= `start` with `id % stride == offset`."""
    return start + (offset - start) % stride


def _consume_exception(future: asyncio.Future[Any]) -> None:
    # The caller may have been cancelled while the commit failed; nobody else will read the exception.
    if not future.cancelled():
        future.exception()
