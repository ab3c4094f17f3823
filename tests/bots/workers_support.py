"""Support for the many-workers tests: worker processes whose output is read continuously, a model server that
answers by echoing the message tokens it was asked about, a Slack Web API proxy per worker (so the test knows
which worker wrote what) and a TCP proxy in front of PostgreSQL that can cut a worker off the database."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, web
from bots_cli_support import REPO

TOKEN = re.compile(r"\bch\d\d-n\d\d\d\b")


def token(channel: int, number: int) -> str:
    return f"ch{channel:02d}-n{number:03d}"


class Worker:
    """A `python -m bots run` worker. Its stdout is read line by line as it comes (so a chatty worker never
    blocks on a full pipe) and kept in a file too, next to the file its stderr goes to: after a failure, the
    test's directory shows what every worker said."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, stderr_path: Path) -> None:
        self.name = name
        self.process = process
        self.stderr_path = stderr_path
        self.stdout_path = stderr_path.with_suffix(".stdout")
        self.lines: list[str] = []
        self._changed = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(
        cls, name: str, config: Path, env: dict[str, str], workdir: Path, *, adapter: str = "slack"
    ) -> Worker:
        stderr_path = workdir / f"{name}.stderr"
        with stderr_path.open("ab") as stderr:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bots",
                "run",
                "--config",
                str(config),
                "--adapter",
                adapter,
                *(["--log-level", "INFO"] if os.environ.get("WORKERS_DEBUG") else []),
                cwd=REPO,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
            )
        return cls(name, process, stderr_path)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def _read(self) -> None:
        assert self.process.stdout is not None
        with self.stdout_path.open("ab") as kept:
            while raw := await self.process.stdout.readline():
                kept.write(raw)
                kept.flush()
                self.lines.append(raw.decode().rstrip("\n"))
                self._changed.set()
        self._changed.set()

    async def wait_for(self, predicate: Callable[[str], bool], timeout: float = 60) -> str:
        try:
            async with asyncio.timeout(timeout):
                return await self._first(predicate)
        except TimeoutError:
            said = self.output()[-6000:]
            raise AssertionError(
                f"{self.name}: no such line in {timeout} s; it said:\n{said}\n{self.stderr()}"
            ) from None

    async def _first(self, predicate: Callable[[str], bool]) -> str:
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if predicate(line):
                    return line
            seen = len(self.lines)
            if self._reader.done():
                raise AssertionError(f"{self.name} ended first:\n{self.output()}\n{self.stderr()}")
            self._changed.clear()
            await self._changed.wait()

    async def ready(self, timeout: float = 60) -> None:
        await self.wait_for(lambda line: line.startswith("durable-bots: ready"), timeout)

    def output(self) -> str:
        return "\n".join(self.lines)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-6000:]

    def owned(self) -> int | None:
        """The partition count it said it owns last (None: not said yet)."""
        for line in reversed(self.lines):
            found = re.match(r"durable-bots: worker owns (\d+) of", line)
            if found:
                return int(found.group(1))
            if line.startswith("durable-bots: standby: this worker owns none"):
                return 0
        return None

    async def finish(self, timeout: float = 60) -> int:
        code = await asyncio.wait_for(self.process.wait(), timeout)
        await asyncio.wait_for(self._reader, timeout)
        return code

    async def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._reader, 5)


class EchoModel:
    """An OpenAI-compatible chat completions endpoint (streaming) whose answer names the message tokens
    (`ch07-n012`) of every user message since the last assistant message: "re: ch07-n012". A token in `slow`
    makes its answer stream for `slow_seconds`."""

    def __init__(self) -> None:
        self.requests = 0
        self.slow: set[str] = set()
        self.slow_seconds = 20.0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> EchoModel:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    @staticmethod
    def asked(body: dict[str, Any]) -> list[str]:
        messages = body.get("messages") or []
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
        tokens: list[str] = []
        for message in messages[last + 1 :]:
            if message.get("role") != "user":
                continue
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
            tokens += TOKEN.findall(str(content or ""))
        return tokens

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        tokens = self.asked(await request.json())
        text = "re: " + (" ".join(tokens) if tokens else "(no token)")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        slow = any(t in self.slow for t in tokens)
        pieces = [text[:4], text[4:]]
        if slow:
            pieces = [text] + [" ." for _ in range(int(self.slow_seconds * 5))]

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {
                "id": "chatcmpl-echo",
                "object": "chat.completion.chunk",
                "model": "gpt-4o",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(data)}\n\n".encode()

        await response.write(chunk({"role": "assistant", "content": ""}))
        for piece in pieces:
            await response.write(chunk({"content": piece}))
            await asyncio.sleep(0.2 if slow else 0.02)
        await response.write(chunk({}, "stop"))
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        await response.write(
            f"data: {json.dumps({'id': 'chatcmpl-echo', 'choices': [], 'usage': usage})}\n\n".encode()
        )
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@dataclass
class ApiCall:
    worker: str
    method: str
    at: float  # time.monotonic() when the proxy received it


@dataclass
class SlackTaps:
    """One Slack Web API proxy per worker in front of the fake (SLACK_API_URL): records who called what."""

    upstream: str  # the fake's api url, ending in /api/
    calls: list[ApiCall] = field(default_factory=list)
    _runners: list[web.AppRunner] = field(default_factory=list)
    _session: ClientSession | None = None

    async def tap(self, worker: str) -> str:
        """A new proxy for `worker`; returns the SLACK_API_URL to give it."""
        if self._session is None:
            self._session = ClientSession()

        async def forward(request: web.Request) -> web.Response:
            method = request.match_info["method"]
            self.calls.append(ApiCall(worker, method, time.monotonic()))
            assert self._session is not None
            headers = {
                k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")
            }
            async with self._session.request(
                request.method,
                self.upstream + method,
                params=request.query,
                data=await request.read(),
                headers=headers,
            ) as upstream:
                body = await upstream.read()
                keep = {
                    k: v for k, v in upstream.headers.items() if k.lower() in ("content-type", "retry-after")
                }
                return web.Response(status=upstream.status, body=body, headers=keep)

        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/api/{method}", forward)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/api/"

    def writes_by(self, worker: str, since: float) -> list[ApiCall]:
        return [
            c for c in self.calls if c.worker == worker and c.at >= since and c.method.startswith("chat.")
        ]

    async def close(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()


class DatabaseLink:
    """A TCP proxy in front of PostgreSQL for one worker: `cut()` drops every connection and refuses new ones
    (the worker is cut off from the database while it keeps running and stays connected to Slack)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.cut_at: float | None = None
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_at is not None:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        self._pipes |= {writer, up_writer}
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.ensure_future(self._pump(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            sink.close()
            self._pipes.discard(sink)

    def cut(self) -> None:
        self.cut_at = time.monotonic()
        for pipe in list(self._pipes):
            pipe.transport.abort()
        self._pipes.clear()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
