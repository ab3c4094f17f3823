"""Many workers on one PostgreSQL store: real `python -m bots run` processes sharing the partitions of a real
PostgreSQL database, against the fake Slack (one Socket Mode connection per worker, each event delivered to
one random connection, unacknowledged envelopes sent again) and a model server that answers with the tokens of
the messages it was asked about, so every answer names the message(s) it answers.

The must-show run: 3 workers, 30 channels, 600 messages from 20 people over 60 s; one worker SIGKILLed in the
middle, a fourth started, then every live worker SIGTERMed and restarted one by one (a rolling deploy). Every
message is answered exactly once, in order within its channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncpg
import pytest
from bots_cli_support import bot_env, free_port, shipped_config_in, toml_value
from workers_support import TOKEN, DatabaseLink, EchoModel, SlackTaps, Worker, token

from adapters.slack.testing import Channel, FakeSlack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

TTL = 3.0
PARTITIONS = 64  # the default
CHANNELS = 30
PEOPLE = 20
MESSAGES = 600
SPAN = 60.0  # seconds over which the messages are posted
SLACK = """
[adapters.slack]
mode = "socket"
edit_interval = 0.05
"""


def workers_config(
    workdir: Path, url: str, *, partitions: int = PARTITIONS, admin: int | None = None
) -> Path:
    return shipped_config_in(
        workdir,
        replace={
            'path = "var/ops.sqlite"': f"url = {toml_value(url)}\nlease_ttl = {TTL}\npartitions = {partitions}",
            'model = "faux:demo"': 'model = "openai:gpt-4o"',
        },
        append=SLACK + (f'\n[admin]\nlisten = "127.0.0.1:{admin}"\n' if admin else ""),
    )


class Fleet:
    """The workers of one test, each with its own Slack API tap (and, on request, its own database link)."""

    def __init__(self, fake: FakeSlack, model: EchoModel, workdir: Path, url: str, taps: SlackTaps) -> None:
        self.fake = fake
        self.workdir = workdir
        self.url = url
        self.taps = taps
        self.config = workers_config(workdir, url)
        self.env = bot_env(workdir, **fake.env, OPENAI_BASE_URL=model.url, OPENAI_API_KEY="sk-test-workers")
        self.workers: list[Worker] = []
        self.links: list[DatabaseLink] = []

    async def start(
        self,
        name: str,
        *,
        link: DatabaseLink | None = None,
        partitions: int = PARTITIONS,
        admin: int | None = None,
    ) -> Worker:
        env = {**self.env, "SLACK_API_URL": await self.taps.tap(name)}
        config = self.config
        if link is not None or partitions != PARTITIONS or admin is not None:
            url = self.url
            if link is not None:
                port = await link.start()
                parts = urlsplit(self.url)
                url = parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}").geturl()
                self.links.append(link)
            own = self.workdir / name
            own.mkdir()
            config = workers_config(own, url, partitions=partitions, admin=admin)
        worker = await Worker.start(name, config, env, self.workdir)
        self.workers.append(worker)
        return worker

    async def close(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(ProcessLookupError):
                if worker.process.returncode is None:
                    worker.process.send_signal(signal.SIGCONT)
            await worker.kill()
        for link in self.links:
            await link.close()


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    # Slack re-sends an envelope nobody acknowledged (a worker killed before its ack) to another connection.
    async with FakeSlack(auto_retry=True, ack_timeout=2.0, retry_delays=(0.0, 0.5, 1.0), seed=16) as running:
        yield running


@pytest.fixture
async def fleet(fake: FakeSlack, tmp_path: Path, pg_url: str) -> AsyncIterator[Fleet]:
    async with EchoModel() as model:
        taps = SlackTaps(fake.api_url)
        running = Fleet(fake, model, tmp_path, pg_url, taps)
        running.model = model  # type: ignore[attr-defined]
        try:
            yield running
        finally:
            await running.close()
            await taps.close()


def answers(fake: FakeSlack, channel: Channel) -> list[tuple[float, list[str], str]]:
    """(ts, tokens, text) of every bot message in `channel`, oldest first."""
    found = [(float(m.ts), TOKEN.findall(m.text or ""), m.text or "") for m in fake.bot_messages(channel)]
    return sorted(found)


def check_exactly_once_in_order(
    fake: FakeSlack, channels: list[Channel], asked: dict[str, list[str]], events: Sequence[str] = ()
) -> None:
    for channel in channels:
        shown = answers(fake, channel)
        tokens = [t for _, found, _ in shown for t in found]
        assert all(found and text.startswith("re: ") for _, found, text in shown), (
            f"{channel.name}: a bot message that answers nothing: {[t for _, f, t in shown if not f]}"
        )
        assert tokens == asked[channel.id], (
            f"{channel.name}: answered {tokens}, asked {asked[channel.id]} (each once, in order); {events}"
        )


def answered_tokens(fake: FakeSlack, channel: Channel) -> list[str]:
    return [t for _, found, _ in answers(fake, channel) for t in found]


async def settled_share(workers: Sequence[Worker], partitions: int = PARTITIONS, timeout: float = 60) -> None:
    """Wait until the workers said they own every partition between them, each some (the join settled:
    partitions are handed over a few per tick)."""
    async with asyncio.timeout(timeout):
        while True:
            owned = [w.owned() for w in workers]
            if sum(o or 0 for o in owned) == partitions and all(owned):
                return
            await asyncio.sleep(0.1)


async def test_three_workers_kill_join_and_rolling_deploy_answer_every_message_once_in_order(
    fake: FakeSlack, fleet: Fleet
) -> None:
    channels = [fake.add_channel(f"team-{n:02d}") for n in range(CHANNELS)]
    people = [
        fake.add_user(f"U{n:03d}", name=f"person{n}", display_name=f"Person {n}") for n in range(PEOPLE)
    ]

    first = await fleet.start("w1")
    await first.ready()
    second, third = await fleet.start("w2"), await fleet.start("w3")
    await asyncio.gather(second.ready(), third.ready())
    assert len(fake.open_connections) == 3  # one Socket Mode connection per worker
    await settled_share((first, second, third))

    rng = random.Random(16)
    asked: dict[str, list[str]] = {c.id: [] for c in channels}
    posted_at: dict[str, float] = {}
    events: list[str] = []
    started = time.monotonic()

    async def traffic() -> None:
        for n in range(MESSAGES):
            await asyncio.sleep(max(0.0, started + n * SPAN / MESSAGES - time.monotonic()))
            channel = channels[n % CHANNELS]
            text = token(n % CHANNELS, n // CHANNELS)
            asked[channel.id].append(text)
            posted_at[text] = time.time()
            await fake.user_posts(channel, rng.choice(people), f"{text} how is it going?")

    async def operations() -> None:
        await asyncio.sleep(SPAN * 0.2)
        second.process.send_signal(signal.SIGKILL)
        events.append(f"killed w2 at {time.time():.3f}")
        assert await second.finish(30) == -signal.SIGKILL
        await asyncio.sleep(SPAN * 0.15)
        fourth = await fleet.start("w4")
        await fourth.ready()  # ready once it owns a partition: the others handed some over
        assert (fourth.owned() or 0) > 0, fourth.output()
        events.append(f"w4 ready at {time.time():.3f}")
        for old in (first, third, fourth):  # the rolling deploy
            old.process.send_signal(signal.SIGTERM)
            assert await old.finish(60) == 0, old.output() + old.stderr()
            assert "durable-bots: stopped cleanly" in old.output(), old.output()
            new = await fleet.start(f"{old.name}-new")
            await new.ready()
            events.append(f"{old.name} replaced at {time.time():.3f}")

    killed_at = time.time() + SPAN * 0.2
    await asyncio.gather(traffic(), operations())
    await fake.wait_for(
        lambda: all(len(answered_tokens(fake, c)) >= len(asked[c.id]) for c in channels),
        120,
        description="every message answered",
    )
    live = [w for w in fleet.workers if w.process.returncode is None]
    assert len(live) == 3
    for worker in live:
        worker.process.send_signal(signal.SIGTERM)
    for worker in live:
        assert await worker.finish(60) == 0, worker.output() + worker.stderr()
    # Every worker has stopped: anything (wrongly) posted twice has shown up by now.
    check_exactly_once_in_order(fake, channels, asked, events)

    # The killed worker's channels went on within the lease ttl (plus the time to open a partition and the
    # per-channel pacing of a loaded 2-core machine).
    answered_at = {t: ts for c in channels for ts, found, _ in answers(fake, c) for t in found}
    after_kill = [t for t, at in posted_at.items() if killed_at <= at <= killed_at + 5]
    slowest = max(answered_at[t] - posted_at[t] for t in after_kill)
    assert slowest <= TTL + 20, (slowest, events)


async def test_a_worker_cut_off_the_database_stops_writing_to_slack_within_the_ttl(
    fake: FakeSlack, fleet: Fleet, pg_url: str
) -> None:
    channels = [fake.add_channel(f"room-{n}") for n in range(12)]
    alice = fake.add_user("UALICE", name="alice", display_name="Alice")
    parts = urlsplit(pg_url)
    link = DatabaseLink(parts.hostname or "127.0.0.1", parts.port or 5432)
    cut_off = await fleet.start("cut", link=link)
    await cut_off.ready()
    other = await fleet.start("other")
    await other.ready()
    await settled_share((cut_off, other))

    # Both answer: one message per channel lands on each worker's partitions.
    since = time.monotonic()
    for n, channel in enumerate(channels):
        await fake.user_posts(channel, alice, f"{token(n, 0)} hello")
    await fake.wait_for(lambda: all(fake.bot_messages(c) for c in channels), 60, description="first answers")
    assert fleet.taps.writes_by("cut", since) and fleet.taps.writes_by("other", since)

    # A long answer streams from the worker to be cut off; while it streams, its database goes away.
    model: EchoModel = fleet.model  # type: ignore[attr-defined]
    slow = {token(n, 1) for n in range(len(channels))}
    model.slow |= slow
    # Long enough to outlast the cut, the ttl and the 4 s watched after it (the other worker streams it again).
    model.slow_seconds = 12.0
    streaming = time.monotonic()
    for n, channel in enumerate(channels):
        await fake.user_posts(channel, alice, f"{token(n, 1)} tell me more")
    await fake.wait_for(
        lambda: len(fleet.taps.writes_by("cut", streaming)) >= 2, 30, description="the cut-off worker streams"
    )
    link.cut()
    assert link.cut_at is not None
    # The watched window ends before the slow answers would have (they started after `streaming`): a worker
    # that went on writing would show it.
    assert link.cut_at + TTL + 4 < streaming + model.slow_seconds, "the cut came too late to tell anything"
    await asyncio.sleep(TTL + 4)
    late = fleet.taps.writes_by("cut", link.cut_at + TTL)
    assert late == [], f"writes after the lease ran out: {late}"
    assert cut_off.process.returncode is None  # it lives on (a database outage is not a crash)

    # The other worker took the partitions over and finishes every answer: each message answered once.
    await fake.wait_for(
        lambda: all(
            any(
                token(n, 1) in (m.text or "") and (m.text or "").rstrip().endswith(".")
                for m in fake.bot_messages(c)
            )
            for n, c in enumerate(channels)
        ),
        model.slow_seconds * 3 + 30,
        description="the slow answers finished by the other worker",
    )
    for n, channel in enumerate(channels):
        assert answered_tokens(fake, channel) == [token(n, 0), token(n, 1)], channel.name


async def scrape(port: int) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        return await response.text()


async def readyz(port: int) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/readyz") as response,
    ):
        return response.status, await response.json(content_type=None)


async def test_a_worker_that_owns_no_partition_is_a_standby_connected_to_no_platform(
    fake: FakeSlack, fleet: Fleet, pg_url: str
) -> None:
    """Both partitions are held elsewhere (another worker, as far as this one can tell): the worker opens no
    Socket Mode connection and is not ready; once they are released it takes them, connects and answers, and
    its /metrics count what its partitions did."""
    general = fake.add_channel("general")
    alice = fake.add_user("UALICE", name="alice", display_name="Alice")
    conn = await asyncpg.connect(pg_url)
    try:
        for partition in (0, 1):
            await conn.execute(
                "INSERT INTO leases (partition, holder, pid, host, epoch, acquired_at, expires_at) "
                "VALUES ($1, 'elsewhere', 1, 'other-host', 1, now(), now() + interval '1 minute') "
                "ON CONFLICT (partition) DO UPDATE SET holder = 'elsewhere', epoch = leases.epoch + 1, "
                "expires_at = now() + interval '1 minute'",
                partition,
            )
        port = free_port()
        standby = await fleet.start("standby", partitions=2, admin=port)
        await standby.wait_for(
            lambda line: line.startswith("durable-bots: standby: this worker owns none"), 60
        )
        await asyncio.sleep(TTL)  # three balancer ticks (ttl/3): time to (wrongly) take a lease or connect
        assert fake.open_connections == [] and not any(
            line.startswith("durable-bots: ready") for line in standby.lines
        )
        status, body = await readyz(port)
        assert status == 503 and body["not_ready"]["bot"] == "standby: owns none of the 2 partitions", body

        await conn.execute("UPDATE leases SET holder = NULL, expires_at = now() - interval '1 second'")
        await standby.ready(30)
        await standby.wait_for(lambda line: line == "durable-bots: worker owns 2 of 2 partitions", 30)
        assert len(fake.open_connections) == 1 and (await readyz(port))[0] == 200
        await fake.user_posts(general, alice, f"{token(0, 0)} anyone there?")
        await fake.wait_for(
            lambda: answered_tokens(fake, general) == [token(0, 0)], 30, description="the answer"
        )
        # /metrics sums the partitions a worker runs (the channel's partition is one of the two).
        text = ""
        for _ in range(50):
            text = await scrape(port)
            if 'durable_bots_answers_delivered_total{platform="slack"} 1.0' in text:
                break
            await asyncio.sleep(0.1)
        assert 'durable_bots_messages_taken_in_total{platform="slack"} 1.0' in text, text
        assert 'durable_bots_answers_delivered_total{platform="slack"} 1.0' in text, text
        standby.process.send_signal(signal.SIGTERM)
        assert await standby.finish(60) == 0, standby.output() + standby.stderr()
    finally:
        await conn.close()
