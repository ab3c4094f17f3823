"""Shared pieces of the devchat tests: an in-process rig (harness + bridge + adapter on a free port), a small
websocket client that waits on frames, and a real server process for the browser tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from adapters.bridge import ApprovalPolicy, Bridge
from adapters.devchat import DevchatAdapter, create
from harness_core import AgentChange, Extension, Harness, ModelRef, Models, Registry, ToolApi, tool
from harness_core.messages import AssistantMessage, ToolResultMessage, UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import FauxProvider, faux_assistant, faux_tool_call
from harness_core.storage import MemoryStorage

MODEL = AgentChange(model=ModelRef(provider="faux", model_id="faux-1"))
SERVER = Path(__file__).with_name("server_process.py")
WAIT = 15.0


def respond(request: ModelRequest) -> AssistantMessage:
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):
        return faux_assistant(f"Deploy finished: {last.text()}")
    text = user_text(last) if isinstance(last, UserMessage) else ""
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

    async def start_adapter(self, **options: Any) -> DevchatAdapter:
        adapter = create({"port": 0, "store": str(self.store_path), **options}, {})
        await adapter.start(self.bridge)
        self.adapters.append(adapter)
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


def message_events(frame: dict[str, Any]) -> list[dict[str, Any]]:
    if frame["type"] != "events":
        return []
    return [e["message"] for e in frame["events"] if e["type"] == "message"]


def final_bot(text_start: str) -> Callable[[dict[str, Any]], bool]:
    return lambda f: any(
        m["kind"] == "bot" and m["final"] and m["text"].startswith(text_start) for m in message_events(f)
    )


async def make_rig(tmp: Path, *, approvers: list[str] | None = None, delay_ms: float = 5) -> Rig:
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
    bridge = Bridge(
        harness, agent=MODEL, approvals=[ApprovalPolicy(tools=["deploy"], approvers=approvers or ["boss"])]
    )
    registry.install(bridge.extension())
    registry.install(Extension("ops", tools=[deploy]))
    return Rig(harness, bridge, faux, tmp / "var" / "devchat.sqlite", runs)


# --- a real server process (browser tests) ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def log_file(path: Path) -> Any:
    return open(path, "wb")  # the caller closes it once the child holds it


class ServerProcess:
    """`server_process.py` in a subprocess on a fixed port and work directory, so it can be SIGKILLed and
    started again on the same files."""

    def __init__(self, workdir: Path, port: int, *, approver: str = "boss") -> None:
        self.workdir = workdir
        self.port = port
        self.approver = approver
        self.process: asyncio.subprocess.Process | None = None
        self.url = f"http://127.0.0.1:{port}/"
        self.starts = 0

    async def start(self) -> None:
        self.starts += 1
        log = log_file(self.workdir / f"server-{self.starts}.log")
        try:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(SERVER),
                str(self.workdir),
                str(self.port),
                "--approver",
                self.approver,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
            )
        finally:
            log.close()
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), 30)
        except TimeoutError:
            line = b""
        if not line:
            await self.kill()
            raise AssertionError(f"server did not start:\n{self.log()}")
        ready = json.loads(line)
        assert ready["event"] == "ready", ready

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.workdir.glob("server-*.log")))

    async def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()
            assert self.process.returncode == -signal.SIGKILL

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 15)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()

    def deploys(self) -> list[str]:
        ledger = self.workdir / "deploys.log"
        return ledger.read_text().splitlines() if ledger.exists() else []
