"""A bot on the bridge for tests that restart it: a harness over a real SQLite file (or memory), the bridge, a
`MemoryTransport` that outlives the process it is attached to, the faux model, and a clock that can jump."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.bridge import (
    ApprovalPolicy,
    Bridge,
    BridgeConfig,
    IncomingMessage,
    IntakeResult,
    Place,
    PlaceDoc,
)
from adapters.bridge.testing import MemoryTransport
from harness_core import AgentChange, Entry, Extension, Harness, HarnessSettings, ModelRef, Models, Registry
from harness_core.messages import AssistantMessage, ToolResultMessage, UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import FauxProvider, faux_assistant, faux_tool_call
from harness_core.storage import MemoryStorage, SqliteStorage

CHANNEL = Place("memory", "T1", "C1")
MODEL = AgentChange(model=ModelRef(provider="faux", model_id="m"))
Responder = Callable[[ModelRequest], AssistantMessage]


@dataclass
class Clock:
    """Wall-clock milliseconds plus an offset the test moves forward (a process that was down for a while)."""

    offset_ms: int = 0

    def __call__(self) -> int:
        return int(time.time() * 1000) + self.offset_ms


def user_texts(request: ModelRequest) -> list[str]:
    return [user_text(m) for m in request.messages if isinstance(m, UserMessage)]


def echo(request: ModelRequest) -> AssistantMessage:
    return faux_assistant(f"answer to {user_texts(request)[-1]}")


def deploy_flow(request: ModelRequest) -> AssistantMessage:
    """Asks for `deploy` (gated); answers the call's "awaits approval" result and, in a later turn of its own,
    the gate's outcome; answers anything else plainly."""
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):
        return faux_assistant(f"waiting: {last.text()}")
    text = user_texts(request)[-1]
    if text.startswith("(approval #"):
        return faux_assistant(f"deploy result: {text}")
    if "ship it" not in text:
        return faux_assistant(f"answer to {text}")
    return faux_assistant([faux_tool_call("deploy", {"service": "api"}, id="d1")])


def waiting_and_outcome(replies: list[str]) -> tuple[str, str]:
    """The two answers of one gated request: the "waiting" answer of its turn and the outcome's report."""
    waiting = [r for r in replies if r.startswith("waiting: ")]
    outcome = [r for r in replies if r.startswith("deploy result: ")]
    assert len(waiting) == 1 and len(outcome) == 1, replies
    return waiting[0], outcome[0]


def remind(request: ModelRequest) -> AssistantMessage:
    """Asks for a reminder in 10 minutes (the `schedule` tool); answers the reminder when it fires."""
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):
        return faux_assistant(f"ok: {last.text()}")
    text = user_texts(request)[-1]
    if text.startswith("(scheduled)"):
        return faux_assistant(f"reminder: {text}")
    return faux_assistant(
        [faux_tool_call("schedule", {"message": "check the deploy", "delay_minutes": 10}, id="s1")]
    )


@dataclass
class Bot:
    harness: Harness
    bridge: Bridge
    platform: MemoryTransport
    faux: FauxProvider
    closed: bool = field(default=False)

    async def say(
        self,
        message_id: str,
        text: str,
        *,
        user: str = "U1",
        name: str = "alice",
        place: Place = CHANNEL,
        mention: bool = True,
        dm: bool = False,
    ) -> IntakeResult:
        return await self.bridge.intake(
            IncomingMessage(place, message_id, user, name, text, mentions_bot=mention, is_dm=dm)
        )

    async def settle(self) -> None:
        """Every ordinary run finished and every reply shown."""
        await self.harness.wait_for_idle()
        for _ in range(50):
            await self.bridge.delivery.idle()
            await asyncio.sleep(0)
            if not self.bridge.delivery.workers:
                break

    async def conversation_of(self, place: Place) -> int:
        doc = await self.harness.snapshot(PlaceDoc, key=place.key)
        assert doc is not None, f"no conversation for {place.key}"
        return int(doc["conversation_id"])

    async def entries(self, place: Place) -> list[Entry]:
        handle = await self.harness.conversation(await self.conversation_of(place))
        assert handle is not None
        return list((await handle.entries(limit=500, order="asc")).items)

    async def user_entries(self, place: Place) -> list[str]:
        return [
            user_text(m)
            for e in await self.entries(place)
            for m in e.model or ()
            if isinstance(m, UserMessage)
        ]

    def requests_seeing(self, text: str) -> list[ModelRequest]:
        return [r for r in self.faux.requests if any(text in t for t in user_texts(r))]

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.bridge.stop()
            await self.harness.close()


async def open_bot(
    path: Path | None = None,
    *,
    responder: Responder = echo,
    tools: Sequence[Any] = (),
    approvals: Sequence[ApprovalPolicy] = (),
    config: BridgeConfig | None = None,
    platform: MemoryTransport | None = None,
    clock: Callable[[], int] | None = None,
    chunk_size: int = 8,
    delay_ms: float = 0,
    write_guard: Callable[[], None] | None = None,
) -> Bot:
    """Open (or reopen) a bot. Pass the `platform` of a previous bot to keep what it posted; `chunk_size` and
    `delay_ms` make the faux model stream slowly (many partials)."""
    faux = FauxProvider(chunk_size=chunk_size, delay_ms=delay_ms)
    faux.set_responder(responder)
    registry = Registry()
    storage = await SqliteStorage.open(path) if path is not None else await MemoryStorage.open()
    harness = await Harness.open(
        storage, models=Models(faux), registry=registry, settings=HarnessSettings(), now=clock
    )
    bridge = Bridge(harness, config=config, agent=MODEL, approvals=approvals, write_guard=write_guard)
    registry.install(bridge.extension())
    if tools:
        registry.install(Extension("tools", tools=list(tools)))
    transport = platform if platform is not None else MemoryTransport()
    bridge.attach(transport)
    await bridge.start()
    return Bot(harness, bridge, transport, faux)
