"""The bridge's per-message and per-channel memory stays bounded, and what falls out costs a repeat, never a
lost or doubled answer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from adapters.bridge import Place
from adapters.bridge.bounded import Bounded
from adapters.bridge.governor import PRUNE_ABOVE, RateGovernor
from harness_core._context_cache import ContextCache

from .support import Bot, user_texts

Bots = Callable[..., Awaitable[Bot]]


def places(count: int) -> list[Place]:
    return [Place("memory", "T1", f"C{n}") for n in range(count)]


async def test_nothing_is_kept_per_answered_message_once_it_is_final(bots: Bots) -> None:
    bot = await bots(chunk_size=4)  # streams: every answer is posted, then edited
    channels = places(5)
    for round_ in range(4):
        for n, place in enumerate(channels):
            await bot.say(f"{round_}.{n}", f"<@BOT> question {round_} in {n}", place=place)
        await bot.settle()
    for place in channels:
        assert len(bot.platform.texts(place)) == 4
    assert len(bot.bridge.shown) == 0  # was one entry per bot message, for ever
    assert bot.bridge.delivery.by_conversation == {}  # was one (empty) set per conversation, for ever


async def test_a_tiny_shown_cache_still_shows_every_answer_once_with_its_final_text(bots: Bots) -> None:
    bot = await bots(chunk_size=2, delay_ms=1)
    bot.bridge.shown = Bounded(1)  # concurrent streams evict each other's entries all the time
    channels = places(4)
    for n, place in enumerate(channels):
        await bot.say(f"1.{n}", f"<@BOT> a longer question number {n}", place=place)
    await bot.settle()
    for n, place in enumerate(channels):
        [message] = bot.platform.in_place(place)
        assert message.text == f"answer to alice: <@BOT> a longer question number {n}"
    creates = [key for call, key in bot.platform.calls if call == "create"]
    assert len(creates) == len(set(creates)) == len(channels)


async def test_the_governor_forgets_idle_channels() -> None:
    governor = RateGovernor()
    for n in range(PRUNE_ABOVE * 3):
        async with governor.slot(f"channel:{n}", interval=0.0):
            pass
    assert len(governor) <= PRUNE_ABOVE + 1  # was one entry per channel ever written to


async def test_the_governor_keeps_a_channel_whose_back_off_is_still_ahead() -> None:
    governor = RateGovernor()
    governor.back_off(30.0, "channel:slow")
    for n in range(PRUNE_ABOVE * 2):
        async with governor.slot(f"channel:{n}", interval=0.0):
            pass
    waiting: asyncio.Task[Any] = asyncio.create_task(governor.acquire("channel:slow", interval=0.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # pruning did not forget the Retry-After
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)


def test_bounded_keeps_the_most_recently_used() -> None:
    kept: Bounded[str, int] = Bounded(2)
    kept["a"], kept["b"] = 1, 2
    assert kept["a"] == 1  # "a" is now the most recent
    kept["c"] = 3
    assert dict(kept) == {"a": 1, "c": 3}


async def test_conversations_evicted_from_a_tiny_context_cache_are_answered_with_their_whole_context(
    bots: Bots, tmp_path: Path
) -> None:
    bot = await bots(tmp_path / "bot.sqlite")
    cache = ContextCache(max_bytes=2_000)  # smaller than two conversations: every turn evicts another
    bot.harness.context_cache = cache
    bot.harness.session.subscribe(cache.on_publication)
    channels = places(3)
    for round_ in range(3):
        for n, place in enumerate(channels):
            await bot.say(f"{round_}.{n}", f"<@BOT> round {round_} in {n}", place=place)
            await bot.settle()
    assert cache.size[1] <= 2_000 and cache.size[0] < len(channels)
    for n, place in enumerate(channels):
        texts = bot.platform.texts(place)
        assert texts == [f"answer to alice: <@BOT> round {r} in {n}" for r in range(3)]  # each once
        [last] = bot.requests_seeing(f"round 2 in {n}")
        assert [t for t in user_texts(last) if "<@BOT>" in t] == [
            f"alice: <@BOT> round {r} in {n}" for r in range(3)
        ]  # the evicted context came back whole from storage
