"""The bridge's write guard: every platform write (here: a reply) asks it first, and a refusal means the
platform sees nothing. The runtime passes the PostgreSQL lease check, so an ex-owner never posts."""

from __future__ import annotations

import asyncio

from harness_core import LeaseLost

from .support import CHANNEL, open_bot


async def test_a_refused_write_guard_keeps_every_reply_off_the_platform() -> None:
    allowed = {"now": False}
    asked: list[bool] = []

    def guard() -> None:
        asked.append(allowed["now"])
        if not allowed["now"]:
            raise LeaseLost("the lease was taken over by pid 1 on elsewhere")

    bot = await open_bot(write_guard=guard)
    try:
        await bot.say("m1", "<@BOT> hello")
        await bot.harness.wait_for_idle()
        await asyncio.sleep(0.3)
        assert asked and not any(asked)  # the reply tried to go out and was refused every time
        assert bot.platform.in_place(CHANNEL) == []
    finally:
        await bot.close()


async def test_an_allowing_write_guard_is_asked_before_each_write() -> None:
    asked: list[int] = []
    bot = await open_bot(write_guard=lambda: asked.append(1))
    try:
        await bot.say("m1", "<@BOT> hello")
        await bot.settle()
        assert bot.platform.texts(CHANNEL)
        assert len(asked) >= 1
    finally:
        await bot.close()
