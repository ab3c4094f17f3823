"""Discord shards spread over workers: two real `python -m bots run` workers over one partitioned PostgreSQL
store against the fake Discord (two shards, recommended by GET /gateway/bot). Each shard is run by exactly one
worker, one each; a message in either shard's guild is answered once, by the owner of its channel's partition,
whichever worker's shard carried it; when a worker stops, the other takes its shard over."""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from bots_cli_support import LAST_LINE, bot_env, shipped_config_in, toml_value
from workers_support import Worker

from adapters.discord.testing import FakeDiscord, FakeGuild

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TTL = 3.0
DISCORD = """
[adapters.discord]
edit_interval = 0.05
guild_ready_timeout = 0.05
"""


def shards_of(worker: Worker) -> list[int] | None:
    """The shards the worker said it runs last (None: it said nothing yet)."""
    for line in reversed(worker.lines):
        found = re.match(r"discord: this worker runs shard\(s\) (.*) of 2$", line)
        if found:
            return [] if found.group(1) == "none" else [int(s) for s in found.group(1).split(", ")]
    return None


def guild_on(fake: FakeDiscord, shard: int, name: str) -> FakeGuild:
    guild = fake.add_guild(name, id=((1_300_000_000_000 + shard) << 22) | 9)
    assert FakeDiscord.shard_of(guild, 2) == shard
    return guild


@pytest.fixture
async def discord() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(heartbeat_interval=0.5, recommended_shards=2) as fake:
        yield fake


async def test_two_shards_run_on_two_workers_and_move_when_one_stops(
    discord: FakeDiscord, tmp_path: Path, pg_url: str
) -> None:
    bob = discord.add_user("bob", global_name="Bob")
    channels = {}
    for shard in (0, 1):
        guild = guild_on(discord, shard, f"Shard {shard} guild")
        discord.add_member(guild, bob)
        channels[shard] = discord.add_text_channel(guild, "general")
    config = shipped_config_in(
        tmp_path,
        replace={'path = "var/ops.sqlite"': f"url = {toml_value(pg_url)}\nlease_ttl = {TTL}\npartitions = 8"},
        append=DISCORD,
    )
    env = bot_env(tmp_path, **discord.env(), DURABLE_BOTS_DEMO_DELAY_MS="0")
    workers: list[Worker] = []

    async def start(name: str) -> Worker:
        worker = await Worker.start(name, config, env, tmp_path, adapter="discord")
        workers.append(worker)
        await worker.ready()
        return worker

    try:
        first = await start("d1")
        await first.wait_for(lambda line: line == "discord: this worker runs shard(s) 0, 1 of 2", 60)
        second = await start("d2")
        # The join moves one shard: one each, and exactly one live gateway session per shard.
        await discord.wait_for(
            lambda: (
                shards_of(first) is not None
                and shards_of(second) is not None
                and sorted((shards_of(first) or []) + (shards_of(second) or [])) == [0, 1]
                and len(shards_of(first) or []) == 1
            ),
            timeout=60,
            what="one shard on each worker",
        )
        await discord.wait_for(
            lambda: all(
                len([s for s in discord.sessions if s.shard == (shard, 2) and s.connected]) == 1
                for shard in (0, 1)
            ),
            timeout=30,
            what="one session per shard",
        )
        for shard in (0, 1):
            await discord.user_sends(channels[shard], bob, f"hello on shard {shard}")
        for shard in (0, 1):
            await discord.wait_for_message(
                channels[shard], predicate=lambda m: m.content.endswith(LAST_LINE), timeout=60
            )

        # The worker running shard 0 stops: the other takes shard 0 over; the guild is answered again.
        leaving = first if shards_of(first) == [0] else second
        staying = second if leaving is first else first
        leaving.process.send_signal(signal.SIGTERM)
        assert await leaving.finish(60) == 0, leaving.output() + leaving.stderr()
        await staying.wait_for(lambda line: line == "discord: this worker runs shard(s) 0, 1 of 2", 60)
        await discord.user_sends(channels[0], bob, "still there?")
        await discord.wait_for_message(
            channels[0], predicate=lambda m: m.content.endswith(LAST_LINE), count=2, timeout=60
        )
        staying.process.send_signal(signal.SIGTERM)
        assert await staying.finish(60) == 0, staying.output() + staying.stderr()
        # Both workers have stopped: anything (wrongly) sent twice has shown up by now.
        for shard in (0, 1):
            answers = [m for m in discord.bot_messages(channels[shard]) if m.content.endswith(LAST_LINE)]
            assert len(answers) == (2 if shard == 0 else 1), [m.content for m in answers]
    finally:
        for worker in workers:
            with contextlib.suppress(Exception):
                await worker.kill()
