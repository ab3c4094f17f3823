"""A message that arrives while another is being answered is answered even when that answer fails: the channel
is never left waiting for someone to speak again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from harness_core.messages import AssistantMessage
from harness_core.models import ModelRequest
from harness_core.models.faux import faux_assistant, faux_error

from .support import CHANNEL, Bot, user_texts

Bots = Callable[..., Awaitable[Bot]]


async def test_bobs_question_queued_behind_alices_failed_answer_is_answered(bots: Bots) -> None:
    asked: list[str] = []

    def responder(request: ModelRequest) -> AssistantMessage:
        last = user_texts(request)[-1]
        asked.append(last)
        if "deploy" in last:
            return faux_error("the provider refused the request (400)")
        return faux_assistant("the build is green")

    bot = await bots(responder=responder, delay_ms=20, chunk_size=1)
    await bot.say("1.1", "<@BOT> deploy now", user="U1", name="alice")
    await asyncio.sleep(0)
    await bot.say("1.2", "<@BOT> is the build green?", user="U2", name="bob")
    await bot.settle()
    assert bot.platform.texts(CHANNEL) == [
        "⚠️ The model failed: the provider refused the request (400)",
        "the build is green",
    ]
    assert len(asked) == 2 and "bob" in asked[1]
