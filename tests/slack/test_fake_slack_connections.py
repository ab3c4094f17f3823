"""The fake Slack with several Socket Mode connections of one app (several worker processes): each envelope
goes to one random open connection, an unacknowledged one is re-sent (to a random open connection, with
`retry_attempt`/`retry_reason`), and the eleventh connection is refused with `too_many_websockets`.

The app side here is a bare aiohttp WebSocket client, so each test decides exactly which frames get acked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.testing import FakeSlack


class RawSocket:
    """One Socket Mode connection opened by hand: records every frame, acks only when told to."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, ack: bool) -> None:
        self.ws = ws
        self.ack = ack
        self.frames: list[dict[str, Any]] = []
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            frame = json.loads(msg.data)
            self.frames.append(frame)
            if self.ack and "envelope_id" in frame:
                await self.ws.send_str(json.dumps({"envelope_id": frame["envelope_id"]}))

    @property
    def envelopes(self) -> list[dict[str, Any]]:
        return [f for f in self.frames if "envelope_id" in f]

    async def close(self) -> None:
        await self.ws.close()
        with contextlib.suppress(Exception):
            await self.reader


class Sockets:
    def __init__(self, fake: FakeSlack, session: aiohttp.ClientSession) -> None:
        self.fake = fake
        self.session = session
        self.opened: list[RawSocket] = []

    async def open(self, *, ack: bool = True) -> RawSocket:
        client = AsyncWebClient(token=self.fake.app_token, base_url=self.fake.api_url)
        url = (await client.apps_connections_open(app_token=self.fake.app_token))["url"]
        sock = RawSocket(await self.session.ws_connect(url, autoping=True), ack)
        self.opened.append(sock)
        await self.fake.wait_for(lambda: sock.frames or sock.reader.done(), description="first frame")
        return sock


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(seed=7) as running:
        yield running


@pytest.fixture
async def sockets(fake: FakeSlack) -> AsyncIterator[Sockets]:
    async with aiohttp.ClientSession() as session:
        made = Sockets(fake, session)
        yield made
        for sock in made.opened:
            await sock.close()


async def _post_many(fake: FakeSlack, n: int) -> list[str]:
    general = fake.add_channel("general")
    alice = fake.add_user("UALICE", name="alice")
    event_ids = []
    for i in range(n):
        post = await fake.user_posts(general, alice, f"message {i}")
        event_ids.append(post.deliveries[0].event_id or "")
    return event_ids


async def test_each_event_goes_to_one_random_connection_repeatably_with_a_seed() -> None:
    async def picks(seed: int) -> list[int]:
        async with FakeSlack(seed=seed) as fake, aiohttp.ClientSession() as session:
            made = Sockets(fake, session)
            socks = [await made.open() for _ in range(3)]
            event_ids = await _post_many(fake, 30)
            await fake.wait_for(lambda: sum(len(s.envelopes) for s in socks) == 30)
            for event_id in event_ids:  # each event reached exactly one connection, once
                holders = [s for s in socks if any(e["payload"]["event_id"] == event_id for e in s.envelopes)]
                assert len(holders) == 1
            index = {c.id: i for i, c in enumerate(fake.connections)}
            chosen = [index[d.attempts[0].connection_id or 0] for d in fake.deliveries]
            for sock in socks:
                await sock.close()
            return chosen

    first = await picks(11)
    assert sorted(set(first)) == [0, 1, 2]  # spread over every open connection, not sticky
    assert await picks(11) == first  # the same seed picks the same connections
    assert await picks(12) != first


async def test_an_unacked_envelope_is_resent_to_a_random_open_connection_with_retry_fields(
    fake: FakeSlack, sockets: Sockets
) -> None:
    fake.ack_timeout = 0.2
    fake.auto_retry = True
    fake.retry_delays = (0.0,)
    silent = [await sockets.open(ack=False) for _ in range(2)]
    event_ids = await _post_many(fake, 8)
    await fake.wait_for(
        lambda: all(len(d.attempts) == 4 and d.attempts[-1].settled for d in fake.deliveries), timeout=10
    )
    by_connection = {c.id: s for c, s in zip(fake.connections, silent, strict=True)}
    retried_on: set[int] = set()
    for delivery, event_id in zip(fake.deliveries, event_ids, strict=True):
        assert [a.retry_num for a in delivery.attempts] == [0, 1, 2, 3]  # Slack gives up after 3 retries
        for attempt in delivery.attempts:
            assert attempt.outcome == "timed_out" and attempt.connection_id is not None
            frames = [
                e
                for e in by_connection[attempt.connection_id].envelopes
                if e["envelope_id"] == attempt.envelope_id
            ]
            assert len(frames) == 1  # this attempt went to that one connection only
            frame = frames[0]
            assert frame["payload"]["event_id"] == event_id
            assert (frame["retry_attempt"], frame["retry_reason"]) == (
                attempt.retry_num,
                "timeout" if attempt.retry_num else "",
            )
            if attempt.retry_num:
                retried_on.add(attempt.connection_id)
    assert retried_on == set(by_connection)  # retries are not pinned to the connection that failed


async def test_a_retry_reaches_the_connection_still_open_and_is_acked_there(
    fake: FakeSlack, sockets: Sockets
) -> None:
    fake.ack_timeout = 0.3
    fake.auto_retry = True
    fake.retry_delays = (0.5,)
    deaf = await sockets.open(ack=False)
    (event_id,) = await _post_many(fake, 1)
    await fake.wait_for(lambda: deaf.envelopes)
    await deaf.close()  # the worker holding the envelope died without acking it
    healthy = await sockets.open(ack=True)
    delivery = fake.deliveries[0]
    acked = await delivery.wait_acked(5)
    assert acked.retry_num == 1 and acked.retry_reason == "timeout"
    assert acked.connection_id == fake.open_connections[0].id
    assert [e["payload"]["event_id"] for e in healthy.envelopes] == [event_id]


async def test_the_eleventh_connection_is_refused_with_too_many_websockets(
    fake: FakeSlack, sockets: Sockets
) -> None:
    assert fake.max_connections == 10
    ten = [await sockets.open() for _ in range(10)]
    assert all(s.frames[0]["type"] == "hello" for s in ten)
    assert len(fake.open_connections) == 10

    eleventh = await sockets.open()
    await asyncio.wait_for(eleventh.reader, 5)  # Slack closes it right after the one frame
    (frame,) = eleventh.frames  # no hello: a disconnect frame is the whole answer
    assert (frame["type"], frame["reason"]) == ("disconnect", "too_many_websockets")
    assert len(fake.open_connections) == 10
    (refused,) = fake.refused_connections
    assert not refused.open and refused.close_reason == "too_many_websockets"

    await _post_many(fake, 20)  # events only ever go to open connections
    await fake.wait_for(lambda: all(d.acked for d in fake.deliveries))
    assert refused.envelopes_sent == 0

    await ten[0].close()  # a slot frees: the next connection is accepted
    await fake.wait_for(lambda: len(fake.open_connections) == 9)
    again = await sockets.open()
    assert again.frames[0]["type"] == "hello"
    assert len(fake.open_connections) == 10 and len(fake.refused_connections) == 1
