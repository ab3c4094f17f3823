"""`MemoryTransport`: an in-memory platform for testing bots on the bridge without any network.

It keeps channels as lists of messages (with the key each was posted with), records every call, and can be
told to fail a call once (e.g. raise `RetryLater`) or to lose the response of a create (the message exists,
the caller never learns its id: what a crash between posting and recording looks like).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
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
