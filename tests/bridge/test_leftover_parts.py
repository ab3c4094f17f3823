"""A reply that streamed into more messages than its final text needs: the extra messages go (deleted, or
blanked where the platform refuses to delete), so what is visible is exactly the final answer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from adapters.bridge import ReplyDoc
from adapters.bridge.delivery import REMOVED_TEXT
from harness_core import ToolApi, tool
from harness_core.messages import AssistantMessage, ToolResultMessage
from harness_core.models import ModelRequest
from harness_core.models.faux import faux_assistant, faux_text, faux_tool_call

from .support import CHANNEL, Bot

LONG = " ".join(f"word{i}" for i in range(400))  # ~3,000 characters: several 1,000-character parts

pytestmark = pytest.mark.timeout(60)


def long_then_tool(request: ModelRequest) -> AssistantMessage:
    if isinstance(request.messages[-1], ToolResultMessage):
        return faux_assistant("Short final answer.")
    return faux_assistant([faux_text(LONG), faux_tool_call("lookup", {}, id="l1")])


async def stream_long_then_answer_short(bots: Callable[..., Awaitable[Bot]], refuse: bool) -> Bot:
    release = asyncio.Event()

    @tool
    async def lookup(api: ToolApi) -> str:
        """Waits until the test saw the partial in several messages."""
        await release.wait()
        return "found"

    bot = await bots(responder=long_then_tool, tools=[lookup], chunk_size=50, delay_ms=5)
    bot.platform.max_chars = 1000
    bot.platform.refuse_deletes = refuse
    result = await bot.say("100.1", "look it up")
    for _ in range(2000):
        if len(bot.platform.texts(CHANNEL)) >= 2:
            break
        await asyncio.sleep(0.01)
    assert len(bot.platform.texts(CHANNEL)) >= 2
    release.set()
    await bot.settle()
    assert await bot.harness.snapshot(ReplyDoc, key=str(result.submission_id)) is None  # retired
    return bot


async def test_parts_beyond_the_final_text_are_deleted(bots: Callable[..., Awaitable[Bot]]) -> None:
    bot = await stream_long_then_answer_short(bots, refuse=False)
    assert bot.platform.texts(CHANNEL) == ["Short final answer."]
    assert [c for c in bot.platform.calls if c[0] == "delete"]


async def test_a_platform_refusing_to_delete_gets_the_extra_parts_blanked(
    bots: Callable[..., Awaitable[Bot]],
) -> None:
    bot = await stream_long_then_answer_short(bots, refuse=True)
    first, *rest = bot.platform.texts(CHANNEL)
    assert first == "Short final answer."
    assert rest and all(text == REMOVED_TEXT for text in rest)
