"""`DevchatTransport`: the bridge's view of devchat. Bot messages and approval cards are rows of the chat store,
stored with the bridge's key (so `find` reconciles after a crash, and a repeated create with the same key returns
the message already there); every change is broadcast to the open pages by the store's listeners."""

from __future__ import annotations

import dataclasses
from typing import Any

from adapters.bridge import DeleteRefused, GateView, IncomingMessage, MessageGone, Place, TransportError
from adapters.devchat.store import ChatStore

PLATFORM = "devchat"


def thread_id(place: Place) -> int | None:
    if place.thread is None:
        return None
    try:
        return int(place.thread)
    except ValueError:
        raise TransportError(f"devchat has no thread {place.thread!r}") from None


def gate_json(gate: GateView) -> dict[str, Any]:
    shown = dataclasses.asdict(gate)
    # The page lists who may approve here: devchat's own names, without the `devchat:` prefix.
    shown["approvers"] = gate.approvers_on(PLATFORM)
    shown["groups"] = gate.groups_on(PLATFORM)
    return shown


def gate_text(gate: GateView) -> str:
    """The card as plain text (the page renders the structured gate; this is for logs and exports)."""
    arguments = ", ".join(f"{k}={v!r}" for k, v in gate.arguments.items())
    head = f"{gate.tool}({arguments})"
    if gate.status == "pending":
        asker = f" asked by {gate.requester_name}" if gate.requester_name else ""
        return f"Approval needed: {head}{asker}"
    if gate.status == "expired":
        return f"{head}: expired (not approved in time)"
    return f"{head}: {gate.status} by {gate.decided_by or 'an approver'}"


def mentions(text: str, bot_name: str) -> bool:
    token = f"@{bot_name}".lower()
    lowered = text.lower()
    start = lowered.find(token)
    while start != -1:
        before = lowered[start - 1] if start > 0 else " "
        end = start + len(token)
        after = lowered[end] if end < len(lowered) else " "
        if not (before.isalnum() or before in "@_") and not (after.isalnum() or after in "_-"):
            return True
        start = lowered.find(token, start + 1)
    return False


class DevchatTransport:
    platform = PLATFORM

    def __init__(
        self,
        store: ChatStore,
        *,
        workspace: str,
        bot_name: str,
        max_chars: int,
        edit_interval: float,
    ) -> None:
        self.store = store
        self.workspace = workspace
        self.bot_name = bot_name
        self.max_chars = max_chars
        self.edit_interval = edit_interval

    def place(self, channel: str, thread: int | None) -> Place:
        return Place(PLATFORM, self.workspace, channel, None if thread is None else str(thread))

    def _check(self, target: Place) -> None:
        if self.store.closed:
            raise TransportError("devchat is stopped")
        if target.platform != PLATFORM or target.workspace != self.workspace:
            raise TransportError(f"{target.key} is not a place of this devchat")

    async def create(
        self, target: Place, text: str, key: str, *, final: bool = False, requester: str | None = None
    ) -> str:
        self._check(target)
        message, created = await self.store.add_bot(
            target.channel,
            thread_id(target),
            kind="bot",
            author=self.bot_name,
            text=text,
            key=key,
            final=final,
        )
        if not created:
            await self.store.update(message["id"], text=text, final=final)
        return str(message["id"])

    async def edit(self, target: Place, message_id: str, text: str, key: str, *, final: bool) -> None:
        self._check(target)
        updated = await self.store.update(int(message_id), text=text, final=final)
        if updated is None:
            raise MessageGone(f"devchat message {message_id} does not exist")

    async def delete(self, target: Place, message_id: str, key: str) -> None:
        self._check(target)
        if not await self.store.delete_bot(int(message_id)):
            raise DeleteRefused(f"devchat message {message_id} has replies")

    async def find(self, target: Place, key: str) -> str | None:
        self._check(target)
        found = await self.store.find_key(target.channel, thread_id(target), key)
        return None if found is None else str(found)

    async def post_approval(self, target: Place, gate: GateView, key: str) -> str:
        self._check(target)
        message, created = await self.store.add_bot(
            target.channel,
            thread_id(target),
            kind="approval",
            author=self.bot_name,
            text=gate_text(gate),
            key=key,
            gate=gate_json(gate),
        )
        if not created:
            await self.store.update(message["id"], text=gate_text(gate), gate=gate_json(gate))
        return str(message["id"])

    async def update_approval(self, target: Place, message_id: str, gate: GateView) -> None:
        self._check(target)
        updated = await self.store.update(int(message_id), text=gate_text(gate), gate=gate_json(gate))
        if updated is None:
            raise MessageGone(f"devchat message {message_id} does not exist")

    async def history(self, place: Place, after: str | None) -> list[IncomingMessage]:
        self._check(place)
        found = await self.store.humans_after(
            place.channel, thread_id(place), None if after is None else int(after)
        )
        return [self.incoming(m) for m in found]

    def incoming(self, message: dict[str, Any]) -> IncomingMessage:
        author = str(message["author"])
        return IncomingMessage(
            place=self.place(str(message["channel"]), message["thread"]),
            message_id=str(message["id"]),
            user_id=author,  # devchat has no accounts: a user is the display name they chose
            user_name=author,
            text=str(message["text"]),
            mentions_bot=mentions(str(message["text"]), self.bot_name),
        )
