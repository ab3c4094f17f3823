"""A real bot process for the Slack end-to-end tests: harness on SQLite + bridge + the Slack adapter.

    python tests/slack/bot_process.py <workdir> '<options as JSON>'      (env: FakeSlack.env)

The model is a `FauxProvider` scripted from the request, so every process (and every restart) answers alike:
"deploy" asks for the approval-gated `deploy` tool (not replay-safe; every run is appended to
`<workdir>/ledger.txt`), "story" writes a long streamed answer, "look it up" streams ~2,900 characters, calls `lookup`, then answers
"Short final answer.", anything else is answered with
"answer to <input> [saw: <every user input in context>]" so tests can see what a conversation (or a thread's
fork) contains.

Prints JSON lines on stdout: `ready` (with `url` in HTTP mode), `intake` (every committed or duplicate
intake, with the submission's status), `held`, `stopped` (with the adapter's transport `health`). Runs until SIGTERM, then shuts down gracefully
(adapter, bridge, harness).

Test-only knobs (options): `die_on_decision` SIGKILLs the process in the publication of an approval's
commit (after the click is committed, before it is acknowledged); `die_in_deploy` SIGKILLs the process inside `deploy` right after its ledger line;
`hold_after_intake` blocks the first new intake after its commit, so the ack never
goes out, and never lets the model answer (the test SIGKILLs the process there); `hold`
(`{"when": "story" | "tool_result" | <text>, "after_chunks": n or [n, m]}`) stops the model after n chunks
until stdin says `release`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from slack_e2e import STORY

from adapters.bridge import (
    ApprovalDoc,
    ApprovalPolicy,
    Bridge,
    BridgeConfig,
    ChannelPolicy,
    IncomingMessage,
    IntakeResult,
)
from adapters.slack import create
from harness_core import (
    AgentChange,
    Extension,
    Harness,
    ModelRef,
    Models,
    Publication,
    Registry,
    ToolApi,
    tool,
)
from harness_core.messages import AssistantMessage, ToolResultMessage, UserMessage, user_text
from harness_core.models import ModelInfo, ModelRequest
from harness_core.models.faux import FauxProvider, faux_assistant, faux_text, faux_tool_call
from harness_core.storage import PostgresStorage, SqliteStorage, Storage

WORKDIR = Path(sys.argv[1])
OPTIONS: dict[str, Any] = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
MODEL = AgentChange(model=ModelRef(provider="faux", model_id="faux-1"))


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def ledger(line: str) -> None:
    with open(WORKDIR / "ledger.txt", "a") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def respond(request: ModelRequest) -> AssistantMessage:
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage) and last.tool_name == "lookup":
        return faux_assistant("Short final answer.")
    if isinstance(last, ToolResultMessage):  # the gated call's result: it awaits approval
        return faux_assistant("The deploy of api waits for approval.")
    users = [user_text(m) for m in request.messages if isinstance(m, UserMessage)]
    asked = users[-1] if users else ""
    if asked.startswith("(approval #"):  # the gate's outcome, a turn of its own
        return faux_assistant(f"deploy finished: {asked.split('Result: ', 1)[-1]}")
    if "deploy" in asked:
        return faux_assistant(
            [
                faux_text("Deploying api once approved."),
                faux_tool_call("deploy", {"service": "api"}, id="deploy-1"),
            ]
        )
    if "look it up" in asked:  # a long partial (several messages), a tool call, then a short answer
        long = " ".join(f"word{i}" for i in range(400))
        return faux_assistant([faux_text(long), faux_tool_call("lookup", {}, id="lookup-1")])
    if "story" in asked:
        return faux_assistant(STORY)
    return faux_assistant(f"answer to {asked} [saw: {' | '.join(users)}]")


class GatedFaux(FauxProvider):
    """Stops one response after each of `after_chunks` chunks until stdin says `release` (once per process)."""

    def __init__(self, hold: dict[str, Any] | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hold = hold
        self.releases: asyncio.Queue[None] = asyncio.Queue()
        self.used = False

    def _held(self, request: ModelRequest) -> list[int]:
        if self.hold is None or self.used:
            return []
        last = request.messages[-1]
        when = str(self.hold.get("when", ""))
        if when == "tool_result":
            matched = isinstance(last, ToolResultMessage)
        else:
            matched = isinstance(last, UserMessage) and when in user_text(last)
        if not matched:
            return []
        self.used = True
        points = self.hold.get("after_chunks", 1)
        return [int(p) for p in (points if isinstance(points, list) else [points])]

    async def stream(self, model: ModelInfo, request: ModelRequest) -> AsyncGenerator[AssistantMessage, None]:
        if OPTIONS.get("hold_after_intake"):
            # This process dies right after an intake commit: its model never gets to answer (on a loaded
            # machine it could otherwise run ahead before the test kills it).
            await TracingBridge.forever.wait()
        points = self._held(request)
        chunks = 0
        async for partial in super().stream(model, request):
            yield partial
            chunks += 1
            if chunks in points:
                emit("held", what="generation", chunks=chunks)
                await self.releases.get()


class TracingBridge(Bridge):
    held = False
    forever = asyncio.Event()  # referenced here, or the held listener task could be garbage-collected

    async def intake(self, message: IncomingMessage) -> IntakeResult:
        result = await super().intake(message)
        status = None
        if result.submission_id is not None:
            handle = await self.harness.submission(result.submission_id)
            status = None if handle is None else handle.record.status
        emit(
            "intake",
            request_id=message.request_id,
            outcome=result.outcome,
            status=status,
            user=message.user_name,
            text=message.text,
            dm=message.is_dm,
        )
        if OPTIONS.get("hold_after_intake") and result.outcome != "duplicate" and not TracingBridge.held:
            TracingBridge.held = True
            emit("held", what="intake")  # committed; the ack waits for this listener: it never goes out
            await TracingBridge.forever.wait()
        return result


def die_on_decision(publication: Publication) -> None:
    """SIGKILL in the very publication of a committed decision: after the click's commit, before its ack."""
    for doc in publication.docs:
        if doc.record.kind == ApprovalDoc.kind and (doc.value or {}).get("status") == "approved":
            os.kill(os.getpid(), signal.SIGKILL)


async def read_commands(faux: GatedFaux) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        if line.strip() == b"release":
            faux.releases.put_nowait(None)


async def open_storage() -> Storage:
    """`<workdir>/bot.sqlite`, or the PostgreSQL database DURABLE_BOTS_CRASH_STORAGE_URL names (the crash tests
    run on both); a restart waits out the killed process's lease like a standby (1 s ttl)."""
    url = os.environ.get("DURABLE_BOTS_CRASH_STORAGE_URL")
    if url:
        return await PostgresStorage.open(url, lease_ttl=1.0, on_standby=lambda holder: None)
    return await SqliteStorage.open(WORKDIR / "bot.sqlite")


async def main() -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )

    @tool
    def deploy(service: str, api: ToolApi) -> str:
        """Deploy a service to production."""
        ledger(f"deploy {service} task={api.task_id}")
        if OPTIONS.get("die_in_deploy"):
            os.kill(os.getpid(), signal.SIGKILL)  # a crash inside the tool, after its effect
        return f"deployed {service}"

    @tool
    def lookup(api: ToolApi) -> str:
        """Look something up (safe to repeat)."""
        return "found"

    faux = GatedFaux(
        OPTIONS.get("hold"),
        chunk_size=int(OPTIONS.get("chunk_size", 8)),
        delay_ms=float(OPTIONS.get("delay_ms", 0)),
    )
    faux.set_responder(respond)
    registry = Registry()
    harness = await Harness.open(await open_storage(), models=Models(faux), registry=registry)
    policy = ChannelPolicy(
        answer=OPTIONS.get("answer", "mentions"), reply_in_thread=bool(OPTIONS.get("reply_in_thread", False))
    )
    bridge = TracingBridge(
        harness,
        config=BridgeConfig(default=policy),
        agent=MODEL,
        approvals=[
            ApprovalPolicy(
                tools=["deploy"],
                approvers=list(OPTIONS.get("approvers", [])),
                groups=list(OPTIONS.get("groups", [])),
            )
        ],
    )
    if OPTIONS.get("die_on_decision"):
        harness.add_publication_listener(die_on_decision)
    registry.install(bridge.extension())
    registry.install(Extension("ops", tools=[deploy, lookup]))
    # Edits paced at 0.2 s unless a test sets its own: the default (Slack's 1 s) only slows every streamed answer
    # here; the pacing itself has tests of its own (test_slack_pacing.py).
    adapter = create({"edit_interval": 0.2, **OPTIONS.get("slack", {})}, os.environ)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    commands = loop.create_task(read_commands(faux))
    await bridge.start()  # the order of the bots runtime: bridge first, then its adapters attach
    await adapter.start(bridge)
    harness.resume()
    emit("ready", url=adapter.url, pid=os.getpid())
    await stop.wait()
    await adapter.stop()
    health = dataclasses.asdict(adapter.health())
    await bridge.stop()
    await harness.close()
    commands.cancel()
    await asyncio.gather(commands, return_exceptions=True)
    emit("stopped", health=health)


if __name__ == "__main__":
    asyncio.run(main())
