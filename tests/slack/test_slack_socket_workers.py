"""Several workers of one Slack app, each with its own Socket Mode connection (the real adapter, slack-sdk's
client, the fake Slack): Slack holds at most ten; the eleventh worker is refused, says so in one line, keeps
asking slowly without crashing, and takes events as soon as a slot frees."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from adapters.bridge import Bridge
from adapters.slack import create
from adapters.slack._socket import REFUSED_LINE
from adapters.slack.adapter import SlackAdapter
from adapters.slack.testing import Channel, FakeSlack, SocketConnection, User
from harness_core import AgentChange, Harness, ModelRef, Models, Registry
from harness_core.models.faux import FauxProvider, faux_assistant
from harness_core.storage import MemoryStorage

WORKER_OPTIONS = {"mode": "socket", "ping_interval": 0.2, "catch_up": False, "edit_interval": 0.0}


@dataclass
class Worker:
    harness: Harness
    bridge: Bridge
    adapter: SlackAdapter
    stopped: bool = False

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        await self.adapter.stop()
        await self.bridge.stop()
        await self.harness.close()


async def start_worker(fake: FakeSlack) -> Worker:
    faux = FauxProvider()
    faux.set_responder(lambda r: faux_assistant("ok"))
    registry = Registry()
    harness = await Harness.open(await MemoryStorage.open(), models=Models(faux), registry=registry)
    bridge = Bridge(harness, agent=AgentChange(model=ModelRef(provider="faux", model_id="m")))
    registry.install(bridge.extension())
    await bridge.start()
    adapter = create(WORKER_OPTIONS, fake.env)
    assert isinstance(adapter, SlackAdapter)
    await adapter.start(bridge)
    harness.resume()
    return Worker(harness, bridge, adapter)


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(seed=3) as running:
        yield running


@pytest.fixture
async def workers() -> AsyncIterator[list[Worker]]:
    running: list[Worker] = []
    yield running
    for worker in running:
        await worker.stop()


async def post_until_on(
    fake: FakeSlack, channel: Channel, user: User, connection: SocketConnection, tries: int = 200
) -> int:
    """Post plain messages until Slack's random pick lands one on `connection`; return how many it took."""
    for n in range(1, tries + 1):
        post = await fake.user_posts(channel, user, f"hello {n}")
        attempt = await post.deliveries[0].wait_acked(10)
        if attempt.connection_id == connection.id:
            return n
    raise AssertionError(f"no event went to connection {connection.id} in {tries} posts")


async def test_eleven_workers_ten_connect_the_eleventh_waits_for_a_free_slot(
    fake: FakeSlack, workers: list[Worker], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="adapters.slack")
    general = fake.add_channel("general")
    alice = fake.add_user("UALICE", name="alice")
    for n in range(1, 11):
        workers.append(await start_worker(fake))
        await fake.wait_for(lambda: len(fake.open_connections) == n, description=f"{n} open connections")  # noqa: B023
    assert not fake.refused_connections
    await fake.wait_for(lambda: all(w.adapter.health().connected for w in workers), description="hello x10")

    eleventh = await start_worker(fake)  # refused, but starting does not fail
    workers.append(eleventh)
    await fake.wait_for(lambda: len(fake.refused_connections) >= 3, timeout=15, description="retries")
    assert len(fake.open_connections) == 10
    assert eleventh.adapter.socket_refused and not eleventh.adapter.health().connected
    assert eleventh.adapter.health().connections_opened == 0  # a refused WebSocket is not a connection
    said = [r for r in caplog.records if REFUSED_LINE in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING  # one line, however many retries
    # Slowly: the gaps between asks grow (ping interval doubled per refusal), no reconnect storm.
    refused_at = [c.opened_at for c in fake.refused_connections]
    gaps = [b - a for a, b in itertools.pairwise(refused_at)]
    assert gaps[-1] >= 0.2

    posts = [await fake.user_posts(general, alice, f"early {i}") for i in range(10)]
    for post in posts:
        attempt = await post.deliveries[0].wait_acked(10)
        assert attempt.connection_id in {c.id for c in fake.open_connections}  # never the refused worker

    await workers[0].stop()  # a worker leaves: its slot frees
    await fake.wait_for(lambda: eleventh.adapter.health().connected, timeout=20, description="eleventh in")
    assert not eleventh.adapter.socket_refused
    assert len(fake.open_connections) == 10
    assert any("slot freed; this worker takes Slack events again" in r.getMessage() for r in caplog.records)
    mine = fake.open_connections[-1]
    await post_until_on(fake, general, alice, mine)  # acked there: the eleventh worker took it in
    assert not eleventh.stopped

    # A refused worker stops cleanly while it waits to ask again: nothing of it keeps running.
    before = asyncio.all_tasks()
    twelfth = await start_worker(fake)
    await fake.wait_for(lambda: twelfth.adapter.socket_refused, description="the twelfth refused")
    await asyncio.wait_for(twelfth.stop(), 10)
    await asyncio.sleep(0)
    leftover = [t for t in asyncio.all_tasks() - before if not t.done() and not _is_fake(t)]
    assert leftover == [], leftover
    assert len(fake.open_connections) == 10


def _is_fake(task: asyncio.Task[object]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    filename = getattr(code, "co_filename", "")
    return "/adapters/slack/_fake_" in filename or filename.endswith("/adapters/slack/testing.py")
