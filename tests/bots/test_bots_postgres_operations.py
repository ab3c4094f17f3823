"""Operator commands against PostgreSQL while the bot runs: real `python -m bots` processes on the fake Slack
(and the fake chat for a parked task) over one PostgreSQL database. The reads open the store read-only (no
lease); retry, cancel and decisions are requests the running leader carries out within a second."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from pathlib import Path

import asyncpg
import pytest
from bots_cli_support import (
    LAST_LINE,
    BotProcess,
    bot_env,
    cli,
    park_the_fragile_tool,
    request_latency_ms,
    retry_the_parked_task,
    toml_value,
    write_config,
)
from slack_ops_support import slack_bot

from bots.cli import main
from harness_core.storage import PostgresStorage
from harness_core.storage._postgres_schema import migrate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
PASSWORD = "s3cret-pw"


def with_password(pg_url: str) -> str:
    # The test cluster trusts loopback connections, so any password gets in; none may ever be printed.
    assert "postgres@" in pg_url
    return pg_url.replace("postgres@", f"postgres:{PASSWORD}@", 1)


def pg_request_latency_ms(pg_url: str, request_id: int) -> Awaitable[int]:
    return request_latency_ms(PostgresStorage.open_read_only(pg_url), request_id)


async def test_reads_and_requests_reach_the_running_bot_on_postgres(tmp_path: Path, pg_url: str) -> None:
    # The store comes from DATABASE_URL, password included (a config file may not hold one).
    storage = {
        'path = "var/ops.sqlite"': "",
        "[deploy]\n": f"[deploy]\nrecord_path = {toml_value(str(tmp_path / 'deploys.jsonl'))}\n",
    }
    # A request finished eight days ago, from an earlier run: the running worker (64 partitions by default)
    # prunes it (kept a week).
    conn = await asyncpg.connect(pg_url)
    try:
        await migrate(conn, "test")
        stale = await conn.fetchval(
            "INSERT INTO operator_requests (id, partition, kind, args, status, outcome, created_at, finished_at) "
            "OVERRIDING SYSTEM VALUE VALUES (1000, 0, 'retry', '{}', 'done', '{}', 0, "
            "(extract(epoch FROM now()) * 1000)::bigint - 691200000) RETURNING id"  # the next ids stay 1, 2
        )
    finally:
        await conn.close()
    async with slack_bot(tmp_path, replace=storage, DATABASE_URL=with_password(pg_url)) as s:
        printed: list[str] = []

        async def run(*args: str) -> str:
            result = await cli(s.config, *args, env=s.env)
            printed.append(result.stdout + result.stderr)
            assert result.returncode == 0, result.stdout + result.stderr
            return result.stdout

        checked = await run("check-config")
        assert f"storage: PostgreSQL {pg_url} (from DATABASE_URL) (lease ttl" in checked, checked

        # Reads while the bot holds the lease: inspect and export show what was said on Slack.
        await s.slack.user_posts(s.channel, s.alice, "hello")
        answer = await s.slack.wait_for_message(s.channel, contains=LAST_LINE, timeout=30)
        text = await run("inspect")
        assert f"storage: {pg_url} (a snapshot read beside the running bot" in text, text
        doctor = await cli(s.config, "doctor", env=s.env)
        printed.append(doctor.stdout + doctor.stderr)
        assert f"ok   storage: {pg_url} opens read-only (has conversations)" in doctor.stdout, doctor.stdout
        report = json.loads(await run("inspect", "--json"))
        assert report["snapshot_beside_running_bot"] is True and report["storage"] == pg_url
        (conversation,) = [c for c in report["conversations"] if c["place"]]
        entries = [json.loads(line) for line in (await run("export", str(conversation["id"]))).splitlines()]
        assert entries[0]["model"][0]["content"] == "Alice: hello"
        said = [e for e in entries if e["kind"] == "core.assistant"][-1]["model"][0]["content"]
        assert [part["text"] for part in said] == [answer.text]

        # An operator denial: carried out by the running leader, shown on Slack, nothing deployed.
        await s.slack.user_posts(s.channel, s.alice, "deploy checkout 1.4.3")
        card, gate = await s.approval_card()
        pending = json.loads(await run("approvals", "--json", "--pending"))["approvals"]
        assert [g["id"] for g in pending] == [gate]
        denied = await run("approvals", "decide", str(gate), "deny", "--as", "oncall")
        assert f"gate {gate} denied by oncall (operator override) (by the running bot)" in denied
        assert await pg_request_latency_ms(pg_url, 1) < 1500  # picked up within about a second
        await s.slack.wait_for(
            lambda: (
                not any(b.get("type") == "actions" for b in s.slack.message(s.channel, card.ts).blocks or [])
            ),
            20,
            description="the card loses its buttons",
        )
        assert "oncall (operator override)" in str(s.slack.message(s.channel, card.ts).blocks)
        listed = json.loads(await run("approvals", "--json"))["approvals"]
        (decided,) = [g for g in listed if g["id"] == gate]
        assert decided["status"] == "denied" and decided["operator_override"] is True

        # A second deploy waits for its approver; the operator cancels its task through the leader instead.
        await s.slack.user_posts(s.channel, s.alice, "deploy payments 2.8.0")

        async def second_card() -> int | None:
            found = (await s.approval_card())[1]
            return found if found != gate else None

        second = await s.until(second_card)
        # The call behind the card ended its turn; the task that waits for the gate is the one to cancel.
        tasks = json.loads(await run("tasks", "--json"))["tasks"]
        (waiting,) = [t for t in tasks if t["gate"] == second]
        cancelled = await run("cancel", str(waiting["id"]))
        assert "is being cancelled (by the running bot)" in cancelled, cancelled
        assert await pg_request_latency_ms(pg_url, 2) < 1500
        tasks = json.loads(await run("tasks", "--json"))["tasks"]
        assert waiting["id"] not in [t["id"] for t in tasks]
        assert not (tmp_path / "deploys.jsonl").exists()  # nothing was deployed
        reader = await PostgresStorage.open_read_only(pg_url)
        try:
            assert await reader.operator_request(stale) is None  # pruned by the running worker at its start
            assert await reader.operator_request(2) is not None  # finished today: kept
        finally:
            await reader.close()
        assert await s.bot.terminate() == 0, await s.bot.stderr()
        printed.append(s.bot.output() + await s.bot.stderr())
    assert not any(PASSWORD in text for text in printed)


def call(tool: str, arguments: dict[str, object], message_id: str) -> dict[str, str]:
    return {"id": message_id, "text": f"/call {tool} {json.dumps(arguments)}"}


async def test_retry_of_a_parked_task_reaches_the_running_bot_on_postgres(
    tmp_path: Path, pg_url: str
) -> None:
    env = bot_env(tmp_path)
    config = write_config(tmp_path, messages=[call("fragile", {}, "1")], restart_limit=1)
    sqlite_line = f"path = {toml_value(str(tmp_path / 'bot.sqlite'))}"
    # A short lease: each restart after the tool's SIGKILL waits out the dead process's lease (default 10 s).
    pg_line = f"url = {toml_value(pg_url)}\nlease_ttl = 2.0"
    config.write_text(config.read_text().replace(sqlite_line, pg_line))
    await park_the_fragile_tool(config, env, timeout=60)
    bot = await BotProcess.start(config, env=env)
    try:
        await retry_the_parked_task(bot, config, env, timeout=60)
        assert await pg_request_latency_ms(pg_url, 1) < 1500
        await bot.wait_for_fake(
            lambda r: r["op"] == "edit" and r["final"] and "worked this time" in r["text"]
        )
        assert not (tmp_path / "bot.sqlite").exists()  # it all happened in PostgreSQL
        assert await bot.terminate() == 0
    finally:
        await bot.kill()


def test_backup_of_a_postgresql_store_points_to_pg_dump(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "bot.toml"
    config.write_text('[approvals]\napprovers = ["lead"]\n')
    monkeypatch.setenv("DATABASE_URL", f"postgresql://bot:{PASSWORD}@db.internal/ops")
    assert main(["backup", "--config", str(config), str(tmp_path / "copy.sqlite")]) == 1
    err = capsys.readouterr().err
    assert "the storage is PostgreSQL (postgresql://***@db.internal/ops): back it up with pg_dump" in err, err
    assert PASSWORD not in err and not (tmp_path / "copy.sqlite").exists()
