"""Start `bot_process.py` as a real subprocess against a FakeDiscord, read its JSON lines, stop or kill it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adapters.discord.testing import FakeDiscord

REPO_ROOT = Path(__file__).resolve().parents[2]
BOT_SCRIPT = Path(__file__).with_name("bot_process.py")
MESSAGES_ROUTE = "/channels/{channel_id}/messages"
MESSAGE_ROUTE = "/channels/{channel_id}/messages/{message_id}"


class BotProcess:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.events: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self._changed = asyncio.Event()
        assert process.stdout is not None and process.stderr is not None
        self._readers = [
            asyncio.create_task(self._read_events(process.stdout)),
            asyncio.create_task(self._read_stderr(process.stderr)),
        ]

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    async def launch(cls, fake: FakeDiscord, workdir: Path, config: dict[str, Any]) -> BotProcess:
        env = {
            **os.environ,
            **fake.env(),
            "BOT_CONFIG": json.dumps(config),
            "PYTHONPATH": str(REPO_ROOT),
        }
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(BOT_SCRIPT),
            str(workdir),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def _read_events(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.events.append(json.loads(line))
            self._changed.set()
        self._changed.set()

    async def _read_stderr(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.stderr.append(line.decode(errors="replace"))

    def log(self) -> str:
        events = "".join(json.dumps(e) + "\n" for e in self.events[-30:])
        return events + "".join(self.stderr[-60:])

    async def wait_event(
        self,
        name: str,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
        *,
        count: int = 1,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """The `count`-th event `name` (matching `predicate`) the bot printed."""

        async def find() -> dict[str, Any]:
            while True:
                hits = [e for e in self.events if e["event"] == name and (predicate is None or predicate(e))]
                if len(hits) >= count:
                    return hits[count - 1]
                if self.process.returncode is not None and self._readers[0].done():
                    raise AssertionError(
                        f"bot exited ({self.process.returncode}) before {name!r}:\n{self.log()}"
                    )
                self._changed.clear()
                await self._changed.wait()

        try:
            return await asyncio.wait_for(find(), timeout)
        except TimeoutError:
            raise AssertionError(f"no {name!r} event within {timeout}s:\n{self.log()}") from None

    async def ready(self, timeout: float = 30.0) -> dict[str, Any]:
        return await self.wait_event("ready", timeout=timeout)

    async def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM: the bot stops gracefully (exit code 0 after a `stopped` event)."""
        self.process.send_signal(signal.SIGTERM)
        return await self.wait(timeout)

    async def wait(self, timeout: float = 20.0) -> int:
        code = await asyncio.wait_for(self.process.wait(), timeout)
        await asyncio.gather(*self._readers, return_exceptions=True)
        return code

    async def close(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)


class Bots:
    """Launches bot processes over one workdir (one SQLite store) and kills whatever is left at teardown."""

    def __init__(self, fake: FakeDiscord, workdir: Path, config: dict[str, Any]) -> None:
        self.fake = fake
        self.workdir = workdir
        self.config = config
        self.started: list[BotProcess] = []

    async def launch(self, **overrides: Any) -> BotProcess:
        bot = await BotProcess.launch(self.fake, self.workdir, {**self.config, **overrides})
        self.started.append(bot)
        return bot

    async def start(self, **overrides: Any) -> BotProcess:
        bot = await self.launch(**overrides)
        await bot.ready()
        return bot

    def ledger(self) -> list[str]:
        path = self.workdir / "ledger.txt"
        return path.read_text().splitlines() if path.exists() else []

    async def close(self) -> None:
        for bot in self.started:
            await bot.close()
