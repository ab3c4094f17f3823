"""A Slack message, a Discord message and a devchat post, each carrying a lone surrogate (the JSON escape
`\\ud83d`, as each platform can send it), to one real `python -m bots run` process with the three adapters: the
bot stays up, each is answered once; after a SIGKILL and a restart, nothing is answered again (catch-up reads the
same messages back through the dedupe) and new messages are answered as usual."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from bots_cli_support import LAST_LINE, SLACK_AND_DISCORD, BotProcess, bot_env, shipped_config_in

from adapters.discord.testing import FakeDiscord
from adapters.slack.testing import FakeSlack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

FLAGS = ("--adapter", "slack", "--adapter", "discord", "--adapter", "devchat")


async def start(config: Path, env: dict[str, str]) -> tuple[BotProcess, str]:
    bot = await BotProcess.start(config, *FLAGS, env=env)
    ready = await bot.wait_for(lambda line: line.startswith("durable-bots: ready"), 60)
    assert ready is not None, f"{bot.output()}\n{await bot.stderr()}"
    (url,) = [line.split()[1] for line in bot.lines if line.startswith("devchat: http://")]
    return bot, url


async def devchat_post(url: str, text: str, client_id: str) -> dict[str, Any]:
    """Post the way the page does (json.dumps escapes the surrogate) and return the ack and the final answer."""
    async with aiohttp.ClientSession() as session, session.ws_connect(url + "ws") as ws:
        await ws.send_str(json.dumps({"type": "hello", "cursor": None, "epoch": None}))
        post = {"type": "post", "name": "carol", "channel": "general", "thread": None, "text": text}
        await ws.send_str(json.dumps({**post, "client_id": client_id}))
        ack: dict[str, Any] | None = None
        async for frame in ws:
            payload = json.loads(frame.data)
            if payload["type"] in ("ack", "nack", "error"):
                ack = payload
                assert ack["type"] == "ack", ack
            for event in payload.get("events", []) if payload["type"] == "events" else []:
                message = event.get("message") or {}
                if message.get("kind") == "bot" and message.get("final") and ack is not None:
                    return {"ack": ack, "answer": message}
    raise AssertionError("the websocket closed before an answer arrived")


async def devchat_answers(url: str) -> list[str]:
    async with aiohttp.ClientSession() as session, session.ws_connect(url + "ws") as ws:
        await ws.send_str(json.dumps({"type": "hello", "cursor": None, "epoch": None}))
        async for frame in ws:
            payload = json.loads(frame.data)
            if payload["type"] == "snapshot":
                return [m["text"] for m in payload["messages"] if m["kind"] == "bot"]
    raise AssertionError("no snapshot")


async def test_lone_surrogates_on_every_platform_are_answered_once_across_a_sigkill(tmp_path: Path) -> None:
    async with FakeSlack(ack_timeout=10.0) as slack, FakeDiscord(heartbeat_interval=0.5) as discord:
        slack_general = slack.add_channel("general")
        alice = slack.add_user("UALICE", name="alice", display_name="Al\udc00ice")
        guild = discord.add_guild("Ops")
        discord_general = discord.add_text_channel(guild, "general")
        bob = discord.add_user("bob", global_name="B\ud83dob")
        discord.add_member(guild, bob)
        config = shipped_config_in(tmp_path, append=SLACK_AND_DISCORD)
        env = bot_env(tmp_path, **slack.env, **discord.env())

        bot, url = await start(config, env)
        try:
            await slack.user_posts(slack_general, alice, "hello \ud83d from slack")
            await discord.user_sends(discord_general, bob, "hello \ud83d from discord")
            on_slack, on_discord, on_devchat = await asyncio.gather(
                slack.wait_for_message(slack_general, contains=LAST_LINE, timeout=40),
                discord.wait_for_message(
                    discord_general, predicate=lambda m: m.content.endswith(LAST_LINE), timeout=40
                ),
                asyncio.wait_for(devchat_post(url, "hello \ud83d from devchat", "client-surrogate-1"), 40),
            )
            assert on_devchat["ack"]["outcome"] == "answering"
        finally:
            await bot.kill()  # SIGKILL: no graceful stop

        again, url = await start(config, env)
        try:
            await slack.user_posts(slack_general, alice, "and after the restart")
            await discord.user_sends(discord_general, bob, "and after the restart")
            second = await asyncio.wait_for(
                devchat_post(url, "and after the restart", "client-surrogate-2"), 40
            )
            await slack.wait_for(lambda: len(slack.bot_messages(slack_general)) >= 2 or None, 40)
            await discord.wait_for(
                lambda: len(discord.bot_messages(discord_general)) >= 2 or None, timeout=40
            )
            await asyncio.sleep(1.0)  # time for a wrong second answer to a caught-up message to show
            devchat_texts = await devchat_answers(url)
            assert await again.terminate() == 0, await again.stderr()
        finally:
            await again.kill()

    assert second["ack"]["outcome"] == "answering"
    assert on_slack.text.startswith("Hi Al\ufffdice!"), on_slack.text
    assert on_discord.content.startswith("Hi B\ufffdob!"), on_discord.content
    assert len(slack.bot_messages(slack_general)) == 2
    assert len(discord.bot_messages(discord_general)) == 2
    assert len(devchat_texts) == 2, devchat_texts
    assert "Traceback" not in await again.stderr()
