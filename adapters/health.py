"""Transport health of a chat adapter's long-lived connection (Slack Socket Mode, the Discord gateway).

A connection can be "connected but deaf": the socket is up, but nothing arrives any more (a half-open TCP
connection, a silently dropped NAT mapping, a server that stopped answering). The platform libraries notice
it by their keep-alive (slack-sdk: a ping without a pong; discord.py: no HEARTBEAT_ACK or other frame within
`heartbeat_timeout`) and reconnect. The adapters count what happened here, so an operator can see it:
`adapter.health()` returns a copy, and every stale detection is logged once as a WARNING.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class TransportHealth:
    platform: str
    connected: bool = False
    """A connection is open and was not found stale since."""
    connections_opened: int = 0
    """Connections established (Slack: a Socket Mode WebSocket; Discord: a gateway session READY or RESUMED)."""
    reconnects: int = 0
    """Connections established after the first (for any reason: stale, closed by the platform, rotated)."""
    stale_detections: int = 0
    """Open connections given up on because nothing came back in time (no pong, no heartbeat ACK)."""
    last_stale_reason: str | None = None

    def opened(self) -> None:
        if self.connections_opened:
            self.reconnects += 1
        self.connections_opened += 1
        self.connected = True

    def lost(self) -> None:
        self.connected = False

    def stale(self, reason: str) -> None:
        self.stale_detections += 1
        self.last_stale_reason = reason
        self.connected = False

    def copy(self) -> TransportHealth:
        return dataclasses.replace(self)

    def summary(self) -> str:
        """One line for operators: `2 connection(s) opened, 1 reconnect(s), 1 stale (last: no pong ...)`."""
        text = (
            f"{self.connections_opened} connection(s) opened, {self.reconnects} reconnect(s), "
            f"{self.stale_detections} stale"
        )
        if self.last_stale_reason is not None:
            text += f" (last: {self.last_stale_reason})"
        return text


def health_of(adapter: object) -> TransportHealth | None:
    """The adapter's `health()` if it has one (Slack, Discord; devchat holds no outgoing connection)."""
    method = getattr(adapter, "health", None)
    health = method() if callable(method) else None
    return health if isinstance(health, TransportHealth) else None
