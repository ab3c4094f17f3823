"""Durable records (DESIGN.md §2.3) as pydantic models.

Records are immutable in spirit: the harness replaces a whole task or submission record; entries and
conversations are written once. Ids come from one monotone sequence per storage; `seq` is the commit sequence
number of the commit that wrote the record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from harness_core.messages import Message

ROOT_CONVERSATION_ID = 1
T = TypeVar("T")


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- conversations ------------------------------------------------------------------------------------------


class ParentRef(_Record):
    conversation_id: int
    at: int  # the fork entry: the child sees parent entries up to and including it


class Conversation(_Record):
    id: int
    parent: ParentRef | None = None
    owner_task_id: int | None = None
    owner_conversation_id: int | None = None  # the owner task's conversation, derived at creation
    seq: int = 0


class Ownerless(_Record):
    kind: Literal["ownerless"] = "ownerless"


class TaskOwned(_Record):
    kind: Literal["task"] = "task"
    task_id: int


Ownership = Ownerless | TaskOwned


# --- entries ------------------------------------------------------------------------------------------------


class ContextEdit(_Record):
    target: int
    action: Literal["omit", "replace"]
    messages: list[Message] | None = None


EntryKind = str
CORE_USER = "core.user"
CORE_ASSISTANT = "core.assistant"
CORE_TOOL_RESULT = "core.tool-result"
CORE_SYSTEM = "core.system"
CORE_RESET = "core.reset"
CORE_COMPACTION = "core.compaction"
CORE_ENTRY_KINDS = frozenset(
    {CORE_USER, CORE_ASSISTANT, CORE_TOOL_RESULT, CORE_SYSTEM, CORE_RESET, CORE_COMPACTION}
)


class Entry(_Record):
    id: int
    conversation_id: int
    kind: EntryKind
    model: list[Message] | None = None
    data: Any = None
    head: int | None = None  # the context starts at this entry (a reset or compaction marker)
    edits: list[ContextEdit] | None = None
    by_task_id: int | None = None
    seq: int = 0


class EntryDraft(_Record):
    """An entry to append. `head="self"` makes the entry its own head marker (a reset)."""

    kind: EntryKind
    model: list[Message] | None = None
    data: Any = None
    head: int | Literal["self"] | None = None
    edits: list[ContextEdit] | None = None


# --- tasks --------------------------------------------------------------------------------------------------

TaskStatus = Literal["pending", "running", "waiting", "completing", "terminal"]
OutcomeStatus = Literal["completed", "failed", "aborted", "orphaned", "faulted"]
WaitPolicy = Literal["all_settled", "fail_fast"]


class TaskErrorInfo(_Record):
    message: str
    detail: Any = None


class Outcome(_Record):
    status: OutcomeStatus
    result: Any = None
    error: TaskErrorInfo | None = None
    reason: str | None = None


class TaskState(_Record):
    status: TaskStatus
    checkpoint: dict[str, Any] | None = None  # has a "phase"; present unless completing/terminal
    on: list[int] = Field(default_factory=list)  # waiting: tasks awaited
    policy: WaitPolicy = "all_settled"
    deadline: int | None = None  # waiting: resume at this time (ms) even if `on` is not settled
    woken: bool = (
        False  # an external event arrived: a waiting task resumes; a running one resumes its next wait
    )
    outcome: Outcome | None = None  # completing / terminal

    @property
    def live(self) -> bool:
        return self.status != "terminal"

    @property
    def phase(self) -> str | None:
        return None if self.checkpoint is None else str(self.checkpoint.get("phase"))


class Task(_Record):
    id: int
    conversation_id: int
    kind: str
    version: int = 1
    input: Any = None
    owner_task_id: int | None = None  # absent: owned by its conversation
    background: bool = False
    abort_requested: bool = False
    abort_reason: str | None = None
    state: TaskState
    memos: dict[str, Any] = Field(default_factory=dict)
    restarts: int = 0  # process deaths while running since the last committed progress
    parked: bool = False  # restart limit exceeded; not scheduled until retry_task()
    started_at: int | None = None
    ended_at: int | None = None
    seq: int = 0

    @property
    def live(self) -> bool:
        return self.state.status != "terminal"

    def marked_for_abort(self, reason: str) -> Task:
        """This task asked to abort for `reason`. A parked one is unparked with a fresh restart count: its abort
        handler is not the step that kept killing the process (`cancel` is how an operator gives up on it), and
        an abort that kills the process in turn is parked again after the limit."""
        update: dict[str, Any] = {"abort_requested": True, "abort_reason": reason}
        if self.parked:
            update |= {"parked": False, "restarts": 0}
        return self.model_copy(update=update)


# --- submissions --------------------------------------------------------------------------------------------

SubmissionStatus = Literal["queued", "placed", "done", "unanswered"]
WhenBusy = Literal["followUp", "steer", "reject"]


class Submission(_Record):
    id: int
    conversation_id: int
    request_id: str | None = None
    type: Literal["input", "write"]
    status: SubmissionStatus
    payload_hash: str = ""
    entry: int | None = None
    answer: int | None = None
    reason: str | None = None
    detail: str | None = None
    seq: int = 0

    @property
    def settled(self) -> bool:
        if self.type == "write":
            return self.status in ("done", "unanswered")
        return self.status in ("done", "unanswered")


# --- documents ----------------------------------------------------------------------------------------------

DocScope = Literal["session", "conversation", "task"]
DocHistory = Literal["latest", "rewindable"]
DocFork = Literal["initial", "current", "as_of"]


class DocumentRecord(_Record):
    id: int  # the incarnation; never reused
    kind: str
    key: str | None = None
    scope: DocScope
    scope_id: int | None = None  # conversation or task id; None for session scope
    history: DocHistory = "latest"
    fork: DocFork = "initial"
    created_seq: int
    retired_seq: int | None = None

    def alive_at(self, seq: int) -> bool:
        return self.created_seq <= seq and (self.retired_seq is None or seq < self.retired_seq)


class DocumentContent(_Record):
    """A stored document revision: a whole base, or an RFC 6902 patch against the previous revision."""

    seq: int
    version: int
    base: Any = None
    delta: list[dict[str, Any]] | None = None

    @property
    def is_base(self) -> bool:
        return self.delta is None


class DocumentValue(_Record):
    record: DocumentRecord
    version: int
    value: Any
    deltas_since_base: int = 0


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a scan. Pass `cursor` back to continue in the same order; None means no more items."""

    items: list[T]
    cursor: dict[str, Any] | None = None
