"""Several adapters in one `python -m bots run` process over one storage: Slack (Socket Mode), Discord and devchat,
against the loopback fakes of Slack and Discord (their `env` points the bot at them) and devchat's websocket.

The config is the shipped config/ops.toml (faux:demo, answers every message) with `[adapters.slack]` and
`[adapters.discord]` tables added; the three `--adapter` flags pick what runs. Each platform gets the demo's
answer to its own user, then one SIGTERM stops all of them and the process exits 0.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from bots_cli_support import (
    LAST_LINE,
    SLACK_AND_DISCORD,
    BotProcess,
    bot_env,
    cli,
    devchat_converse,
    shipped_config_in,
)

from adapters.discord.testing import FakeDiscord
from adapters.slack.testing import FakeSlack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


async def test_slack_discord_and_devchat_in_one_process_each_get_their_answer(tmp_path: Path) -> None:
    async with FakeSlack(ack_timeout=10.0) as slack, FakeDiscord(heartbeat_interval=0.5) as discord:
        slack_general = slack.add_channel("general")
        alice = slack.add_user("UALICE", name="alice", display_name="Alice")
        guild = discord.add_guild("Ops")
        discord_general = discord.add_text_channel(guild, "general")
        bob = discord.add_user("bob", global_name="Bob")
        discord.add_member(guild, bob)

        config = shipped_config_in(tmp_path, append=SLACK_AND_DISCORD)
        env = bot_env(tmp_path, **slack.env, **discord.env())
        flags = ("--adapter", "slack", "--adapter", "discord", "--adapter", "devchat")
        bot = await BotProcess.start(config, *flags, env=env)
        try:
            ready = await bot.wait_for(lambda line: line.startswith("durable-bots: ready"), 60)
            assert ready is not None, f"{bot.output()}\n{await bot.stderr()}"
            assert ready.startswith("durable-bots: ready (slack, discord, devchat)"), ready
            # Each platform says what its start-up catch-up covered: every channel the bot is in.
            assert "slack: caught up 0 message(s) in 1 channel(s)" in bot.lines, bot.lines
            assert "discord: caught up 0 message(s) in 1 channel(s)" in bot.lines, bot.lines
            (url,) = [line.split()[1] for line in bot.lines if line.startswith("devchat: http://")]

            await slack.user_posts(slack_general, alice, "hello from slack")
            await discord.user_sends(discord_general, bob, "hello from discord")
            on_slack, on_discord, on_devchat = await asyncio.gather(
                slack.wait_for_message(slack_general, contains=LAST_LINE, timeout=30),
                discord.wait_for_message(
                    discord_general, predicate=lambda m: m.content.endswith(LAST_LINE), timeout=30
                ),
                asyncio.wait_for(devchat_converse(url, "hello from devchat", name="carol"), 30),
            )
            assert await bot.terminate() == 0, await bot.stderr()
        finally:
            await bot.kill()
    # Each platform's answer went to its own asker, in its own place.
    assert on_slack.text.startswith("Hi Alice! I am the ops bot"), on_slack.text
    assert on_discord.content.startswith("Hi Bob! I am the ops bot"), on_discord.content
    assert on_devchat["text"].startswith("Hi carol! I am the ops bot") and on_devchat["text"].endswith(
        LAST_LINE
    )
    assert len(slack.bot_messages(slack_general)) == 1 and len(discord.bot_messages(discord_general)) == 1
    assert "durable-bots: stopping (SIGTERM)" in bot.output()
    assert "durable-bots: stopped cleanly" in bot.output()
    # What the transport watchdogs saw, said at stop (devchat holds no outgoing connection).
    for name in ("slack", "discord"):
        assert f"{name}: 1 connection(s) opened, 0 reconnect(s), 0 stale" in bot.lines, bot.output()

    # One storage holds the three platforms' conversations.
    report = json.loads((await cli(config, "inspect", "--json", env=env)).stdout)
    platforms = sorted(c["place"]["platform"] for c in report["conversations"] if c["place"])
    assert platforms == ["devchat", "discord", "slack"], report["conversations"]
