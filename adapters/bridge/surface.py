"""`BridgeLike`: what a platform adapter needs from the bridge, and nothing more.

A single process hands its adapters the `Bridge` itself; a worker that owns only some partitions of a shared
store hands them a `Router`, which sends each call to the partition that owns the place or gate (or commits it
for that partition's owner). Adapters type against this protocol so both work unchanged.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

from adapters.bridge.approvals import Action, ClickOrigin, Decision
from adapters.bridge.governor import RateGovernor
from adapters.bridge.intake import IntakeResult
from adapters.bridge.model import IncomingMessage, Place
from adapters.bridge.transport import Transport


class BridgeLike(Protocol):
    def attach(self, transport: Transport) -> None:
        """Deliver through `transport` (its `platform`), now and after any later change of partitions."""
        ...

    def governor(self, platform: str) -> RateGovernor:
        """The platform's rate governor, shared with every write the bridge makes there."""
        ...

    async def intake(self, message: IncomingMessage) -> IntakeResult:
        """Commit a human message, exactly once per identity. Acknowledge the platform after this returned."""
        ...

    async def decide(
        self,
        gate_id: int,
        *,
        user_id: str,
        user_name: str,
        action: Action,
        user_groups: Collection[str] | None = None,
        origin: ClickOrigin | None = None,
        platform: str | None = None,
        operator: bool = False,
    ) -> Decision:
        """Commit a decision on a gate (or refuse it). Acknowledge the click after this returned."""
        ...

    async def recorded_message_ids(self) -> set[str]: ...

    async def known_places(self, platform: str) -> list[Place]: ...

    async def watching_since(self, platform: str, workspace: str) -> int: ...

    async def catch_up(
        self, transport: Transport, places: Sequence[Place] | None = None, *, first_after: str | None = None
    ) -> int: ...

    async def place_doc(self, place: Place) -> dict[str, Any] | None:
        """Read-only: what is recorded about `place`, None if unseen."""
        ...

    async def gate_doc(self, gate_id: int) -> dict[str, Any] | None:
        """Read-only: the approval request `gate_id`, None if unknown."""
        ...
