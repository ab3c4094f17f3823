"""Shared pieces of the devchat tests: an in-process rig (harness + bridge + adapter on a free port), a small
websocket client that waits on frames, and the real ops bot process for the browser tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from adapters.bridge import ApprovalPolicy, Bridge
from adapters.devchat import DevchatAdapter, create
from bots.demo import respond as demo_respond
from harness_core import AgentChange, Extension, Harness, ModelRef, Models, Registry, ToolApi, tool
from harness_core.messages import AssistantMessage, ToolResultMessage, UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import FauxProvider, faux_assistant, faux_tool_call
from harness_core.storage import MemoryStorage

# The browser tests run the bot the way the `bots` CLI tests do: share their helpers (tests/bots is no package).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bots"))
from bots_cli_support import REPO, bot_env, free_port, shipped_config_in
from bots_cli_support import cli as cli  # re-exported for the browser tests (the path is set here)
from bots_cli_support import ledger as ledger

MODEL = AgentChange(model=ModelRef(provider="faux", model_id="faux-1"))
WAIT = 15.0


def respond(request: ModelRequest) -> AssistantMessage:
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):  # the gated call: it awaits approval
        return faux_assistant("The deploy waits for approval.")
    text = user_text(last) if isinstance(last, UserMessage) else ""
    if text.startswith("(approval #"):  # the gate's outcome, a turn of its own
        return faux_assistant(f"Deploy finished: {text.split('Result: ', 1)[-1]}")
    if "deploy" in text:
        return faux_assistant([faux_tool_call("deploy", {"service": "api"}, id="deploy-1")])
    return faux_assistant(f"answer to {text}")


@dataclass
class Rig:
    harness: Harness
    bridge: Bridge
    faux: FauxProvider
    store_path: Path
    runs: list[str]
    adapters: list[DevchatAdapter] = field(default_factory=list)
    sockets: list[WsClient] = field(default_factory=list)
    session: aiohttp.ClientSession | None = None

    @property
    def adapter(self) -> DevchatAdapter:
        return self.adapters[-1]

    async def start_adapter(self, env: dict[str, str] | None = None, **options: Any) -> DevchatAdapter:
        adapter = create({"port": 0, "store": str(self.store_path), **options}, env or {})
        await adapter.start(self.bridge)
        self.adapters.append(adapter)
        return adapter

    async def run(self, **options: Any) -> DevchatAdapter:
        """The usual start: the bridge, a devchat adapter (with `options`), then the harness's work."""
        await self.bridge.start()
        adapter = await self.start_adapter(**options)
        self.harness.resume()
        return adapter

    async def connect(self, *, origin: str | None = None) -> WsClient:
        if self.session is None:
            self.session = aiohttp.ClientSession()
        headers = {} if origin is None else {"Origin": origin}
        ws = await self.session.ws_connect(self.adapter.url + "ws", headers=headers)
        client = WsClient(ws)
        self.sockets.append(client)
        return client

    async def hello(
        self, cursor: int | None = None, epoch: str | None = None
    ) -> tuple[WsClient, dict[str, Any]]:
        """A connected page: its first frame (a snapshot or resumed events)."""
        client = await self.connect()
        await client.send(type="hello", cursor=cursor, epoch=epoch)
        first = await client.until(lambda f: f["type"] in ("snapshot", "events"))
        return client, first

    async def close(self) -> None:
        for client in self.sockets:
            await client.close()
        if self.session is not None:
            await self.session.close()
        for adapter in self.adapters:
            await adapter.stop()
        await self.bridge.stop()
        await self.harness.close()


class WsClient:
    """One page's websocket: every frame received is kept in `frames`, in order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.frames: list[dict[str, Any]] = []
        self._read = 0

    async def send(self, **payload: Any) -> None:
        await self.ws.send_str(json.dumps(payload))

    async def until(
        self, predicate: Callable[[dict[str, Any]], Any], timeout: float = WAIT
    ) -> dict[str, Any]:
        """The next frame (after those already looked at) for which `predicate` holds."""

        async def scan() -> dict[str, Any]:
            while True:
                while self._read < len(self.frames):
                    frame = self.frames[self._read]
                    self._read += 1
                    if predicate(frame):
                        return frame
                message = await self.ws.receive()
                if message.type != aiohttp.WSMsgType.TEXT:
                    raise AssertionError(
                        f"websocket ended ({message.type}) while waiting; frames: {self.frames}"
                    )
                self.frames.append(json.loads(message.data))

        return await asyncio.wait_for(scan(), timeout)

    def events(self) -> list[dict[str, Any]]:
        return [e for f in self.frames if f["type"] == "events" for e in f["events"]]

    def messages(self) -> dict[int, dict[str, Any]]:
        """The latest state of every message this page has seen (snapshot plus events)."""
        seen: dict[int, dict[str, Any]] = {}
        for frame in self.frames:
            if frame["type"] == "snapshot":
                seen = {m["id"]: m for m in frame["messages"]}
            elif frame["type"] == "events":
                for event in frame["events"]:
                    if event["type"] == "message":
                        seen[event["message"]["id"]] = event["message"]
        return seen

    async def close(self) -> None:
        await self.ws.close()


def post(client_id: str, text: str, *, name: str = "alice", channel: str = "general") -> dict[str, Any]:
    """A page's post frame."""
    return {
        "type": "post",
        "name": name,
        "channel": channel,
        "thread": None,
        "text": text,
        "client_id": client_id,
    }


def message_events(frame: dict[str, Any]) -> list[dict[str, Any]]:
    if frame["type"] != "events":
        return []
    return [e["message"] for e in frame["events"] if e["type"] == "message"]


def final_bot(text_start: str) -> Callable[[dict[str, Any]], bool]:
    return lambda f: any(
        m["kind"] == "bot" and m["final"] and m["text"].startswith(text_start) for m in message_events(f)
    )


async def make_rig(
    tmp: Path,
    *,
    approvers: list[str] | None = None,
    delay_ms: float = 5,
    expires_after_ms: int = 3_600_000,
) -> Rig:
    runs: list[str] = []

    @tool
    async def deploy(service: str, api: ToolApi) -> str:
        """Deploy a service."""
        runs.append(service)
        return f"deployed {service} (deploy-{api.task_id})"

    faux = FauxProvider(chunk_size=4, delay_ms=delay_ms)
    faux.set_responder(respond)
    registry = Registry()
    harness = await Harness.open(await MemoryStorage.open(), models=Models(faux), registry=registry)
    policy = ApprovalPolicy(
        tools=["deploy"], approvers=approvers or ["boss"], expires_after_ms=expires_after_ms
    )
    bridge = Bridge(harness, agent=MODEL, approvals=[policy])
    registry.install(bridge.extension())
    registry.install(Extension("ops", tools=[deploy]))
    return Rig(harness, bridge, faux, tmp / "var" / "devchat.sqlite", runs)


# --- the real bot process (browser tests) -----------------------------------------------------------------------


def demo_answer(speaker: str, text: str) -> str:
    """What the ops bot's `faux:demo` model answers to a message it has no script for (its help text)."""
    return demo_respond(ModelRequest(messages=[UserMessage(content=f"{speaker}: {text}")])).text()


CRASH_TOOLS = {
    # The crash-tools plugin (tests/bots/bots_crash_tools.py): `fragile` SIGKILLs its process until repaired.
    "[tools]\n": '[tools]\nmodules = ["bots_crash_tools"]\n',
    '"schedule", "search_history"]': '"schedule", "search_history", "fragile"]',
}


def log_file(path: Path) -> Any:
    return open(path, "wb")  # the caller closes it once the child holds it


class BotServer:
    """The ops bot as `make run` starts it: `python -m bots run --adapter devchat --config <copy of
    config/ops.toml>`, with its storage, chat store and tracker in `workdir`, devchat on a fixed free port (so a
    SIGKILLed bot comes back where the page reconnects) and deploys POSTed to `webhook`."""

    def __init__(
        self,
        workdir: Path,
        *,
        webhook: str,
        delay_ms: float = 15,
        crash_tools: bool = False,
        restart_limit: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.config = shipped_config_in(
            workdir,
            port=self.port,
            webhook=webhook,
            replace=CRASH_TOOLS if crash_tools else None,
            append="" if restart_limit is None else f"\n[tasks]\nrestart_limit = {restart_limit}\n",
        )
        # The demo model's streaming pace: slow enough to see partials (and to kill the bot mid-answer).
        self.env = bot_env(workdir, DURABLE_BOTS_DEMO_DELAY_MS=str(delay_ms))
        self.process: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []
        self.starts = 0
        self._reader: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    async def _launch(self) -> asyncio.subprocess.Process:
        self.starts += 1
        log = log_file(self.workdir / f"bot-{self.starts}.log")
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bots",
                "run",
                "--adapter",
                "devchat",
                "--config",
                str(self.config),
                cwd=REPO,
                env=self.env,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
            )
        finally:
            log.close()
        self.process = process
        self._reader = asyncio.get_running_loop().create_task(self._read(process))
        return process

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        """Keep the bot's stdout drained (a full pipe would block it) and remember every line."""
        assert process.stdout is not None
        while raw := await process.stdout.readline():
            self.lines.append(raw.decode().rstrip("\n"))
            self._changed.set()
        self._changed.set()

    async def _line(self, predicate: Callable[[str], bool], timeout: float = 60) -> str | None:
        """The first line so far (or to come) that satisfies `predicate`; None once the bot exited."""

        async def scan() -> str | None:
            while True:
                found = next((line for line in self.lines if predicate(line)), None)
                if found is not None:
                    return found
                if self._reader is None or self._reader.done():
                    return None
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(scan(), timeout)

    async def start(self) -> None:
        """Start the bot and wait until it is ready (page served, work resumed)."""
        self.lines.clear()
        await self._launch()
        ready = await self._line(lambda line: line.startswith("durable-bots: ready"))
        if ready is None:
            await self.kill()
            raise AssertionError(f"the bot did not start:\n{self.log()}")
        assert f"devchat: {self.url}" in self.lines, self.lines

    async def start_and_crash(self) -> None:
        """Start the bot and wait for it to die of SIGKILL (a crash-tools tool kills its own process)."""
        self.lines.clear()
        process = await self._launch()
        code = await asyncio.wait_for(process.wait(), 60)
        assert code == -signal.SIGKILL, f"expected the bot to be SIGKILLed, got {code}:\n{self.log()}"

    def log(self) -> str:
        stderr = "\n".join(p.read_text(errors="replace") for p in sorted(self.workdir.glob("bot-*.log")))
        return "\n".join(self.lines) + "\n" + stderr

    async def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()
            assert self.process.returncode == -signal.SIGKILL
        if self._reader is not None:
            await self._reader

    async def stop(self) -> int | None:
        """SIGTERM, as an operator stops the bot; returns the exit code (None if it was not running)."""
        if self.process is None or self.process.returncode is not None:
            return None
        self.process.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
            raise
        if self._reader is not None:
            await self._reader
        return code
