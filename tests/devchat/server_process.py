"""A real devchat bot process for the browser tests: harness on SQLite, a scripted slow-streaming faux model, the
bridge with an approval-gated `deploy` tool, and the devchat adapter. Runs until SIGTERM (or SIGKILL).

    python tests/devchat/server_process.py <workdir> <port> [--approver NAME] [--delay-ms MS]

Prints one JSON line `{"event": "ready", "url": ...}` on stdout once the page is served. `deploy` appends a
line to `<workdir>/deploys.log` (fsynced) per real execution, so a test can count them across processes.
Stands in for `python -m bots run --adapter devchat` until the ops bot exists.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from pathlib import Path

from adapters.bridge import ApprovalPolicy, Bridge
from adapters.devchat import create
from harness_core import AgentChange, Extension, Harness, ModelRef, Models, Registry, ToolApi, tool
from harness_core.messages import AssistantMessage, ToolResultMessage, UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import FauxProvider, faux_assistant, faux_tool_call
from harness_core.storage import SqliteStorage

MODEL = AgentChange(model=ModelRef(provider="faux", model_id="faux-1"))
STORY = (
    "Once upon a time there was a bot that never forgot a message and never said anything twice. "
    "When its server was killed in the middle of a sentence it simply started again, "
    "and the people in the channel saw the whole story exactly once. The end."
)


def respond(request: ModelRequest) -> AssistantMessage:
    """Deterministic, so a restarted process answers exactly what the killed one was answering."""
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):
        return faux_assistant(f"Deploy finished: {last.text()}")
    text = user_text(last).lower() if isinstance(last, UserMessage) else ""
    if "deploy" in text:
        return faux_assistant([faux_tool_call("deploy", {"service": "api"}, id="deploy-1")])
    if "story" in text:
        return faux_assistant(STORY)
    seen = [user_text(m) for m in request.messages if isinstance(m, UserMessage)]
    return faux_assistant("I see: " + " | ".join(seen))


def record(ledger: Path, line: str) -> None:
    with open(ledger, "a") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("port", type=int)
    parser.add_argument("--approver", default="boss")
    parser.add_argument("--delay-ms", type=float, default=60.0)
    args = parser.parse_args()
    workdir: Path = args.workdir

    @tool
    async def deploy(service: str, api: ToolApi) -> str:
        """Deploy a service to production."""
        await asyncio.to_thread(record, workdir / "deploys.log", f"deploy {service} deploy-{api.task_id}")
        return f"deployed {service} (deploy-{api.task_id})"

    faux = FauxProvider(chunk_size=4, delay_ms=args.delay_ms)
    faux.set_responder(respond)
    registry = Registry()
    harness = await Harness.open(
        await SqliteStorage.open(str(workdir / "harness.sqlite")), models=Models(faux), registry=registry
    )
    bridge = Bridge(
        harness, agent=MODEL, approvals=[ApprovalPolicy(tools=["deploy"], approvers=[args.approver])]
    )
    registry.install(bridge.extension())
    registry.install(Extension("ops", tools=[deploy]))
    adapter = create(
        {"port": args.port, "store": str(workdir / "devchat.sqlite"), "channels": ["general", "ops"]},
        {},
    )
    await adapter.start(bridge)
    await bridge.start()
    harness.resume()
    print(json.dumps({"event": "ready", "url": adapter.url, "pid": os.getpid()}), flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await adapter.stop()
    await bridge.stop()
    await harness.close()


if __name__ == "__main__":
    asyncio.run(main())
