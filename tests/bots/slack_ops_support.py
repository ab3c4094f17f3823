"""A `python -m bots run --adapter slack` process on the loopback fake Slack with the admin endpoint on, and
helpers to read `/healthz`, `/readyz` and `/metrics` (parsed with prometheus-client's own parser)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from bots_cli_support import BotProcess, bot_env, shipped_config_in
from prometheus_client.parser import text_string_to_metric_families

from adapters.slack.blocks import action_id
from adapters.slack.testing import FakeSlack

SLACK = """
[adapters.slack]
mode = "socket"
edit_interval = 0.05
ping_interval = 0.5

[admin]
listen = "127.0.0.1:0"
"""


@dataclass
class SlackBot:
    slack: FakeSlack
    bot: BotProcess
    config: Path
    env: dict[str, str]
    admin: str
    channel: Any
    alice: Any
    lead: Any

    async def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, session.get(self.admin + path, headers=headers) as r:
            return r.status, await r.text()

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, text = await self.get("metrics")
        assert status == 200, text
        found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
        return found

    async def until(self, check: Callable[[], Any], timeout: float = 20) -> Any:
        async def poll() -> Any:
            while True:
                value = await check()
                if value:
                    return value
                await asyncio.sleep(0.1)

        return await asyncio.wait_for(poll(), timeout)

    async def approval_card(self) -> tuple[Any, int]:
        """The pending approval card in the channel and its gate id."""

        def has_buttons(message: Any) -> bool:
            return any(b.get("type") == "actions" for b in message.blocks or [])

        card = await self.slack.wait_for_message(self.channel, predicate=has_buttons, timeout=30)
        actions = next(b for b in card.blocks or [] if b.get("type") == "actions")
        gate = int(actions["elements"][0]["action_id"].rsplit(":", 1)[1])
        return card, gate

    async def click(self, card: Any, gate: int, user: Any, *, approve: bool = True) -> None:
        verb = "approve" if approve else "deny"
        await self.slack.click(self.channel, card.ts, action_id(verb, gate), user=user, stale=True)


def sample(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


@asynccontextmanager
async def slack_bot(
    workdir: Path,
    *,
    append: str = "",
    approvers: str = '["slack:ULEAD"]',
    replace: Mapping[str, str] | None = None,
    **env_extra: str,
) -> AsyncIterator[SlackBot]:
    """`replace` edits more lines of the shipped config (e.g. a PostgreSQL `[storage] url`)."""
    async with FakeSlack(ack_timeout=10.0) as slack:
        channel = slack.add_channel("general")
        alice = slack.add_user("UALICE", name="alice", display_name="Alice")
        lead = slack.add_user("ULEAD", name="lead", display_name="Lead")
        config = shipped_config_in(
            workdir,
            replace={'approvers = ["devchat:lead"]': f"approvers = {approvers}", **(replace or {})},
            append=SLACK + append,
        )
        env = bot_env(workdir, **slack.env, **env_extra)
        bot = await BotProcess.start(config, "--adapter", "slack", env=env)
        try:
            ready = await bot.wait_for(lambda line: line.startswith("durable-bots: ready"), 60)
            assert ready is not None, f"{bot.output()}\n{await bot.stderr()}"
            (admin,) = [line.split()[1] for line in bot.lines if line.startswith("admin: http://")]
            yield SlackBot(slack, bot, config, env, admin, channel, alice, lead)
        finally:
            await bot.kill()


def body(text: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(text)
    return found
