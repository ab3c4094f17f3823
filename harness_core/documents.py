"""Typed JSON documents stored next to the transcript and changed in the same atomic commits.

A definition says where a document lives (`scope`), whether its history can be read as of an entry
(`history`), what a fork starts with (`fork`), its `version` and how to `migrate` older stored values. Storage
keeps a base plus RFC 6902 patch deltas; `checkpoint_when` decides when a change writes a fresh base.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness_core._json import MAX_DEPTH, WRAPPED_DEPTH, strict_copy
from harness_core.errors import DraftRevoked
from harness_core.records import DocFork, DocHistory, DocScope, DocumentRecord

CheckpointWhen = Callable[[Any, list[dict[str, Any]], int], bool]
"""(new value, patch ops, deltas stored since the last base) -> write a base instead of a delta?"""


def every_n_deltas(n: int) -> CheckpointWhen:
    def rule(_value: Any, _ops: list[dict[str, Any]], deltas_since_base: int) -> bool:
        return deltas_since_base + 1 >= n

    return rule


def always_base(_value: Any, _ops: list[dict[str, Any]], _deltas: int) -> bool:
    return True


@dataclass(frozen=True, eq=False)
class DocDefinition:
    kind: str
    initial: Callable[..., Any]
    version: int = 1
    scope: DocScope = "conversation"
    history: DocHistory = "latest"
    fork: DocFork = "initial"
    migrate: Callable[[Any, int], Any] | None = None
    checkpoint_when: CheckpointWhen = field(default=every_n_deltas(32))
    family: bool = False  # addressed by key; initial(seed)

    def make_initial(self, seed: Any = None) -> Any:
        value = self.initial(seed) if self.family else self.initial()
        return strict_copy(value, f"{self.kind} initial value", limit=self.depth_limit)

    @property
    def depth_limit(self) -> int:
        """Nesting allowed in the value: `MAX_DEPTH`; core documents wrap values given to the harness (queued
        entries, partial messages), so they get the wrapped limit."""
        return WRAPPED_DEPTH if self.kind.startswith("core.") else MAX_DEPTH


def define_doc(
    kind: str,
    *,
    initial: Callable[..., Any] = dict,
    version: int = 1,
    scope: DocScope = "conversation",
    history: DocHistory = "latest",
    fork: DocFork = "initial",
    migrate: Callable[[Any, int], Any] | None = None,
    checkpoint_when: CheckpointWhen | None = None,
    family: bool = False,
) -> DocDefinition:
    """Define an application document. Kinds contain a dot and do not start with `core.`."""
    if "." not in kind or kind.startswith("core."):
        raise ValueError(f"document kind {kind!r} must contain a dot and not start with 'core.'")
    return _define(kind, initial, version, scope, history, fork, migrate, checkpoint_when, family)


def _define(
    kind: str,
    initial: Callable[..., Any],
    version: int,
    scope: DocScope,
    history: DocHistory,
    fork: DocFork,
    migrate: Callable[[Any, int], Any] | None,
    checkpoint_when: CheckpointWhen | None,
    family: bool,
) -> DocDefinition:
    if version < 1:
        raise ValueError(f"document {kind}: version must be a positive integer")
    if scope != "conversation" and (history != "latest" or fork != "initial"):
        raise ValueError(f"document {kind}: history and fork apply to conversation documents only")
    if fork == "as_of" and history != "rewindable":
        raise ValueError(f"document {kind}: fork='as_of' needs history='rewindable'")
    return DocDefinition(
        kind=kind,
        initial=initial,
        version=version,
        scope=scope,
        history=history,
        fork=fork,
        migrate=migrate,
        checkpoint_when=checkpoint_when or every_n_deltas(32),
        family=family,
    )


DocAddress = tuple[str, DocScope, int | None, str | None]


def address_of(definition: DocDefinition, scope_id: int | None, key: str | None) -> DocAddress:
    if definition.scope == "session":
        scope_id = None
    elif scope_id is None:
        raise ValueError(
            f"document {definition.kind} is {definition.scope}-scoped: pass its {definition.scope} id"
        )
    if definition.family and key is None:
        raise ValueError(f"document family {definition.kind} needs a key")
    if not definition.family and key is not None:
        raise ValueError(f"document {definition.kind} is not a family; it takes no key")
    return (definition.kind, definition.scope, scope_id, key)


class DocDraft:
    """A mutable copy of a document inside one commit callback.

    Mutate `draft.value` in place or assign a new value (checked for strict JSON at assignment). The draft is
    revoked when the callback returns; using it afterwards raises `DraftRevoked`.
    """

    __slots__ = (
        "_revoked",
        "_value",
        "created",
        "definition",
        "deltas",
        "original",
        "record",
        "stored_version",
    )

    def __init__(
        self,
        definition: DocDefinition,
        record: DocumentRecord,
        value: Any,
        *,
        original: Any,
        stored_version: int | None,
        created: bool,
        deltas: int = 0,
    ) -> None:
        self.definition = definition
        self.deltas = deltas  # deltas stored since the last base, for checkpoint_when
        self.record = record
        self.original = original  # the committed value (migrated), to diff against
        self.stored_version = stored_version  # None when created in this commit
        self.created = created
        self._value = value
        self._revoked = False

    @property
    def value(self) -> Any:
        if self._revoked:
            raise DraftRevoked(
                f"document {self.definition.kind} draft used after its commit callback returned"
            )
        return self._value

    @value.setter
    def value(self, new: Any) -> None:
        if self._revoked:
            raise DraftRevoked(
                f"document {self.definition.kind} draft used after its commit callback returned"
            )
        self._value = strict_copy(new, self.definition.kind, limit=self.definition.depth_limit)

    def _revoke(self) -> None:
        self._revoked = True

    def _final(self) -> Any:
        return self._value


def migrated(definition: DocDefinition, stored_version: int, value: Any) -> Any:
    """Bring a stored value up to the definition's version (in memory)."""
    from harness_core.errors import DocumentVersionError

    if stored_version == definition.version:
        return value
    if stored_version > definition.version:
        raise DocumentVersionError(
            f"document {definition.kind} is stored at version {stored_version}, newer than this code's "
            f"version {definition.version}; upgrade the code"
        )
    if definition.migrate is None:
        raise DocumentVersionError(
            f"document {definition.kind} is stored at version {stored_version} and version "
            f"{definition.version} has no migrate()"
        )
    return strict_copy(
        definition.migrate(copy.deepcopy(value), stored_version),
        f"{definition.kind} migration",
        limit=definition.depth_limit,
    )


# --- built-in conversation documents --------------------------------------------------------------------------


def _live_base(value: Any, _ops: list[dict[str, Any]], deltas: int) -> bool:
    # A fresh base whenever nothing is in flight keeps replay short without writing a base per partial.
    idle = not value.get("generation") and not any(
        s.get("status") == "running" for s in value.get("tools", [])
    )
    return idle or deltas >= 64


def _inbox_base(value: Any, _ops: list[dict[str, Any]], deltas: int) -> bool:
    return not value.get("items") or deltas >= 64


AgentDoc = _define("core.agent", dict, 1, "conversation", "rewindable", "as_of", None, always_base, False)
LiveDoc = _define("core.live", dict, 1, "conversation", "latest", "initial", None, _live_base, False)
InboxDoc = _define(
    "core.inbox", lambda: {"items": []}, 1, "conversation", "latest", "initial", None, _inbox_base, False
)
UsageDoc = _define(
    "core.usage",
    lambda: {"models": {}, "tools": {}},
    1,
    "conversation",
    "latest",
    "initial",
    None,
    always_base,
    False,
)
ProviderDoc = _define(
    "core.provider",
    lambda: {"session_id": ""},
    1,
    "conversation",
    "latest",
    "initial",
    None,
    always_base,
    False,
)
BUILTIN_DOCS: tuple[DocDefinition, ...] = (AgentDoc, LiveDoc, InboxDoc, UsageDoc, ProviderDoc)
