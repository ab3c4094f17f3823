"""Fixtures shared by the Slack end-to-end tests: the loopback fake Slack (Socket Mode unless a module overrides
`fake`), its people, #general, and the bot processes started against it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from slack_e2e import Bots, People, add_people

from adapters.slack.testing import Channel, FakeSlack


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(ack_timeout=10.0) as running:
        yield running


@pytest.fixture
def people(fake: FakeSlack) -> People:
    return add_people(fake)


@pytest.fixture
def general(fake: FakeSlack) -> Channel:
    return fake.add_channel("general")


@pytest.fixture
async def bots(fake: FakeSlack, tmp_path: Path) -> AsyncIterator[Bots]:
    running = Bots(fake, tmp_path)
    yield running
    await running.close()
