"""Operating a running bot: reading its storage while it runs, operator requests it carries out, the admin
endpoint, reload, JSON logs, backup and doctor. Real `python -m bots` processes over one SQLite file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from bots_cli_support import BotProcess, bot_env, cli, write_config

pytestmark = pytest.mark.slow


async def test_read_commands_show_a_snapshot_while_the_bot_runs(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    config = write_config(tmp_path, messages=[{"id": "1", "text": "hello"}])
    bot = await BotProcess.start(config, env=env)
    try:
        final = await bot.wait_for_fake(lambda r: r["op"] == "edit" and r["final"])
        lock = (tmp_path / "bot.sqlite.lock").read_text()
        inspected, tasks, approvals, as_json = await asyncio.gather(
            cli(config, "inspect", env=env),
            cli(config, "tasks", env=env),
            cli(config, "approvals", env=env),
            cli(config, "inspect", "--json", env=env),
        )
        for result in (inspected, tasks, approvals, as_json):
            assert result.returncode == 0, result.stderr
        assert "a snapshot read beside the running bot" in inspected.stdout
        report = json.loads(as_json.stdout)
        assert report["snapshot_beside_running_bot"] is True
        (conversation,) = [c for c in report["conversations"] if c["place"]]
        exported = await cli(config, "export", str(conversation["id"]), env=env)
        assert exported.returncode == 0, exported.stderr
        entries = [json.loads(line) for line in exported.stdout.splitlines()]
        assert entries[0]["model"][0]["content"] == "alice: hello"
        said = [e for e in entries if e["kind"] == "core.assistant"][-1]["model"][0]["content"]
        assert [part["text"] for part in said] == [final["text"]]
        # Nothing was written and the owner lock is the bot's, untouched; the bot keeps answering.
        assert (tmp_path / "bot.sqlite.lock").read_text() == lock
        assert await bot.terminate() == 0
    finally:
        await bot.kill()
