"""End to end with real processes: a worker (`openai_worker.py`) talks to a local OpenAI-compatible SSE server,
runs a tool round, and is SIGKILLed by the server while the next answer is streaming. A second worker on the same
SQLite file must resend that request and finish the run: the tool is not run again, the answer is stored once,
and the killed attempt's committed partial is kept as an aborted entry that no later request carries."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from harness_core import CORE_ASSISTANT, CORE_TOOL_RESULT, Harness
from harness_core.messages import AssistantMessage
from harness_core.storage import SqliteStorage

from .harness_support import Call, OpenAIDialect

WORKER = Path(__file__).with_name("openai_worker.py")
OPENAI = OpenAIDialect()
CALLS = [
    Call("call_Zq81kX", "forecast", {"city": "Zürich", "days": 3}),
    Call("call_Os72mY", "forecast", {"city": 'Oslo "Fornebu"', "days": 10}),
]
PARTIAL = ["Checking the ", "forecasts: Zürich ", "looks sunny"]  # what the killed attempt streams
ANSWER = ["Both are sunny: ", "3 days in Zürich, ", "10 at Fornebu."]


class ModelServer:
    """An OpenAI-compatible `/v1/chat/completions` that streams slowly. Request 1: two parallel tool calls.
    Request 2: part of an answer, then, once the worker reports that partial committed, SIGKILL to the worker
    (found by its `x-worker-pid` header) while the response is still open. Request 3: the whole answer."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.pids: list[int] = []
        self.killed: list[int] = []
        self.partial_committed = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(await request.json())
        pid = int(request.headers["x-worker-pid"])
        self.pids.append(pid)
        number = len(self.requests)
        if number > 3:
            return web.json_response({"error": {"message": "unexpected request"}}, status=400)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        if number == 1:
            events = OPENAI.tool_call_events(CALLS, fragment=3)
        elif number == 2:
            events = OPENAI.text_events(*PARTIAL)[: OPENAI.lead + len(PARTIAL)]
        else:
            events = OPENAI.text_events(*ANSWER)
        for event in events:
            await response.write(event)
            await asyncio.sleep(0.005)
        if number == 2:
            await self.partial_committed.wait()
            os.kill(pid, signal.SIGKILL)  # mid-stream: the response is still open
            self.killed.append(pid)
            return response
        await response.write_eof()
        return response


@pytest.fixture
async def server() -> AsyncIterator[tuple[ModelServer, str]]:
    model = ModelServer()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", model.handle)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield model, f"http://127.0.0.1:{port}/v1"
    await runner.cleanup()


class Worker:
    def __init__(self, proc: asyncio.subprocess.Process, stderr: Path) -> None:
        self.proc = proc
        self.stderr = stderr
        self.events: list[dict[str, Any]] = []

    async def read(self, on_event: Any = None) -> None:
        """Collect the worker's stdout events until it exits."""
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            event = json.loads(line)
            self.events.append(event)
            if on_event is not None:
                on_event(event)

    def log(self) -> str:
        return f"events={self.events}\nstderr:\n{self.stderr.read_text()}"


async def start_worker(base_url: str, tmp_path: Path, name: str) -> Worker:
    stderr = tmp_path / f"{name}.stderr"
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            base_url,
            str(tmp_path / "bot.sqlite"),
            str(tmp_path / "ledger.jsonl"),
            "slack:T1:C1:1700000000.000100",
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )
    return Worker(proc, stderr)


@pytest.mark.timeout(30)
async def test_sigkill_mid_stream_then_restart_resends_the_request(
    server: tuple[ModelServer, str], tmp_path: Path
) -> None:
    model, base_url = server
    partial_text = "".join(PARTIAL)

    # -- first worker: tool round, then killed while the answer streams ------------------------------------
    first = await start_worker(base_url, tmp_path, "first")

    def on_event(event: dict[str, Any]) -> None:
        if event["event"] == "partial" and event["text"] == partial_text:
            model.partial_committed.set()

    await first.read(on_event)
    await first.proc.wait()
    assert first.proc.returncode == -signal.SIGKILL, first.log()
    assert model.killed == [first.proc.pid]
    assert not any(e["event"] == "settled" for e in first.events)
    (submitted,) = [e for e in first.events if e["event"] == "submitted"]

    # -- second worker on the same file: resends request 2 and finishes ------------------------------------
    second = await start_worker(base_url, tmp_path, "second")
    await second.read()
    await second.proc.wait()
    assert second.proc.returncode == 0, second.log()
    settled = second.events[-1]
    assert settled["event"] == "settled", second.log()
    assert settled["status"] == "done" and settled["id"] == submitted["id"], second.log()

    # -- what the server saw -----------------------------------------------------------------------------
    assert model.pids == [first.proc.pid, first.proc.pid, second.proc.pid]
    killed, resent = model.requests[1], model.requests[2]
    sent = OPENAI.transcript(killed)
    assert sent[:3] == [
        ("user", "Weather in Zürich and Oslo?"),
        ("call", CALLS[0].id, "forecast", CALLS[0].arguments),
        ("call", CALLS[1].id, "forecast", CALLS[1].arguments),
    ]
    assert sorted(sent[3:]) == sorted(
        [
            ("result", CALLS[0].id, "Zürich: sunny for 3 days", False),
            ("result", CALLS[1].id, 'Oslo "Fornebu": sunny for 10 days', False),
        ]
    )
    assert resent["messages"] == killed["messages"]  # the same request, without the killed attempt's partial
    assert partial_text not in json.dumps(resent, ensure_ascii=False)

    # -- the tool ran exactly once per call, in the first worker -------------------------------------------
    ledger = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert sorted((e["city"], e["days"]) for e in ledger) == [('Oslo "Fornebu"', 10), ("Zürich", 3)]
    assert {e["pid"] for e in ledger} == {first.proc.pid}

    # -- what is stored ----------------------------------------------------------------------------------
    harness = await Harness.open(await SqliteStorage.open(tmp_path / "bot.sqlite"))
    try:
        root = await harness.root()
        entries = list(reversed((await root.entries(limit=100)).items))
        assistants = [e.model[0] for e in entries if e.kind == CORE_ASSISTANT and e.model]
        assert all(isinstance(m, AssistantMessage) for m in assistants)
        summary = [(m.stop_reason, m.text()) for m in assistants if isinstance(m, AssistantMessage)]
        answer = "".join(ANSWER)
        assert summary == [("toolUse", ""), ("aborted", partial_text), ("stop", answer)]
        assert [e.kind for e in entries].count(CORE_TOOL_RESULT) == 2
        assert settled["answer"] == entries[-1].id
        context = await root.context()
        texts = [m.text() for m in context.messages if isinstance(m, AssistantMessage)]
        assert partial_text not in texts and texts[-1] == answer
        inspection = await harness.inspect()
        assert inspection.tasks == [] and inspection.submissions == []
    finally:
        await harness.close()
