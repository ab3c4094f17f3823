"""What a platform adapter implements for the bridge: post, edit and delete messages (with a durable key the
platform can echo back for reconciliation), render approval requests, read history for catch-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from adapters.bridge.model import IncomingMessage, Place
from adapters.bridge.text import neutralize_bidi, neutralize_value


@dataclass(frozen=True)
class GateView:
    """An approval request as the platform shows it (bidi controls in names and arguments made visible)."""

    gate_id: int
    tool: str
    arguments: dict[str, Any]
    requester_id: str | None
    requester_name: str | None
    status: str  # pending | approved | denied | expired | withdrawn
    decided_by: str | None
    decided_at: int | None
    expires_at: int
    approvers: tuple[str, ...] = ()  # who may approve: user ids as configured
    groups: tuple[str, ...] = ()  # ... or members of these user groups / roles

    def __post_init__(self) -> None:
        # Everything a card shows of the call and the people, with bidi controls made visible (every platform
        # renders from this view, so none can forget).
        for name in ("tool", "requester_name", "decided_by"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, neutralize_bidi(value))
        object.__setattr__(self, "arguments", neutralize_value(self.arguments))

    def approvers_on(self, platform: str) -> list[str]:
        """The approver ids that count on `platform`, without their `platform:` prefix (a card shows the
        people who can click on it, not another platform's ids)."""
        return _entries_on(platform, self.approvers)

    def groups_on(self, platform: str) -> list[str]:
        return _entries_on(platform, self.groups)


def _entries_on(platform: str, entries: tuple[str, ...]) -> list[str]:
    shown: list[str] = []
    for entry in entries:
        prefix, colon, rest = entry.partition(":")
        namespaced = bool(colon and rest and prefix.isidentifier() and prefix.islower())
        if not namespaced:
            shown.append(entry)  # a bare entry: only allowed while one platform runs
        elif prefix == platform:
            shown.append(rest)
    return shown


@runtime_checkable
class Transport(Protocol):
    platform: str
    max_chars: int  # longest message text the platform accepts
    edit_interval: float  # seconds between edits of one streaming message

    async def create(
        self, target: Place, text: str, key: str, *, final: bool = False, requester: str | None = None
    ) -> str:
        """Post a message into `target` (a channel, or a thread when `target.thread` is set) carrying `key`
        where `find` can see it (message metadata, a nonce). Returns the platform message id.

        `final` says the text is the finished answer (no edits will follow unless it must be repaired);
        otherwise it is the start of a streaming reply. `requester` is the platform user id of whoever asked
        (some platforms need it to stream), or None."""
        ...

    async def edit(self, target: Place, message_id: str, text: str, key: str, *, final: bool) -> None:
        """Replace the text of a message this bot posted."""
        ...

    async def delete(self, target: Place, message_id: str, key: str) -> None:
        """Remove a message this bot posted (a reply part the final text no longer needs). A message that is
        already gone is not an error (the delete may be repeated after a crash); raise `DeleteRefused` when the
        platform will not delete it (the bridge then edits it to nothing visible)."""
        ...

    async def find(self, target: Place, key: str) -> str | None:
        """The id of a message this bot posted into `target` with `key`, if any (reconciliation after a crash
        between posting and recording)."""
        ...

    async def post_approval(self, target: Place, gate: GateView, key: str) -> str:
        """Post an approval request as a message of its own: what is asked, by whom, who may approve, until
        when, with Approve/Deny buttons (and Withdraw, for the requester) encoding `gate.gate_id`."""
        ...

    async def update_approval(self, target: Place, message_id: str, gate: GateView) -> None:
        """Show the decision (who, when) in place of the buttons, or a disabled, labelled state, so a later
        click is answered privately ("already approved by lead at 14:02")."""
        ...

    async def history(self, place: Place, after: str | None) -> list[IncomingMessage]:
        """Human messages in `place` newer than message `after` (oldest first), for startup catch-up."""
        ...
