"""What every platform adapter looks like to the process that runs it (the `bots` CLI, or a test)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from adapters.bridge import BridgeLike


@runtime_checkable
class Adapter(Protocol):
    name: str  # "slack" | "discord" | "devchat"

    async def start(self, bridge: BridgeLike) -> None:
        """Attach a transport to the bridge, connect, catch up on missed messages, start intake. `bridge` is the
        process's `Bridge`, or a `Router` when the worker owns only some partitions of a shared store."""
        ...

    async def stop(self) -> None:
        """Stop intake and close connections (graceful shutdown); the bridge and harness close after."""
        ...
