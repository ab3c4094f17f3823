"""A real bot process for the Discord end-to-end tests: harness on SQLite + bridge + the Discord adapter.

    python bot_process.py <workdir>

Environment: ``DISCORD_BOT_TOKEN``, ``DISCORD_API_URL``, ``DISCORD_GATEWAY_URL`` (``FakeDiscord.env()``) and
``BOT_CONFIG`` (JSON): ``adapter`` (the ``[adapters.discord]`` table), ``answer`` (channel policy),
``approvers`` / ``groups`` (who may approve ``deploy``), ``chunk_size`` / ``delay_ms`` (how the scripted model
streams). Prints JSON lines on stdout (``ready``, ``request``, ``delivered``, ``stopped``, ``report``); runs
until SIGTERM,
then shuts down gracefully. The tests SIGKILL it at chosen moments.

The model is a `FauxProvider` answering from the request alone (so a restarted process answers the same):
``re <last user line>``; ``seen: <every user line in context>`` for "what do you see"; a 5,000-character
answer with a code block for "long answer"; a `deploy` tool call for "please deploy" (then reports its result); for "look it up", 2,900 characters and a
`lookup` call (which waits for ``<workdir>/release``), then "Short final answer.".
``deploy`` is approval-gated and not replay-safe; each run appends a line to ``<workdir>/ledger.txt``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from adapters.bridge import ApprovalPolicy, Bridge, BridgeConfig, ChannelPolicy, ReplyDoc
from adapters.discord import create
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
from harness_core.models import ModelRequest
from harness_core.models.faux import FauxProvider, faux_assistant, faux_text, faux_tool_call
from harness_core.storage import PostgresStorage, SqliteStorage, Storage

WORKDIR = Path(sys.argv[1])
CONFIG: dict[str, Any] = json.loads(os.environ.get("BOT_CONFIG", "{}"))
MODEL = AgentChange(model=ModelRef(provider="faux", model_id="faux-1"))


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def ledger(line: str) -> None:
    with open(WORKDIR / "ledger.txt", "a") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def long_answer() -> str:
    """About 5,000 characters: prose, a code block longer than one Discord message, more prose."""
    intro = "\n\n".join(f"Paragraph {i}: " + "the deploy pipeline has several stages. " * 8 for i in range(4))
    code = "\n".join(f"    step_{i:03d} = run('stage {i}')  # keep going" for i in range(60))
    outro = "\n\n".join(f"Note {i}: " + "rollbacks are cheap. " * 10 for i in range(3))
    return f"{intro}\n\n```python\n{code}\n```\n\n{outro}"


def user_lines(request: ModelRequest) -> list[str]:
    return [user_text(m) for m in request.messages if isinstance(m, UserMessage)]


def respond(request: ModelRequest) -> AssistantMessage:
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage) and last.tool_name == "lookup":
        return faux_assistant("Short final answer.")
    if isinstance(last, ToolResultMessage):  # the gated call: it awaits approval
        return faux_assistant("the deploy is waiting for approval")
    if isinstance(last, UserMessage) and user_text(last).startswith("(approval #"):  # the gate's outcome
        return faux_assistant(f"deploy result: {user_text(last).split('Result: ', 1)[-1]}")
    lines = user_lines(request)
    line = lines[-1]
    emit("request", last=line, users=lines)
    if "what do you see" in line:
        return faux_assistant("seen: " + " | ".join(lines))
    if "long answer" in line:
        return faux_assistant(long_answer())
    if "look it up" in line:  # a long partial (two messages), a tool call, then a short answer
        return faux_assistant([faux_text(long_answer()[:2900]), faux_tool_call("lookup", {}, id="lookup-1")])
    if "please deploy" in line:
        return faux_assistant([faux_tool_call("deploy", {"service": "api"}, id="deploy-1")])
    return faux_assistant(f"re {line}" + CONFIG.get("padding", ""))


@tool
def deploy(service: str, api: ToolApi) -> str:
    """Deploy a service (not safe to repeat: it runs only after an approver said yes)."""
    ledger(f"deploy {service} task={api.task_id}")
    return f"deployed {service}"


@tool
async def lookup(api: ToolApi) -> str:
    """Look something up; waits until the test creates ``<workdir>/release`` (so it can see the partial)."""
    for _ in range(3000):  # the file is the test's signal (another process): poll it, for a minute at most
        if (WORKDIR / "release").exists():
            break
        await asyncio.sleep(0.02)
    return "looked up"


async def open_storage() -> Storage:
    """`<workdir>/agent.sqlite`, or the PostgreSQL database DURABLE_BOTS_CRASH_STORAGE_URL names (the crash tests
    run on both); a restart waits out the killed process's lease like a standby (1 s ttl)."""
    url = os.environ.get("DURABLE_BOTS_CRASH_STORAGE_URL")
    if url:
        return await PostgresStorage.open(url, lease_ttl=1.0, on_standby=lambda holder: None)
    return await SqliteStorage.open(WORKDIR / "agent.sqlite")


async def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    faux = FauxProvider(
        chunk_size=int(CONFIG.get("chunk_size", 8)), delay_ms=float(CONFIG.get("delay_ms", 0))
    )
    faux.set_responder(respond)
    registry = Registry()
    harness = await Harness.open(
        await open_storage(),
        models=Models(faux),
        registry=registry,
        on_report=lambda error: emit("report", error=repr(error)),
    )
    policy = ApprovalPolicy(
        tools=["deploy"], approvers=list(CONFIG.get("approvers", [])), groups=list(CONFIG.get("groups", []))
    )
    bridge = Bridge(
        harness,
        config=BridgeConfig(default=ChannelPolicy(answer=CONFIG.get("answer", "all"))),
        agent=MODEL,
        approvals=[policy],
    )
    registry.install(bridge.extension())

    def on_publication(publication: Publication) -> None:
        for doc in publication.docs:  # a reply record is retired once its final text is shown and recorded
            if doc.record.kind == ReplyDoc.kind and doc.retired:
                emit("delivered", reply=doc.record.key)

    harness.add_publication_listener(on_publication)
    registry.install(Extension("ops", tools=[deploy, lookup]))
    adapter = create(CONFIG.get("adapter", {}), os.environ)

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)

    await bridge.start()  # the order of the bots runtime: the bridge first, then the adapters attach
    await adapter.start(bridge)
    harness.resume()
    emit("ready", pid=os.getpid(), caught_up=adapter.caught_up_messages)
    await stopping.wait()
    await adapter.stop()
    await bridge.stop()
    await harness.close()
    emit("stopped")


if __name__ == "__main__":
    asyncio.run(main())
