"""The scripted turn every turn benchmark runs on our harness: user message -> the model asks for `lookup` ->
the tool answers -> the model answers. `_langgraph.py` runs the identical script on LangGraph."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks._env import Durability
from harness_core import (
    AgentChange,
    ConversationHandle,
    Extension,
    Harness,
    Input,
    ModelRef,
    Models,
    Registry,
    tool,
)
from harness_core.messages import AssistantMessage, ToolResultMessage
from harness_core.models import ModelRequest
from harness_core.models.faux import FauxProvider, faux_assistant, faux_text, faux_tool_call
from harness_core.storage import SqliteStorage

ANSWER = "The value of k is 42."
AGENT = AgentChange(model=ModelRef(provider="faux", model_id="faux-1"))


@tool(replay="safe")
def lookup(key: str) -> str:
    """Look a key up."""
    return f"{key} = 42"


def respond(request: ModelRequest) -> AssistantMessage:
    """Answer after a tool result, otherwise ask for the tool: two model calls per turn."""
    if request.messages and isinstance(request.messages[-1], ToolResultMessage):
        return faux_assistant([faux_text(ANSWER)])
    return faux_assistant([faux_tool_call("lookup", {"key": "k"}, id="call-1")])


def scripted_faux() -> FauxProvider:
    # One chunk per message (the LangGraph fake does not stream either); no request log: a test convenience
    # that deep-copies every request and grows without bound.
    faux = FauxProvider(chunk_size=1_000_000, record_requests=False)
    faux.set_responder(respond)
    return faux


def registry() -> Registry:
    found = Registry()
    found.install(Extension("bench", tools=[lookup]))
    return found


async def open_harness(path: Path, durability: Durability = "normal") -> Harness:
    storage = await SqliteStorage.open(path, durability=durability)
    return await Harness.open(storage, models=Models(scripted_faux()), registry=registry())


@dataclass
class CommitCounter:
    """Counts logical commits (batches) and SQLite transactions (storage.commit calls) of one harness."""

    batches: int = 0
    transactions: int = 0

    @classmethod
    def attach(cls, harness: Harness) -> CommitCounter:
        counter = cls()
        storage = harness.session.storage
        inner = storage.commit

        async def counting(batches: Sequence[object]) -> None:
            counter.batches += len(batches)
            counter.transactions += 1
            await inner(batches)  # type: ignore[arg-type]

        storage.commit = counting  # type: ignore[method-assign]
        return counter


async def turn(conversation: ConversationHandle, request_id: str, text: str) -> None:
    submission = await conversation.submit(Input(text, request_id=request_id))
    settled = await submission.wait()
    if settled.status != "done":
        raise RuntimeError(f"turn {request_id} ended {settled.status}: {settled.reason}")


async def run_turns(
    conversations: Sequence[ConversationHandle], turns: int, *, start: int = 0, concurrency: int | None = None
) -> None:
    """Each conversation runs `turns` turns one after another; conversations run side by side, at most
    `concurrency` at a time (default: all)."""
    gate = asyncio.Semaphore(concurrency or len(conversations))

    async def one(conversation: ConversationHandle) -> None:
        async with gate:
            for n in range(start, start + turns):
                await turn(conversation, f"bench:{conversation.id}:{n}", f"What is k? ({n})")

    await asyncio.gather(*(one(c) for c in conversations))
