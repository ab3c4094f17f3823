"""The LangGraph anchor: the same scripted turn on a real LangGraph tool-calling graph with `AsyncSqliteSaver`.

The graph is the usual agent pattern: `agent` (a chat model) -> `tools_condition` -> `ToolNode` -> `agent`.
The chat model is a fake that returns the messages our faux provider returns (a `lookup` call, then the same
answer text), so both sides run the identical script; one thread id per conversation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from benchmarks._env import Durability
from benchmarks._script import ANSWER


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"{key} = 42"


class ScriptedChatModel(BaseChatModel):
    """Asks for `lookup` unless the last message is its result, then answers: the faux script."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **_: Any
    ) -> ChatResult:
        if messages and isinstance(messages[-1], ToolMessage):
            message = AIMessage(content=ANSWER)
        else:
            call = {"name": "lookup", "args": {"key": "k"}, "id": "call-1", "type": "tool_call"}
            message = AIMessage(content="", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **_: Any
    ) -> ChatResult:
        return self._generate(messages, stop)


def build_graph() -> StateGraph[Any]:
    model = ScriptedChatModel()

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph: StateGraph[Any] = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph


@asynccontextmanager
async def open_app(path: Path, durability: Durability = "normal") -> AsyncIterator[Any]:
    """A compiled graph checkpointing to `path`. The connection gets our durability level (LangGraph's own
    default is SQLite's FULL, which would only slow it down)."""
    async with aiosqlite.connect(str(path)) as conn:
        saver = AsyncSqliteSaver(conn)
        await saver.setup()  # WAL, tables
        await conn.execute(f"PRAGMA synchronous={durability.upper()}")
        yield build_graph().compile(checkpointer=saver)


async def turn(app: Any, thread: str, text: str) -> None:
    result = await app.ainvoke(
        {"messages": [HumanMessage(content=text)]}, {"configurable": {"thread_id": thread}}
    )
    if result["messages"][-1].content != ANSWER:
        raise RuntimeError(f"LangGraph turn on {thread} ended with {result['messages'][-1]!r}")


async def run_turns(
    app: Any, threads: Sequence[str], turns: int, *, start: int = 0, concurrency: int | None = None
) -> None:
    gate = asyncio.Semaphore(concurrency or len(threads))

    async def one(thread: str) -> None:
        async with gate:
            for n in range(start, start + turns):
                await turn(app, thread, f"What is k? ({n})")

    await asyncio.gather(*(one(t) for t in threads))


async def row_counts(path: Path) -> dict[str, int]:
    async with aiosqlite.connect(str(path)) as conn:
        counts = {}
        for table in ("checkpoints", "writes"):
            async with conn.execute(f"SELECT count(*) FROM {table}") as cursor:
                row = await cursor.fetchone()
                counts[table] = int(row[0]) if row else 0
        return counts


async def checkpoint_wal(path: Path) -> None:
    async with aiosqlite.connect(str(path)) as conn:
        await conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
