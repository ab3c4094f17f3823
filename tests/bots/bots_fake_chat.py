"""A tiny adapter for tests of the `bots` CLI: the bridge's MemoryTransport plus scripted intake.

Loaded through the config (`[adapters.fake] module = "bots_fake_chat"`, with tests/bots on PYTHONPATH), so a
real `python -m bots run` process can be driven without a chat platform. Options:

- `messages`: [{id, text, user?, name?}] taken in at start (exactly once across restarts: same ids);
- `inbox`: a JSONL file polled while running for more messages and for approval clicks
  (`{"click": gate id, "user": ..., "name": ..., "approve": true}`);
- `journal`: a JSONL file that records every post, edit and approval request (replayed by the next
  process, so the fake platform keeps its messages across restarts); each is also printed on stdout as
  `fake: {...}` so a test can react to it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adapters.bridge import Bridge, GateView, IncomingMessage, Place
from adapters.bridge.testing import MemoryTransport, PostedMessage

PLACE = Place("fake", "W1", "C1")


class JournalTransport(MemoryTransport):
    """A MemoryTransport whose messages survive the process: every call is appended to the journal (and
    printed as a `fake: {...}` line on stdout), and a new process replays the journal first, so message ids
    and texts persist like on a real platform."""

    def __init__(self, journal: Path | None) -> None:
        super().__init__("fake")
        self.journal = journal
        if journal is not None and journal.exists():
            for line in journal.read_text().splitlines():
                self.replay(json.loads(line))

    def replay(self, record: dict[str, Any]) -> None:
        if record["op"] in ("create", "approval"):
            target = Place.from_json(record["target"])
            self.messages.append(
                PostedMessage(str(record["id"]), target, record.get("text", ""), record["key"])
            )
            self._ids = itertools.count(int(record["id"]) + 1)
        elif record["op"] == "edit":
            message = self.by_id(str(record["id"]))
            message.text = record["text"]
            message.edits.append(record["text"])

    def note(self, **record: Any) -> None:
        line = json.dumps(record)
        print(f"fake: {line}", flush=True)
        if self.journal is not None:
            with self.journal.open("a", encoding="utf-8") as handle:
                handle.write(line + "\n")
                handle.flush()
                os.fsync(handle.fileno())

    async def create(self, target: Place, text: str, key: str, **context: Any) -> str:
        message_id = await super().create(target, text, key, **context)
        self.note(op="create", id=message_id, key=key, text=text, target=target.to_json())
        return message_id

    async def edit(self, target: Place, message_id: str, text: str, key: str, *, final: bool) -> None:
        await super().edit(target, message_id, text, key, final=final)
        self.note(op="edit", id=message_id, key=key, text=text, final=final)

    async def post_approval(self, target: Place, gate: GateView, key: str) -> str:
        message_id = await super().post_approval(target, gate, key)
        self.note(
            op="approval",
            id=message_id,
            key=key,
            gate=gate.gate_id,
            tool=gate.tool,
            arguments=gate.arguments,
            target=target.to_json(),
        )
        return message_id

    async def update_approval(self, target: Place, message_id: str, gate: GateView) -> None:
        await super().update_approval(target, message_id, gate)
        self.note(op="approval_update", id=message_id, gate=gate.gate_id, status=gate.status)


class FakeChat:
    name = "fake"

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.messages = list(options.get("messages", []))
        self.inbox = Path(options["inbox"]) if options.get("inbox") else None
        journal = Path(options["journal"]) if options.get("journal") else None
        self.transport = JournalTransport(journal)
        self.bridge: Bridge | None = None
        self.poller: asyncio.Task[None] | None = None
        self.seen = 0

    async def take(self, raw: Mapping[str, Any]) -> None:
        assert self.bridge is not None
        message = IncomingMessage(
            PLACE,
            str(raw["id"]),
            str(raw.get("user", "U1")),
            str(raw.get("name", "alice")),
            str(raw["text"]),
            mentions_bot=True,
        )
        await self.bridge.intake(message)

    async def click(self, raw: Mapping[str, Any]) -> None:
        """An Approve/Deny click: `{"click": gate id, "user", "name", "approve"}`."""
        assert self.bridge is not None
        decision = await self.bridge.decide(
            int(raw["click"]),
            user_id=str(raw["user"]),
            user_name=str(raw["name"]),
            action="approve" if raw["approve"] else "deny",
        )
        self.transport.note(
            op="decision", gate=int(raw["click"]), accepted=decision.accepted, status=decision.status
        )

    async def start(self, bridge: Bridge) -> None:
        self.bridge = bridge
        bridge.attach(self.transport)
        for raw in self.messages:
            await self.take(raw)
        if self.inbox is not None:
            self.poller = asyncio.get_running_loop().create_task(self.poll())

    async def poll(self) -> None:
        assert self.inbox is not None
        while True:
            if self.inbox.exists():
                lines = self.inbox.read_text().splitlines()
                for line in lines[self.seen :]:
                    raw = json.loads(line)
                    if "click" in raw:
                        await self.click(raw)
                    else:
                        await self.take(raw)
                self.seen = len(lines)
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.poller is not None:
            self.poller.cancel()
            await asyncio.gather(self.poller, return_exceptions=True)


def create(options: dict[str, Any], env: Mapping[str, str]) -> FakeChat:
    return FakeChat(options)
