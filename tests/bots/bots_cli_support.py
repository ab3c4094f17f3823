"""Run the real CLI (`python -m bots ...`) in subprocesses over a temporary config, storage and fake chat."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

LAST_LINE = "without running a tool twice."  # the end of the demo's answer: the streamed answer is complete
SLACK_AND_DISCORD = """
[adapters.slack]
mode = "socket"
edit_interval = 0.05

[adapters.discord]
edit_interval = 0.05
guild_ready_timeout = 0.05
"""
"""Config tables adding the Slack (Socket Mode) and Discord adapters, quick to edit and to give up on a guild."""


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
    modules: Sequence[str] = ("bots_crash_tools",),
    name: str = "bot.toml",
) -> Path:
    """A bot config over `workdir`: faux:demo, tool plugins (the crash tools by default), the fake chat
    adapter. `name` lets one storage be opened with two configs (e.g. one that lacks a plugin)."""
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
modules = {toml_value(list(modules))}

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
    path = workdir / name
    path.write_text(text)
    return path


def write_inbox_config(workdir: Path, message_id: str, text: str, extra: str = "") -> tuple[Path, Path]:
    """`write_config` with one first message and an inbox file (returned second) the fake chat reads later
    messages and clicks from."""
    inbox = workdir / "inbox.jsonl"
    messages = [{"id": message_id, "text": text}]
    return write_config(workdir, messages=messages, extra=f'inbox = "{inbox}"\n{extra}'), inbox


def shipped_config_in(
    workdir: Path,
    *,
    port: int = 0,
    webhook: str | None = None,
    replace: Mapping[str, str] | None = None,
    append: str = "",
) -> Path:
    """A copy of the shipped config/ops.toml whose storage, chat store and tracker live in `workdir`, with
    devchat on `port` (0: a free one; the CLI prints the URL it got) and, given `webhook`, deploys POSTed
    there. `replace` edits more lines (each must exist), `append` adds tables."""
    text = (REPO / "config" / "ops.toml").read_text()
    replacements = {
        'path = "var/ops.sqlite"': f"path = {toml_value(str(workdir / 'ops.sqlite'))}",
        'store = "var/devchat.sqlite"': f"store = {toml_value(str(workdir / 'devchat.sqlite'))}",
        'path = "var/tickets.json"': f"path = {toml_value(str(workdir / 'tickets.json'))}",
        "port = 8765": f"port = {port}",
        **({"[deploy]\n": f"[deploy]\nwebhook_url = {toml_value(webhook)}\n"} if webhook else {}),
        **(replace or {}),
    }
    for old, new in replacements.items():
        assert old in text, f"config/ops.toml no longer has {old!r}; update this test"
        text = text.replace(old, new)
    path = workdir / "ops.toml"
    path.write_text(text + append)
    return path


def free_port() -> int:
    """A loopback port nothing listens on now (for a server that must come back on the same port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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


async def park_the_fragile_tool(config: Path, env: dict[str, str], timeout: float = 30) -> None:
    """Run the bot of `config` (its one message calls the `fragile` crash tool, `restart_limit=1`) until the
    tool has killed it twice: the next start parks the task."""
    for _ in range(2):  # the tool kills its process: once, and once more after the one allowed restart
        crashed = await BotProcess.start(config, env=env)
        assert await crashed.finish(timeout) == -9, await crashed.stderr()


async def retry_the_parked_task(
    bot: BotProcess, config: Path, env: dict[str, str], timeout: float = 30
) -> int:
    """With `bot` running after `park_the_fragile_tool`: repair the tool, `retry` the parked task from the CLI
    and check that the running bot carried it out. Returns the task id."""
    seen = [line for line in bot.lines if "parked task(s)" in line]  # a caller may have read past it
    parked = seen[0] if seen else await bot.wait_for(lambda line: "parked task(s)" in line, timeout)
    assert parked is not None, bot.output()
    task_id = int(parked.split("task(s) (")[1].split(")")[0])
    (Path(env["BOTS_CRASH_DIR"]) / "repaired").touch()
    retried = await cli(config, "retry", str(task_id), env=env)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert f"task {task_id} (core.tool fragile) is scheduled again (by the running bot)" in retried.stdout
    assert f"task {task_id} (core.tool fragile) completed" in retried.stdout
    assert "result: worked this time" in retried.stdout
    return task_id


async def request_latency_ms(opening: Awaitable[Any], request_id: int) -> int:
    """How long operator request `request_id` waited for the running bot (ms), read through the read-only
    storage handle `opening` opens (closed here)."""
    storage = await opening
    try:
        found = await storage.operator_request(request_id)
    finally:
        await storage.close()
    assert found is not None and found.finished_at is not None
    return int(found.finished_at - found.created_at)


def ledger(workdir: Path) -> list[str]:
    path = workdir / "ledger.txt"
    return path.read_text().splitlines() if path.exists() else []


def journal(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def devchat_converse(url: str, text: str = "hello bot", name: str = "alice") -> dict[str, Any]:
    """Post one message to a devchat server the way its page does and return the bot's final answer."""
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "healthz") as health:
            assert health.status == 200 and (await health.json())["ok"] is True
        async with session.get(url) as page:
            assert page.status == 200 and "text/html" in page.headers["Content-Type"]
        async with session.ws_connect(url + "ws") as ws:
            await ws.send_json({"type": "hello", "cursor": None, "epoch": None})
            post = {
                "type": "post",
                "name": name,
                "channel": "general",
                "thread": None,
                "text": text,
            }
            await ws.send_json({**post, "client_id": "smoke-test-0001"})
            acked = False
            async for frame in ws:
                assert frame.type == aiohttp.WSMsgType.TEXT, frame
                payload = json.loads(frame.data)
                if payload["type"] == "ack":
                    assert payload["outcome"] == "answering"
                    acked = True
                for event in payload.get("events", []) if payload["type"] == "events" else []:
                    message = event.get("message") or {}
                    if message.get("kind") == "bot" and message.get("final"):
                        assert acked, "the post is acknowledged before its answer arrives"
                        found: dict[str, Any] = message
                        return found
    raise AssertionError("the websocket closed before an answer arrived")
