"""Run the real CLI (`python -m bots ...`) in subprocesses over a temporary config, storage and fake chat."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def toml_value(value: Any) -> str:
    """Inline TOML for the few shapes the tests need (json is close enough for strings, lists, numbers)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def write_config(
    workdir: Path,
    *,
    messages: Sequence[dict[str, Any]] = (),
    restart_limit: int = 5,
    extra: str = "",
) -> Path:
    """A bot config over `workdir`: faux:demo, the crash-tools plugin, the fake chat adapter."""
    fake = {"module": "bots_fake_chat", "journal": str(workdir / "journal.jsonl"), "messages": list(messages)}
    text = f"""
[bot]
name = "test-bot"
model = "faux:demo"

[storage]
path = {toml_value(str(workdir / "bot.sqlite"))}

[answer]
mode = "all"

[tools]
modules = ["bots_crash_tools"]

[approvals]
approvers = ["U-lead"]

[tickets]
path = {toml_value(str(workdir / "tickets.json"))}

[tasks]
restart_limit = {restart_limit}

[adapters.fake]
{chr(10).join(f"{k} = {toml_value(v)}" for k, v in fake.items())}
{extra}
"""
    path = workdir / "bot.toml"
    path.write_text(text)
    return path


def bot_env(workdir: Path, **overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    env["BOTS_CRASH_DIR"] = str(workdir)
    env["DURABLE_BOTS_DEMO_DELAY_MS"] = "0"
    env.update(overrides)
    return env


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


async def cli(config: Path, *args: str, env: dict[str, str], timeout: float = 60) -> Result:
    """Run one CLI command to completion."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bots",
        *args,
        "--config",
        str(config),
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return Result(process.returncode, out.decode(), err.decode())


@dataclass
class BotProcess:
    """A running `python -m bots run`; read its stdout line by line and react."""

    process: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)

    @classmethod
    async def start(cls, config: Path, *args: str, env: dict[str, str]) -> BotProcess:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bots",
            "run",
            "--config",
            str(config),
            *args,
            cwd=REPO,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return cls(process)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def wait_for(self, predicate: Callable[[str], bool], timeout: float = 30) -> str | None:
        """Read lines until one satisfies `predicate` (returned) or the process ends (None)."""
        assert self.process.stdout is not None

        async def scan() -> str | None:
            assert self.process.stdout is not None
            while True:
                raw = await self.process.stdout.readline()
                if not raw:
                    return None
                line = raw.decode().rstrip("\n")
                self.lines.append(line)
                if predicate(line):
                    return line

        return await asyncio.wait_for(scan(), timeout)

    async def wait_for_fake(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30
    ) -> dict[str, Any]:
        """Wait for a `fake: {...}` line (a post, edit or approval request) matching `predicate`."""

        def match(line: str) -> bool:
            return line.startswith("fake: ") and predicate(json.loads(line[len("fake: ") :]))

        line = await self.wait_for(match, timeout)
        assert line is not None, f"the bot ended first:\n{self.output()}\n{await self.stderr()}"
        found: dict[str, Any] = json.loads(line[len("fake: ") :])
        return found

    async def finish(self, timeout: float = 30) -> int:
        """Read the rest of stdout and wait for the exit."""
        assert self.process.stdout is not None
        rest = await asyncio.wait_for(self.process.stdout.read(), timeout)
        self.lines.extend(rest.decode().splitlines())
        return await asyncio.wait_for(self.process.wait(), timeout)

    async def terminate(self, timeout: float = 30) -> int:
        self.process.send_signal(signal.SIGTERM)
        return await self.finish(timeout)

    async def stderr(self) -> str:
        assert self.process.stderr is not None
        if self.process.returncode is None:
            return "(still running)"
        return (await self.process.stderr.read()).decode()

    def output(self) -> str:
        return "\n".join(self.lines)

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


def ledger(workdir: Path) -> list[str]:
    path = workdir / "ledger.txt"
    return path.read_text().splitlines() if path.exists() else []


def journal(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
