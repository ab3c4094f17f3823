"""What every platform adapter looks like to the process that runs it (the `bots` CLI, or a test)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from adapters.bridge import Bridge


@runtime_checkable
class Adapter(Protocol):
    name: str  # "slack" | "discord" | "devchat"

    async def start(self, bridge: Bridge) -> None:
        """Attach a transport to the bridge, connect, catch up on missed messages, start intake."""
        ...

    async def stop(self) -> None:
        """Stop intake and close connections (graceful shutdown); the bridge and harness close after."""
        ...
