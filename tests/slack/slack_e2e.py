"""Helpers for the Slack end-to-end tests: run `bot_process.py` as a real process against a `FakeSlack`, read
its JSON events, SIGKILL or SIGTERM it, restart it on the same SQLite file.

(No ``__init__.py`` in tests/slack: ``tests/`` is on sys.path and a package named ``slack`` would shadow the
installed one. Test modules import this file by its name.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.slack.testing import Channel, FakeSlack, Message, SocketConnection, User

BOT = Path(__file__).with_name("bot_process.py")
STORY = " ".join(
    f"Chapter {i}: the deploy pipeline woke up and checked the logs once more." for i in range(1, 9)
)
"""What the scripted model answers to a request for a "story" (long enough to stream)."""
START_TIMEOUT = 30.0


@dataclass
class BotProcess:
    process: asyncio.subprocess.Process
    log_path: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return str(self.event("ready")["url"])

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    def event(self, name: str) -> dict[str, Any]:
        found = self.named(name)
        assert found, f"no {name!r} event yet: {self.events}\n{self.log()}"
        return found[-1]

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            with contextlib.suppress(json.JSONDecodeError):
                self.events.append(json.loads(line))
            self._changed.set()
        self._changed.set()

    async def wait_event(
        self,
        name: str,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
        *,
        count: int = 1,
        timeout: float = 20.0,
    ) -> dict[str, Any]:
        """Wait until the bot printed `count` events `name` (matching `predicate`); return the last of them."""

        async def wait() -> dict[str, Any]:
            while True:
                found = [e for e in self.named(name) if predicate is None or predicate(e)]
                if len(found) >= count:
                    return found[count - 1]
                if self.process.returncode is not None or (self._reader is not None and self._reader.done()):
                    raise AssertionError(f"bot exited before {name!r}: {self.events}\n{self.log()}")
                self._changed.clear()
                await self._changed.wait()

        try:
            return await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            raise AssertionError(
                f"no {name!r} event within {timeout}s: {self.events}\n{self.log()}"
            ) from None

    def intakes(self, outcome: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.named("intake") if outcome is None or e["outcome"] == outcome]

    async def release(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"release\n")
        await self.process.stdin.drain()

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.wait_exit()

    async def wait_exit(self) -> int:
        code = await asyncio.wait_for(self.process.wait(), 20)
        if self._reader is not None:
            await self._reader
        return code

    async def stop(self) -> None:
        """Graceful: SIGTERM, then the bot stops adapter, bridge and harness and prints `stopped`."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        code = await self.wait_exit()
        assert code == 0, f"bot exited with {code}\n{self.log()}"
        assert self.named("stopped"), self.log()


class Bots:
    """Starts bot processes in one work directory (the SQLite file survives restarts) and reaps them all."""

    def __init__(self, fake: FakeSlack, workdir: Path) -> None:
        self.fake = fake
        self.workdir = workdir
        self.started: list[BotProcess] = []

    async def start(self, options: dict[str, Any] | None = None, *, wait_ready: bool = True) -> BotProcess:
        options = dict(options or {})
        log_path = self.workdir / f"bot-{len(self.started) + 1}.log"
        env = {**os.environ, **self.fake.env}
        env.pop("SLACK_CLIENT_ID", None)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(BOT),
                str(self.workdir),
                json.dumps(options),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_fd,
                env=env,
            )
        finally:
            os.close(log_fd)
        bot = BotProcess(process, log_path)
        bot._reader = asyncio.get_running_loop().create_task(bot._read())
        self.started.append(bot)
        if wait_ready:
            await bot.wait_event("ready", timeout=START_TIMEOUT)
            if options.get("slack", {}).get("mode", "socket") == "socket":
                await only_connection(self.fake)
        return bot

    def ledger(self) -> list[str]:
        path = self.workdir / "ledger.txt"
        return path.read_text().splitlines() if path.exists() else []

    async def close(self) -> None:
        for bot in self.started:
            if bot.process.returncode is None:
                bot.process.kill()
            with contextlib.suppress(Exception):
                await bot.wait_exit()


async def only_connection(fake: FakeSlack) -> SocketConnection:
    """Wait until exactly one Socket Mode connection is open (a killed bot's socket has been seen closing), so
    Slack's random choice of connection can only pick the live bot."""

    def single() -> SocketConnection | None:
        conns = fake.open_connections
        return conns[0] if len(conns) == 1 else None

    return await fake.wait_for(single, 20, description="exactly one open Socket Mode connection")


def replies_of_bot(fake: FakeSlack, channel: Channel, thread_ts: str | None = None) -> list[Message]:
    """Bot messages that are answers (not approval requests): top level, or in one thread."""
    messages = fake.bot_messages(channel, thread_ts=thread_ts)
    if thread_ts is None:
        messages = [m for m in messages if not m.is_reply]
    else:
        messages = [m for m in messages if m.ts != thread_ts]
    return [m for m in messages if not is_approval(m)]


def is_approval(message: Message) -> bool:
    payload = message.event_payload or {}
    return str(payload.get("key", "")).startswith("approval:")


def approval_messages(fake: FakeSlack, channel: Channel) -> list[Message]:
    return [m for m in fake.bot_messages(channel) if is_approval(m)]


def button(message: Message, verb: str) -> str:
    """The action_id of the Approve/Deny button of an approval message."""
    for block in message.blocks or []:
        for element in block.get("elements") or []:
            action_id = str(element.get("action_id", ""))
            if action_id.split(":")[1:2] == [verb]:
                return action_id
    raise AssertionError(f"no {verb} button in {message.blocks}")


@dataclass
class People:
    alice: User
    bob: User
    carol: User
    boss: User
    mallory: User


def add_people(fake: FakeSlack) -> People:
    return People(
        alice=fake.add_user("UALICE", name="alice", display_name="Alice"),
        bob=fake.add_user("UBOB", name="bob", display_name="Bob"),
        carol=fake.add_user("UCAROL", name="carol", display_name="Carol"),
        boss=fake.add_user("UBOSS", name="boss", display_name="Boss"),
        mallory=fake.add_user("UMALLORY", name="mallory", display_name="Mallory"),
    )
