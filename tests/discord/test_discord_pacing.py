"""Pacing on Discord, end to end: a real bot process against the fake Discord. A long answer streams into a
channel as several messages (split at 2000 characters); every post and edit the bridge makes into that channel
is at least `edit_interval` apart as Discord receives them, and after a 429 with retry_after 1 the channel's
next request comes a second later. Assertions are lower bounds on spacing, not durations. (No
``__init__.py`` here, see test_fake_discord.py.)"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from bot_support import MESSAGE_ROUTE, MESSAGES_ROUTE, Bots

from adapters.discord.testing import FakeChannel, FakeDiscord, RequestRecord

pytestmark = pytest.mark.timeout(90)

INTERVAL = 0.25
TOLERANCE = 0.01  # the bridge spaces writes from the end of the previous one; this only absorbs rounding


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(heartbeat_interval=0.5) as fake:
        yield fake


@pytest.fixture
async def bots(fake: FakeDiscord, tmp_path: Path) -> AsyncIterator[Bots]:
    config = {"adapter": {"edit_interval": INTERVAL, "guild_ready_timeout": 0.05}, "answer": "all"}
    bots = Bots(fake, tmp_path, config)
    yield bots
    await bots.close()
    for index, bot in enumerate(bots.started):
        print(f"--- bot process {index} (pid {bot.pid}) ---\n{bot.log()}")  # shown when a test fails


def writes_into(fake: FakeDiscord, channel: FakeChannel) -> list[RequestRecord]:
    """Posts and edits of messages in `channel`, in arrival order (a 429 and discord.py's retry both count)."""
    calls = fake.calls("POST", MESSAGES_ROUTE) + fake.calls("PATCH", MESSAGE_ROUTE)
    return sorted((r for r in calls if r.params.get("channel_id") == str(channel.id)), key=lambda r: r.at)


def listing(records: list[RequestRecord]) -> list[tuple[str, float, int | None]]:
    return [(r.method, round(r.at, 3), r.status) for r in records]


def spacing(records: list[RequestRecord]) -> float:
    return min(b.at - a.at for a, b in itertools.pairwise(records))


async def test_posts_and_edits_into_one_channel_share_one_budget_and_honour_retry_after(
    fake: FakeDiscord, bots: Bots
) -> None:
    guild = fake.add_guild("Ops")
    general = fake.add_text_channel(guild, "general")
    ops = fake.add_text_channel(guild, "ops")
    alice = fake.add_user("alice", global_name="Alice")
    fake.add_member(guild, alice)
    bot = await bots.start(chunk_size=50, delay_ms=10)  # ~5,000 characters stream for about a second
    limited = fake.rate_limit(
        "PATCH",
        MESSAGE_ROUTE,
        retry_after=1.0,
        match=lambda r: r.params.get("channel_id") == str(general.id),
    )
    await fake.user_sends(general, alice, "a long answer please")
    await fake.user_sends(ops, alice, "a long answer here too")
    await bot.wait_event("delivered", count=2)  # both answers shown in full and recorded
    assert await bot.terminate() == 0

    in_general = writes_into(fake, general)
    assert len(fake.bot_messages(general)) >= 3  # split into parts: posts and edits of several messages
    assert len([r for r in in_general if r.method == "PATCH"]) >= 3
    assert spacing(in_general) >= INTERVAL - TOLERANCE, listing(in_general)
    [refused] = [r for r in in_general if r.status == 429]
    assert limited.calls == 1
    after = in_general[in_general.index(refused) + 1]
    assert after.at - refused.at >= 1.0 - TOLERANCE, listing(in_general)
    in_ops = writes_into(fake, ops)
    assert len(in_ops) >= 3 and spacing(in_ops) >= INTERVAL - TOLERANCE, listing(in_ops)
    assert any(refused.at < r.at < after.at for r in in_ops)  # ops went on while general was held back
