"""Pacing on the bridge: every write into one channel (posts, continuation posts, streaming edits, final edits,
from any number of reply workers) shares one budget of one write per `edit_interval`; a Retry-After pushes
that channel's next write out; other channels go on. Assertions are lower bounds on spacing (behaviour), never
upper bounds on durations."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from adapters.bridge import ApprovalPolicy, GateView, Place, RateGovernor, RetryLater
from adapters.bridge.testing import MemoryTransport
from harness_core import tool
from harness_core.messages import AssistantMessage, UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import faux_assistant

from .support import Bot, deploy_flow, open_bot

INTERVAL = 0.2
TOLERANCE = 0.01  # the governor spaces writes by at least the interval; this only absorbs float rounding
C1 = Place("memory", "T1", "C1")
C2 = Place("memory", "T1", "C2")
STORY = " ".join(f"Step {i} of the rollout went fine." for i in range(1, 30))  # ~900 chars, streamed slowly


@dataclass
class Write:
    at: float  # time.monotonic() when the bridge called the transport
    place: Place
    kind: str  # create | edit | post_approval | update_approval
    key: str
    refused: bool = False


class TimedTransport(MemoryTransport):
    """A `MemoryTransport` that records when every post and edit was made, and can refuse the next edit in a
    channel with a Retry-After."""

    def __init__(self, interval: float) -> None:
        super().__init__(edit_interval=interval)
        self.writes: list[Write] = []
        self.refuse_edit: dict[str, float] = {}  # channel -> Retry-After seconds for its next edit
        self.refused = asyncio.Event()

    def in_channel(self, channel: str) -> list[Write]:
        return sorted((w for w in self.writes if w.place.channel == channel), key=lambda w: w.at)

    async def create(
        self, target: Place, text: str, key: str, *, final: bool = False, requester: str | None = None
    ) -> str:
        self.writes.append(Write(time.monotonic(), target, "create", key))
        return await super().create(target, text, key, final=final, requester=requester)

    async def edit(self, target: Place, message_id: str, text: str, key: str, *, final: bool) -> None:
        write = Write(time.monotonic(), target, "edit", key)
        self.writes.append(write)
        seconds = self.refuse_edit.pop(target.channel, None)
        if seconds is not None:
            write.refused = True
            self.refused.set()
            raise RetryLater(seconds, "ratelimited")
        await super().edit(target, message_id, text, key, final=final)

    async def post_approval(self, target: Place, gate: GateView, key: str) -> str:
        self.writes.append(Write(time.monotonic(), target, "post_approval", key))
        return await super().post_approval(target, gate, key)

    async def update_approval(self, target: Place, message_id: str, gate: GateView) -> None:
        self.writes.append(Write(time.monotonic(), target, "update_approval", str(gate.gate_id)))
        await super().update_approval(target, message_id, gate)


def story_or_short(request: ModelRequest) -> AssistantMessage:
    asked = [user_text(m) for m in request.messages if isinstance(m, UserMessage)][-1]
    return faux_assistant(STORY if "story" in asked else f"answer to {asked}")


@pytest.fixture
async def world(bots: Callable[..., Awaitable[Bot]]) -> Bot:
    # A story streams for about a second: many partials.
    return await bots(responder=story_or_short, platform=TimedTransport(INTERVAL), chunk_size=8, delay_ms=8)


def timed(bot: Bot) -> TimedTransport:
    assert isinstance(bot.platform, TimedTransport)
    return bot.platform


def gaps(writes: list[Write]) -> list[float]:
    return [later.at - earlier.at for earlier, later in itertools.pairwise(writes)]


def listing(writes: list[Write]) -> list[tuple[str, str, float, bool]]:
    return [(w.kind, w.key, round(w.at, 3), w.refused) for w in writes]


async def test_writes_of_concurrent_replies_in_one_channel_share_one_budget(world: Bot) -> None:
    first, second = C1.in_thread("100.1"), C1.in_thread("100.2")
    # Two threads of C1 answer at the same time (two forks, two reply workers); C2 answers alongside.
    await world.say("100.3", "<@BOT> story one", place=first)
    await world.say("100.4", "<@BOT> story two", place=second)
    await world.say("200.1", "<@BOT> story three", place=C2)
    await world.settle()

    for place in (first, second, C2):
        assert timed(world).texts(place) == [STORY]  # every final text was shown (paced, not skipped)
    in_c1 = timed(world).in_channel("C1")
    by_reply = {place: [w for w in in_c1 if w.place == place] for place in (first, second)}
    assert all(len(writes) >= 3 for writes in by_reply.values())  # a post, partial edits, the final edit
    # The two replies really wrote at the same time (interleaved), yet never closer than the interval.
    assert by_reply[first][0].at < by_reply[second][-1].at and by_reply[second][0].at < by_reply[first][-1].at
    assert min(gaps(in_c1)) >= INTERVAL - TOLERANCE, listing(in_c1)
    in_c2 = timed(world).in_channel("C2")
    assert len(in_c2) >= 3 and min(gaps(in_c2)) >= INTERVAL - TOLERANCE, listing(in_c2)


async def test_retry_after_pushes_back_every_write_into_that_channel_and_only_there(world: Bot) -> None:
    first, second = C1.in_thread("100.1"), C1.in_thread("100.2")
    timed(world).refuse_edit["C1"] = 1.0  # the first edit in C1 is rate limited: Retry-After 1 s
    await world.say("100.3", "<@BOT> story one", place=first)
    await world.say("100.4", "<@BOT> story two", place=second)
    await asyncio.wait_for(timed(world).refused.wait(), 10)
    await world.say("200.1", "<@BOT> quick one", place=C2)  # C2 is not held up by C1's back-off
    await world.settle()

    assert timed(world).texts(first) == [STORY] and timed(world).texts(second) == [STORY]
    assert timed(world).texts(C2) == ["answer to alice: <@BOT> quick one"]
    in_c1 = timed(world).in_channel("C1")
    [refused] = [w for w in in_c1 if w.refused]
    after = in_c1[in_c1.index(refused) + 1]
    # Neither reply worker of C1 wrote there again within the second the platform asked for.
    assert after.at - refused.at >= 1.0 - TOLERANCE, listing(in_c1)
    assert min(gaps(in_c1)) >= INTERVAL - TOLERANCE, listing(in_c1)
    # Meanwhile C2 was answered in full.
    in_c2 = timed(world).in_channel("C2")
    assert in_c2 and all(refused.at < w.at < after.at for w in in_c2), (listing(in_c2), refused.at, after.at)


async def test_governor_slots_queue_per_key_count_from_the_end_and_honour_retry_after() -> None:
    governor = RateGovernor()
    starts: dict[str, list[float]] = {"a": [], "b": []}

    async def write(key: str, duration: float) -> None:
        async with governor.slot(key, interval=0.1):
            starts[key].append(time.monotonic())
            await asyncio.sleep(duration)

    await asyncio.gather(*(write("a", 0.05) for _ in range(3)), write("b", 0.0))
    # Key a: each call starts at least the interval after the previous one *ended*.
    assert all(g >= 0.15 - TOLERANCE for g in (y - x for x, y in itertools.pairwise(starts["a"])))
    assert starts["b"][0] < starts["a"][1]  # key b did not queue behind key a

    with pytest.raises(RetryLater):
        async with governor.slot("b", interval=0.0):
            raise RetryLater(0.3, "ratelimited")
    refused_at = time.monotonic()
    await write("b", 0.0)
    assert starts["b"][-1] - refused_at >= 0.3 - TOLERANCE


async def test_approval_requests_and_their_decisions_share_the_channel_budget() -> None:
    """An approval card is a write into the channel like any other: it is posted at the moment the reply
    starts showing "waiting for approval", and updated at the moment the reply goes on, so both must queue
    with the reply's writes instead of going out next to them."""
    runs: list[str] = []

    @tool
    def deploy(service: str) -> str:
        """Deploy a service."""
        runs.append(service)
        return f"deployed {service}"

    platform = TimedTransport(INTERVAL)
    policy = ApprovalPolicy(tools=["deploy"], approvers=["UBOSS"])
    bot = await open_bot(responder=deploy_flow, tools=[deploy], approvals=[policy], platform=platform)
    try:
        await bot.say("100.1", "ship it", place=C1)
        for _ in range(500):
            if any(w.kind == "post_approval" for w in platform.writes):
                break
            await asyncio.sleep(0.01)
        [card] = [m for m in platform.messages if m.gate is not None]
        assert card.gate is not None
        await asyncio.sleep(INTERVAL * 3)  # the reply shows "waiting for approval" by now
        decision = await bot.bridge.decide(
            card.gate.gate_id, user_id="UBOSS", user_name="boss", action="approve"
        )
        assert decision.accepted
        await bot.settle()
        for _ in range(500):
            if any(w.kind == "update_approval" for w in platform.writes):
                break
            await asyncio.sleep(0.01)
    finally:
        await bot.close()
    assert runs == ["api"]
    in_c1 = platform.in_channel("C1")
    assert {w.kind for w in in_c1} >= {"create", "edit", "post_approval", "update_approval"}, listing(in_c1)
    assert min(gaps(in_c1)) >= INTERVAL - TOLERANCE, listing(in_c1)
