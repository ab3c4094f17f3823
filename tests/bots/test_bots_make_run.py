"""`make run` from a fresh clone: the shipped config/ops.toml serves devchat and the bot answers a message.

The command is the Makefile's (`python -m bots run --config config/ops.toml --adapter devchat`) over a copy of
the shipped config whose storage, chat store and tracker live in a temporary directory and whose port is 0 (a
free one; the CLI prints the URL it got). The page's own websocket protocol carries one message in and the
answer out; then SIGTERM must stop everything cleanly.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from bots_cli_support import REPO, BotProcess, bot_env

pytestmark = pytest.mark.slow


def shipped_config_in(tmp_path: Path) -> Path:
    text = (REPO / "config" / "ops.toml").read_text()
    replacements = {
        'path = "var/ops.sqlite"': f'path = "{tmp_path / "ops.sqlite"}"',
        'store = "var/devchat.sqlite"': f'store = "{tmp_path / "devchat.sqlite"}"',
        'path = "var/tickets.json"': f'path = "{tmp_path / "tickets.json"}"',
        "port = 8765": "port = 0",
    }
    for old, new in replacements.items():
        assert old in text, f"config/ops.toml no longer has {old!r}; update this test"
        text = text.replace(old, new)
    path = tmp_path / "ops.toml"
    path.write_text(text)
    return path


async def converse(url: str) -> dict[str, Any]:
    """Post one message the way the page does and return the bot's final answer."""
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "healthz") as health:
            assert health.status == 200 and (await health.json())["ok"] is True
        async with session.get(url) as page:
            assert page.status == 200 and "text/html" in page.headers["Content-Type"]
        async with session.ws_connect(url + "ws") as ws:
            await ws.send_json({"type": "hello", "cursor": None, "epoch": None})
            post = {
                "type": "post",
                "name": "alice",
                "channel": "general",
                "thread": None,
                "text": "hello bot",
            }
            await ws.send_json({**post, "client_id": "smoke-test-0001"})
            acked = False
            async for frame in ws:
                assert frame.type == aiohttp.WSMsgType.TEXT, frame
                payload = json.loads(frame.data)
                if payload["type"] == "ack":
                    assert payload["outcome"] == "answering"
                    acked = True
                for event in payload.get("events", []) if payload["type"] == "events" else []:
                    message = event.get("message") or {}
                    if message.get("kind") == "bot" and message.get("final"):
                        assert acked, "the post is acknowledged before its answer arrives"
                        found: dict[str, Any] = message
                        return found
    raise AssertionError("the websocket closed before an answer arrived")


async def test_make_run_serves_devchat_and_answers_a_message(tmp_path: Path) -> None:
    config = shipped_config_in(tmp_path)
    bot = await BotProcess.start(config, "--adapter", "devchat", env=bot_env(tmp_path))
    try:
        line = await bot.wait_for(lambda text: text.startswith("devchat: http://"), timeout=60)
        assert line is not None, f"{bot.output()}\n{await bot.stderr()}"
        url = line.split()[1]
        answer = await asyncio.wait_for(converse(url), 60)
        assert answer["author"] == "ops-bot" and answer["channel"] == "general"
        assert answer["text"].startswith("Hi alice! I am the ops bot running the offline demo model")
        assert await bot.terminate() == 0, await bot.stderr()
    finally:
        await bot.kill()
    assert "durable-bots: stopped cleanly" in bot.output()
