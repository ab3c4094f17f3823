"""`MemoryTransport`: an in-memory platform for testing bots on the bridge without any network; `MemoryIngress`:
the ingress records of a shared store, in memory, for routers in tests.

It keeps channels as lists of messages (with the key each was posted with), records every call, and can be
told to fail a call once (e.g. raise `RetryLater`) or to lose the response of a create (the message exists,
the caller never learns its id: what a crash between posting and recording looks like).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from adapters.bridge.model import DeleteRefused, IncomingMessage, Place, TransportError
from adapters.bridge.transport import GateView


@dataclass
class PostedMessage:
    id: str
    target: Place
    text: str
    key: str
    edits: list[str] = field(default_factory=list)
    gate: GateView | None = None


class LostResponse(TransportError):
    """The platform stored the message but the caller never got the response."""


class MemoryTransport:
    def __init__(
        self, platform: str = "memory", *, max_chars: int = 4000, edit_interval: float = 0.0
    ) -> None:
        self.platform = platform
        self.max_chars = max_chars
        self.edit_interval = edit_interval
        self.messages: list[PostedMessage] = []
        self.calls: list[tuple[str, str]] = []
        self.creates: list[dict[str, Any]] = []  # what `create` was told: key, final, requester
        self.human: dict[str, list[IncomingMessage]] = {}  # place key -> history for catch-up
        self.failures: dict[str, list[Exception]] = {}
        self.lose_next_create = False
        self.refuse_deletes = False  # a platform that will not delete (the bridge then blanks the message)
        self.on_create: Callable[[PostedMessage], None] | None = None
        self._ids = itertools.count(1000)

    def fail_next(self, method: str, error: Exception) -> None:
        self.failures.setdefault(method, []).append(error)

    def _maybe_fail(self, method: str) -> None:
        queue = self.failures.get(method)
        if queue:
            raise queue.pop(0)

    def in_place(self, target: Place) -> list[PostedMessage]:
        return [m for m in self.messages if m.target == target]

    def by_id(self, message_id: str) -> PostedMessage:
        return next(m for m in self.messages if m.id == message_id)

    async def create(
        self, target: Place, text: str, key: str, *, final: bool = False, requester: str | None = None
    ) -> str:
        self.calls.append(("create", key))
        self.creates.append({"key": key, "final": final, "requester": requester})
        self._maybe_fail("create")
        message = PostedMessage(id=str(next(self._ids)), target=target, text=text, key=key)
        self.messages.append(message)
        if self.on_create is not None:
            self.on_create(message)
        if self.lose_next_create:
            self.lose_next_create = False
            raise LostResponse(f"response for {key} lost")
        return message.id

    async def edit(self, target: Place, message_id: str, text: str, key: str, *, final: bool) -> None:
        self.calls.append(("edit", key))
        self._maybe_fail("edit")
        message = self.by_id(message_id)
        message.edits.append(text)
        message.text = text

    async def delete(self, target: Place, message_id: str, key: str) -> None:
        self.calls.append(("delete", key))
        self._maybe_fail("delete")
        if self.refuse_deletes:
            raise DeleteRefused(f"{message_id}: not allowed")
        self.messages = [m for m in self.messages if m.id != message_id]  # gone already: fine

    async def find(self, target: Place, key: str) -> str | None:
        self.calls.append(("find", key))
        return next((m.id for m in self.messages if m.target == target and m.key == key), None)

    async def post_approval(self, target: Place, gate: GateView, key: str) -> str:
        self.calls.append(("post_approval", key))
        message = PostedMessage(
            id=str(next(self._ids)), target=target, text=f"approve {gate.tool}?", key=key, gate=gate
        )
        self.messages.append(message)
        return message.id

    async def update_approval(self, target: Place, message_id: str, gate: GateView) -> None:
        self.calls.append(("update_approval", str(gate.gate_id)))
        message = self.by_id(message_id)
        message.gate = gate
        message.text = f"{gate.tool}: {gate.status} by {gate.decided_by}"

    async def history(self, place: Place, after: str | None) -> list[IncomingMessage]:
        self.calls.append(("history", place.key))
        found = self.human.get(place.key, [])
        return [m for m in found if after is None or float(m.message_id) > float(after)]

    def texts(self, target: Place) -> list[str]:
        return [m.text for m in self.in_place(target)]

    def snapshot(self) -> list[dict[str, Any]]:
        return [{"id": m.id, "key": m.key, "text": m.text} for m in self.messages]


@dataclass(frozen=True)
class MemoryIngressRecord:
    id: int
    partition: int
    kind: str
    key: str
    payload: dict[str, Any]
    created_ms: int = 0


class MemoryIngress:
    """The `Ingress` protocol in memory, shared by the routers of one test (the workers). Payloads go through
    strict JSON as the store would store them. `notify = False` loses notifications (the consumers must poll);
    `fail_next(method, error)` makes one call fail."""

    def __init__(self) -> None:
        self.records: dict[int, MemoryIngressRecord] = {}
        self.finished: set[int] = set()
        self.notify = True
        self.finish_calls = 0  # statements that finished records (a consumer finishes a batch in one)
        self.pending_calls: list[frozenset[int]] = []  # the partitions each `pending_ingress` asked for
        self._keys: set[str] = set()
        self._ids = itertools.count(1)
        self._callbacks: list[Callable[[int], None]] = []
        self._fail: dict[str, Exception] = {}

    def fail_next(self, method: str, error: Exception) -> None:
        self._fail[method] = error

    def _maybe_fail(self, method: str) -> None:
        error = self._fail.pop(method, None)
        if error is not None:
            raise error

    async def put_ingress(self, partition: int, kind: str, key: str, payload: dict[str, Any]) -> bool:
        self._maybe_fail("put_ingress")
        stored = json.loads(json.dumps(payload, allow_nan=False, ensure_ascii=False).encode("utf-8"))
        if key in self._keys:
            return False
        self._keys.add(key)
        record_id = next(self._ids)
        self.records[record_id] = MemoryIngressRecord(record_id, partition, kind, key, stored)
        if self.notify:
            for callback in list(self._callbacks):
                callback(partition)
        return True

    def put_raw(self, partition: int, kind: str, key: str, payload: dict[str, Any]) -> int:
        """A record as some other writer left it (no JSON check, no notification): for poison records."""
        record_id = next(self._ids)
        self._keys.add(key)
        self.records[record_id] = MemoryIngressRecord(record_id, partition, kind, key, payload)
        return record_id

    async def pending_ingress(
        self, partitions: Collection[int], limit: int = 100
    ) -> list[MemoryIngressRecord]:
        self._maybe_fail("pending_ingress")
        wanted = frozenset(partitions)
        self.pending_calls.append(wanted)
        pending = [
            r for i, r in sorted(self.records.items()) if i not in self.finished and r.partition in wanted
        ]
        return pending[:limit]

    async def finish_ingress(self, record_id: int) -> None:
        await self.finish_ingresses([record_id])

    async def finish_ingresses(self, record_ids: Collection[int]) -> None:
        self._maybe_fail("finish_ingress")
        self.finish_calls += 1
        self.finished.update(record_ids)

    async def drop_ingresses(self, record_ids: Collection[int]) -> None:
        self._maybe_fail("drop_ingresses")
        for record_id in record_ids:
            record = self.records.pop(record_id, None)
            if record is not None:
                self._keys.discard(record.key)

    def on_ingress(self, callback: Callable[[int], None]) -> Callable[[], None]:
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return unsubscribe

    def unfinished(self) -> list[MemoryIngressRecord]:
        return [r for i, r in sorted(self.records.items()) if i not in self.finished]
