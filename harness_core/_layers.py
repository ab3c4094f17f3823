"""In-memory state around the storage.

- `Layer`: writes not yet published. A commit callback writes into its own layer; a successful callback's
  layer merges into the group overlay; after the group is stored the overlay merges into `Published`.
- `Published`: caches of durable state only (every live task, plus bounded LRU caches of conversations and
  current document values). Reads outside commits see storage plus `Published`, so nothing that is not yet
  stored is ever observable.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from harness_core.documents import DocAddress
from harness_core.records import Conversation, DocumentRecord, Entry, Submission, Task

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A small bounded mapping; least recently used keys fall out first."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> tuple[bool, V | None]:
        if key in self._data:
            self._data.move_to_end(key)
            return True, self._data[key]
        return False, None

    def put(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self._capacity:
            self._data.popitem(last=False)

    def discard(self, key: K) -> None:
        self._data.pop(key, None)

    def __len__(self) -> int:
        return len(self._data)


@dataclass
class DocState:
    """A document incarnation's current value as stored (`version` is the stored version)."""

    record: DocumentRecord
    version: int
    value: Any
    deltas_since_base: int = 0


@dataclass
class Layer:
    conversations: dict[int, Conversation] = field(default_factory=dict)
    entries: dict[int, Entry] = field(default_factory=dict)
    entries_by_conv: dict[int, list[Entry]] = field(default_factory=dict)
    tasks: dict[int, Task] = field(default_factory=dict)
    submissions: dict[int, Submission] = field(default_factory=dict)
    by_request: dict[tuple[int, str], int] = field(default_factory=dict)
    docs: dict[DocAddress, DocState | None] = field(default_factory=dict)  # None: retired at this address
    owned_conversations: dict[int, list[int]] = field(default_factory=dict)
    # Ids of the tasks written here, by owner task, by conversation and by each task a version waits on, so a
    # commit's live-task lookups (`LiveView`) do not scan the whole group overlay. Ids are only ever added: a
    # later version of a task may no longer match, so readers re-check the task they get (a superset is safe).
    task_owners: dict[int, set[int]] = field(default_factory=dict)
    task_conversations: dict[int, set[int]] = field(default_factory=dict)
    task_waiters: dict[int, set[int]] = field(default_factory=dict)

    def add_conversation(self, conversation: Conversation) -> None:
        self.conversations[conversation.id] = conversation
        if conversation.owner_task_id is not None:
            self.owned_conversations.setdefault(conversation.owner_task_id, []).append(conversation.id)

    def put_task(self, task: Task) -> None:
        self.tasks[task.id] = task
        if task.owner_task_id is not None:
            self.task_owners.setdefault(task.owner_task_id, set()).add(task.id)
        self.task_conversations.setdefault(task.conversation_id, set()).add(task.id)
        if task.state.status == "waiting":
            for other in task.state.on:
                self.task_waiters.setdefault(other, set()).add(task.id)

    def add_entry(self, entry: Entry) -> None:
        self.entries[entry.id] = entry
        self.entries_by_conv.setdefault(entry.conversation_id, []).append(entry)

    def put_submission(self, submission: Submission) -> None:
        self.submissions[submission.id] = submission
        if submission.request_id is not None:
            self.by_request[(submission.conversation_id, submission.request_id)] = submission.id

    def merge(self, other: Layer) -> None:
        for conversation in other.conversations.values():
            self.add_conversation(conversation)
        for entry in other.entries.values():
            self.add_entry(entry)
        for task in other.tasks.values():
            self.put_task(task)
        for submission in other.submissions.values():
            self.put_submission(submission)
        self.docs.update(other.docs)


class Published:
    """Durable state kept in memory. Updated only after storage acknowledged the writes."""

    def __init__(
        self, *, conversation_capacity: int = 4096, doc_capacity: int = 4096, ended_capacity: int = 512
    ) -> None:
        self.live_tasks: dict[int, Task] = {}
        # Tasks that ended recently, as stored: an owner reads its children's outcomes right after they end
        # (a generation after its tool round), which would otherwise be a storage read each. Every task write
        # passes through adopt(), which refreshes or drops the entry, so a hit is the stored record.
        self.ended: LRU[int, Task] = LRU(ended_capacity)
        self.conversations: LRU[int, Conversation] = LRU(conversation_capacity)
        self.docs: LRU[DocAddress, DocState | None] = LRU(doc_capacity)
        # Ids of the conversations each live task owns, so reconciliation (which asks whenever a task ends)
        # need not scan storage on the commit line. Ownership is fixed when a conversation is created and
        # needs a live owner, so a task created after open starts with [] and adopt() sees all it will own;
        # a task loaded at open is filled by its first scan. Entries leave with their task.
        self.owned: dict[int, list[int]] = {}
        # Indexes over the live tasks, kept current by adopt(), so a commit never rebuilds them: by owner task,
        # by conversation, by status, and the reverse of waits (task -> tasks waiting on it).
        self.by_owner: dict[int, set[int]] = {}
        self.by_conversation: dict[int, set[int]] = {}
        self.by_status: dict[str, set[int]] = {}
        self.waiters: dict[int, set[int]] = {}
        # Task-scoped documents of tasks created by this process (complete; tasks loaded at open are absent).
        self.task_docs: dict[int, set[DocAddress]] = {}
        # Submissions not settled yet (queued or placed) that this process wrote: runs settle them soon.
        self.open_submissions: dict[int, Submission] = {}

    def load_tasks(self, tasks: dict[int, Task]) -> None:
        """The live tasks found at open."""
        for task in tasks.values():
            self._index(task)
        self.live_tasks = dict(tasks)

    def _index(self, task: Task) -> None:
        if task.owner_task_id is not None:
            self.by_owner.setdefault(task.owner_task_id, set()).add(task.id)
        self.by_conversation.setdefault(task.conversation_id, set()).add(task.id)
        self.by_status.setdefault(task.state.status, set()).add(task.id)
        if task.state.status == "waiting":
            for other in task.state.on:
                self.waiters.setdefault(other, set()).add(task.id)

    def _unindex(self, task: Task) -> None:
        if task.owner_task_id is not None:
            _discard(self.by_owner, task.owner_task_id, task.id)
        _discard(self.by_conversation, task.conversation_id, task.id)
        _discard(self.by_status, task.state.status, task.id)
        if task.state.status == "waiting":
            for other in task.state.on:
                _discard(self.waiters, other, task.id)

    def adopt(self, layer: Layer) -> None:
        for task in layer.tasks.values():  # tasks first: a conversation may be owned by a task of this layer
            previous = self.live_tasks.get(task.id)
            if previous is not None:
                self._unindex(previous)
            if task.live:
                if previous is None:
                    self.owned.setdefault(task.id, [])
                    self.task_docs.setdefault(task.id, set())
                self.live_tasks[task.id] = task
                self._index(task)
                self.ended.discard(task.id)
            else:
                self.live_tasks.pop(task.id, None)
                self.ended.put(task.id, task)
                self.owned.pop(task.id, None)
                self.task_docs.pop(task.id, None)
        for submission in layer.submissions.values():
            if submission.status in ("queued", "placed"):
                self.open_submissions[submission.id] = submission
            else:
                self.open_submissions.pop(submission.id, None)
        for conversation in layer.conversations.values():
            self.conversations.put(conversation.id, conversation)
            owner = conversation.owner_task_id
            owned = None if owner is None else self.owned.get(owner)
            if owned is not None and conversation.id not in owned:
                owned.append(conversation.id)
        for address, state in layer.docs.items():
            self.docs.put(address, state)
            if address[1] == "task" and address[2] is not None:
                known = self.task_docs.get(address[2])
                if known is not None:
                    if state is None:
                        known.discard(address)
                    else:
                        known.add(address)


def _discard(mapping: dict[Any, set[int]], key: Any, task_id: int) -> None:
    ids = mapping.get(key)
    if ids is not None:
        ids.discard(task_id)
        if not ids:
            del mapping[key]
