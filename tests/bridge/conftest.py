from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from .support import Bot, open_bot


@pytest.fixture
async def bots() -> AsyncIterator[Callable[..., Awaitable[Bot]]]:
    """`await bots(...)` opens a bot (see `open_bot`); every bot still open is closed after the test."""
    opened: list[Bot] = []

    async def make(*args: Any, **kwargs: Any) -> Bot:
        bot = await open_bot(*args, **kwargs)
        opened.append(bot)
        return bot

    yield make
    for bot in reversed(opened):
        await bot.close()
