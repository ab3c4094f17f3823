"""Pacing on Slack, end to end: a real bot process against the fake Slack. Every write the bridge makes into
one channel (posts and `chat.update`s of two answers streaming there at once, final updates included) is at
least `edit_interval` apart as Slack receives them, and after a `ratelimited` with Retry-After 1 nothing is
written into that channel for a second. Assertions are lower bounds on spacing, not durations."""

from __future__ import annotations

import itertools

import pytest
from slack_e2e import STORY, Bots, People, replies_of_bot

from adapters.slack.testing import Channel, FakeSlack, RecordedCall

pytestmark = pytest.mark.timeout(90)

INTERVAL = 0.25
TOLERANCE = 0.01  # the bridge spaces writes from the end of the previous one; this only absorbs rounding
WRITES = ("chat.postMessage", "chat.update", "chat.startStream", "chat.appendStream", "chat.stopStream")


def writes_into(fake: FakeSlack, channel: Channel) -> list[RecordedCall]:
    calls = [c for m in WRITES for c in fake.calls_to(m) if c.args.get("channel") == channel.id]
    return sorted(calls, key=lambda c: c.received_at)


def listing(calls: list[RecordedCall]) -> list[tuple[str, float, str]]:
    return [(c.method, round(c.received_at, 3), c.outcome) for c in calls]


def spacing(calls: list[RecordedCall]) -> float:
    return min(b.received_at - a.received_at for a, b in itertools.pairwise(calls))


async def test_writes_into_one_channel_share_one_budget_and_honour_retry_after(
    fake: FakeSlack, people: People, bots: Bots
) -> None:
    general = fake.add_channel("general")
    random = fake.add_channel("random")
    # chat.update only (no chat.*Stream), so every partial is an update the bridge paces.
    bot = await bots.start(
        {"chunk_size": 8, "delay_ms": 20, "slack": {"edit_interval": INTERVAL, "stream": False}}
    )
    limited = fake.rate_limit(
        "chat.update", times=1, retry_after=1, match=lambda c: c.args.get("channel") == general.id
    )
    mention = f"<@{fake.bot_user_id}>"
    topic = await fake.user_posts(general, people.carol, "release notes")
    await topic.wait_acked()
    # Two answers stream into general at once (the channel's and a thread's fork), one into random.
    asks = [
        await fake.user_posts(general, people.alice, f"{mention} a story please"),
        await fake.user_posts(general, people.bob, f"{mention} a story too", thread_ts=topic.ts),
        await fake.user_posts(random, people.carol, f"{mention} a story here"),
    ]
    for ask in asks:
        await ask.wait_acked()

    def done() -> bool:
        answers = [
            replies_of_bot(fake, general),
            replies_of_bot(fake, general, topic.ts),
            replies_of_bot(fake, random),
        ]
        return all([m.text for m in found] == [STORY] for found in answers)

    await fake.wait_for(done, 30, description="three finished stories")
    await bot.stop()

    in_general = writes_into(fake, general)
    updates = [c for c in in_general if c.method == "chat.update"]
    assert len({c.args.get("ts") for c in updates}) == 2  # both answers were updated in general
    assert spacing(in_general) >= INTERVAL - TOLERANCE, listing(in_general)
    assert spacing(updates) >= INTERVAL - TOLERANCE
    [refused] = limited.hits
    after = in_general[in_general.index(refused) + 1]
    assert after.received_at - refused.received_at >= 1.0 - TOLERANCE, listing(in_general)
    in_random = writes_into(fake, random)
    assert len(in_random) >= 2 and spacing(in_random) >= INTERVAL - TOLERANCE, listing(in_random)
