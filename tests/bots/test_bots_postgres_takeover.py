"""Leader and standby: two real `python -m bots run` processes over one PostgreSQL store, against the fake Slack.

The standby connects to no platform until the leader's lease ends: SIGKILL (the lease expires after its ttl),
SIGTERM (released at once), SIGSTOP past the ttl (expired while the leader sleeps; when it wakes it must write
nothing more, say why and exit). The standby then runs the normal recovery: the unfinished answer continues
from its checkpoint and delivery reconciles, so the channel shows one answer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from bots_cli_support import LAST_LINE, BotProcess, bot_env, free_port, shipped_config_in, toml_value

from adapters.slack.testing import Channel, FakeSlack, Message
from harness_core.storage import PostgresStorage
from harness_core.storage._postgres_schema import migrate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TTL = 3.0
SLACK = """
[adapters.slack]
mode = "socket"
edit_interval = 0.05
"""


def pg_config(workdir: Path, url: str) -> Path:
    return shipped_config_in(
        workdir,
        replace={
            'path = "var/ops.sqlite"': f"url = {toml_value(url)}\nlease_ttl = {TTL}\npartitions = 1",
            'approvers = ["devchat:lead"]': 'approvers = ["slack:UBOSS"]\ngroups = ["slack:SONCALL"]',
            "[deploy]\n": f"[deploy]\nrecord_path = {toml_value(str(workdir / 'deploys.jsonl'))}\n",
        },
        append=SLACK,
    )


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(ack_timeout=10.0) as running:
        yield running


class Pair:
    def __init__(self, config: Path, env: dict[str, str]) -> None:
        self.config = config
        self.env = env
        self.processes: list[BotProcess] = []

    async def start(self, *args: str) -> BotProcess:
        bot = await BotProcess.start(self.config, "--adapter", "slack", *args, env=self.env)
        self.processes.append(bot)
        return bot

    async def leader_and_standby(self) -> tuple[BotProcess, BotProcess]:
        leader = await self.start()
        ready = await leader.wait_for(lambda line: line.startswith("durable-bots: ready"), 60)
        assert ready is not None, f"{leader.output()}\n{await leader.stderr()}"
        standby = await self.start()
        line = await standby.wait_for(lambda line: line.startswith("durable-bots: standby"), 30)
        assert line == (
            f"durable-bots: standby: the lease is held by pid {leader.pid} on {socket.gethostname()}; "
            "taking over when it ends"
        ), standby.output()
        return leader, standby

    async def close(self) -> None:
        for bot in self.processes:
            if bot.process.returncode is None:
                bot.process.send_signal(signal.SIGCONT)
            await bot.kill()


@pytest.fixture
async def pair(fake: FakeSlack, tmp_path: Path, pg_url: str) -> AsyncIterator[Pair]:
    env = bot_env(tmp_path, **fake.env, DURABLE_BOTS_DEMO_DELAY_MS="15")
    running = Pair(pg_config(tmp_path, pg_url), env)
    yield running
    await running.close()


async def wait_ready(bot: BotProcess, timeout: float) -> float:
    started = time.monotonic()
    ready = await bot.wait_for(lambda line: line.startswith("durable-bots: ready"), timeout)
    assert ready is not None, f"{bot.output()}\n{await bot.stderr()}"
    return time.monotonic() - started


async def test_standby_finishes_an_answer_the_leader_was_streaming_when_killed(
    fake: FakeSlack, pair: Pair
) -> None:
    general = fake.add_channel("general")
    alice = fake.add_user("UALICE", name="alice", display_name="Alice")
    leader, standby = await pair.leader_and_standby()
    # The standby has not connected to Slack: only the leader's Socket Mode connection exists.
    assert len(fake.open_connections) == 1

    # SIGKILL the leader right after its first streaming edit reached Slack.
    mid_stream = fake.kill_on("chat.update", leader.pid, after_effect=True)
    await fake.user_posts(general, alice, "hello bot")
    assert await asyncio.wait_for(leader.process.wait(), 30) == -signal.SIGKILL
    assert len(mid_stream.fired) == 1
    killed_at = time.monotonic()

    took = await wait_ready(standby, 30)
    assert time.monotonic() - killed_at <= TTL + 5, "the standby took over within the lease ttl (+ start-up)"
    assert took >= 0
    answer = await fake.wait_for_message(general, contains=LAST_LINE, timeout=30)
    assert answer.text.startswith("Hi Alice! I am the ops bot"), answer.text
    assert len(fake.bot_messages(general)) == 1, [m.text for m in fake.bot_messages(general)]
    assert await standby.terminate() == 0, await standby.stderr()


async def test_rolling_deploy_sigterm_mid_answer_hands_over_within_two_seconds(
    fake: FakeSlack, pair: Pair
) -> None:
    general = fake.add_channel("general")
    alice = fake.add_user("UALICE", name="alice", display_name="Alice")
    leader, standby = await pair.leader_and_standby()
    await fake.user_posts(general, alice, "hello bot")
    await fake.wait_for_message(general, contains=LAST_LINE, timeout=30)

    # The deploy: SIGTERM the old process while it streams an answer (its first edit has reached Slack).
    streaming = asyncio.Event()
    fake.on_request("chat.update", lambda call: streaming.set(), when="after_effect", times=1)
    await fake.user_posts(general, alice, "hello again")
    await asyncio.wait_for(streaming.wait(), 30)
    leader.process.send_signal(signal.SIGTERM)
    stopped_at = time.monotonic()
    starting = await standby.wait_for(lambda line: "starting" in line, 30)
    assert starting is not None, standby.output()
    assert await leader.finish() == 0, await leader.stderr()  # no exit 2, nothing half done
    assert "durable-bots: stopped cleanly" in leader.output()
    await wait_ready(standby, 30)
    assert time.monotonic() - stopped_at < 30

    # Nothing lost, nothing twice: the second answer is whole, in one message, and there are two answers.
    await fake.wait_for(
        lambda: len([m for m in fake.bot_messages(general) if m.text.endswith(LAST_LINE)]) == 2,
        30,
        description="both answers complete",
    )
    assert len(fake.bot_messages(general)) == 2, [m.text for m in fake.bot_messages(general)]
    await fake.user_posts(general, alice, "and again")
    await fake.wait_for(
        lambda: len(fake.bot_messages(general)) == 3, 30, description="the new leader answers"
    )
    assert await standby.terminate() == 0, await standby.stderr()


async def test_a_leader_paused_past_its_ttl_writes_nothing_when_it_wakes(
    fake: FakeSlack, pair: Pair, pg_url: str
) -> None:
    general = fake.add_channel("general")
    alice = fake.add_user("UALICE", name="alice", display_name="Alice")
    leader, standby = await pair.leader_and_standby()

    os.kill(leader.pid, signal.SIGSTOP)
    await wait_ready(standby, TTL + 30)
    await fake.user_posts(general, alice, "hello bot")
    await fake.wait_for_message(general, contains=LAST_LINE, timeout=30)
    conn = await asyncpg.connect(pg_url)
    try:
        before = await conn.fetchval("SELECT count(*) FROM entries")
        calls_before = len(fake.calls)

        os.kill(leader.pid, signal.SIGCONT)
        code = await leader.finish(30)
        assert code == 1, leader.output()
        said = [line for line in leader.lines if "lease" in line]
        assert said and ("taken over" in said[-1] or "not renewed in time" in said[-1]), leader.output()
        assert "exiting without writing anything more" in said[-1]
        # The new leader carries on; the old one added nothing to the store or to Slack.
        await asyncio.sleep(0.5)
        assert await conn.fetchval("SELECT count(*) FROM entries") == before
        # Slack saw no write at all after the wake-up (the new leader was idle by then).
        assert [c.method for c in fake.calls[calls_before:] if c.method.startswith("chat.")] == []
    finally:
        await conn.close()
    assert len(fake.bot_messages(general)) == 1
    assert await standby.terminate() == 0, await standby.stderr()


async def test_no_standby_keeps_exit_code_two(pair: Pair) -> None:
    leader = await pair.start()
    await wait_ready(leader, 60)
    second = await pair.start("--no-standby")
    assert await second.finish(30) == 2
    stderr = await second.stderr()
    assert f"lease held by pid {leader.pid}" in stderr, stderr
    assert await leader.terminate() == 0


def approval_card(fake: FakeSlack, channel: Channel) -> Message | None:
    cards = [
        m
        for m in fake.bot_messages(channel)
        if str((m.event_payload or {}).get("key", "")).startswith("approval:")
    ]
    return cards[0] if cards else None


def button(message: Message, verb: str) -> str:
    for block in message.blocks or []:
        for element in block.get("elements") or []:
            action_id = str(element.get("action_id", ""))
            if action_id.split(":")[1:2] == [verb]:
                return action_id
    raise AssertionError(f"no {verb} button in {message.blocks}")


class Webhook:
    """The deploy webhook: records every request and SIGKILLs `victim` when one arrives (before answering)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.victim: int | None = None
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(await request.json())
        if self.victim is not None:
            os.kill(self.victim, signal.SIGKILL)  # the answer below goes to a dead process
            self.victim = None
        return web.json_response({"ok": True})

    async def __aenter__(self) -> Webhook:
        app = web.Application()
        app.router.add_post("/deploy", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/deploy"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


async def test_takeovers_after_an_approval_click_and_inside_the_unsafe_deploy(
    fake: FakeSlack, tmp_path: Path, pg_url: str
) -> None:
    ops = fake.add_channel("ops")
    alice = fake.add_user("UALICE", name="alice", display_name="Alice")
    carol = fake.add_user("UCAROL", name="carol", display_name="Carol")
    fake.add_usergroup("oncall", [carol], group_id="SONCALL")
    async with Webhook() as hook:
        env = bot_env(tmp_path, **fake.env, DURABLE_BOTS_DEMO_DELAY_MS="0", DEPLOY_WEBHOOK_URL=hook.url)
        pair = Pair(pg_config(tmp_path, pg_url), env)
        try:
            first, second = await pair.leader_and_standby()
            await fake.user_posts(ops, alice, "deploy checkout 1.4.3")
            card = await fake.wait_for(lambda: approval_card(fake, ops), 30, description="the approval card")

            # (c) SIGKILL the leader after Carol's click arrived, while it checks her on-call group.
            lookup = fake.kill_on("usergroups.users.list", first.pid, after_effect=False)
            # (Not waiting out the 10 s ack window: the killed leader cannot ack it anyway.)
            click = await fake.click(ops, card.ts, button(card, "approve"), user=carol, wait=False)
            assert await asyncio.wait_for(first.process.wait(), 30) == -signal.SIGKILL
            assert not click.attempt.acked  # the click was never acknowledged: Carol saw it fail
            assert len(lookup.fired) == 1
            assert hook.requests == []
            await wait_ready(second, TTL + 30)
            third = await pair.start()
            await third.wait_for(lambda line: line.startswith("durable-bots: standby"), 30)

            # (d) Carol clicks again; the new leader runs the deploy and is SIGKILLed inside the webhook call.
            hook.victim = second.pid
            await fake.click(ops, card.ts, button(card, "approve"), user=carol, wait=False)
            assert await asyncio.wait_for(second.process.wait(), 30) == -signal.SIGKILL
            assert len(hook.requests) == 1
            await wait_ready(third, TTL + 30)
            # The interrupted unsafe call is reported, not repeated.
            final = await fake.wait_for_message(ops, contains="restarted while it ran", timeout=30)
            await asyncio.sleep(1.0)  # time for anything else the new leader would (wrongly) do
            assert await third.terminate() == 0, await third.stderr()
        finally:
            await pair.close()
    # One deploy request ever (the interrupted unsafe call is not repeated), one approval card, asked once.
    assert len(hook.requests) == 1
    cards = [
        m
        for m in fake.bot_messages(ops)
        if str((m.event_payload or {}).get("key", "")).startswith("approval:")
    ]
    assert len(cards) == 1
    assert not any(b.get("type") == "actions" for b in fake.message(ops, card.ts).blocks or [])
    # The outcome is reported once, as a message of its own after the card (the request's own answer, "waits
    # for approval", came before it).
    reports = [m.ts for m in fake.bot_messages(ops) if "restarted while it ran" in (m.text or "")]
    assert reports == [final.ts] and float(final.ts) > float(card.ts)


async def test_database_url_is_used_when_the_config_names_no_storage_and_its_password_is_never_shown(
    fake: FakeSlack, tmp_path: Path, pg_url: str
) -> None:
    # The test cluster trusts loopback connections, so any password gets in; the bot must never print it.
    with_password = pg_url.replace("postgres@", "postgres:s3cret-pw@", 1)
    config = shipped_config_in(
        tmp_path,
        replace={
            'path = "var/ops.sqlite"': "",
            "[deploy]\n": f"[deploy]\nrecord_path = {toml_value(str(tmp_path / 'd.jsonl'))}\n",
        },
        append=SLACK,
    )
    env = bot_env(tmp_path, **fake.env, DATABASE_URL=with_password)
    bot = await BotProcess.start(config, "--adapter", "slack", env=env)
    try:
        await wait_ready(bot, 60)
        assert await bot.terminate() == 0
    finally:
        await bot.kill()
    (start,) = [line for line in bot.lines if " starting (" in line]
    # Printed lines mask the whole user part of a URL (adapters.redact): no password, no user name.
    shown = pg_url.replace("postgres@", "***@", 1)
    assert f"storage {shown})" in start, start
    assert "s3cret-pw" not in bot.output() + await bot.stderr()


async def test_an_unreachable_database_is_one_line_without_the_password(
    fake: FakeSlack, tmp_path: Path
) -> None:
    port = free_port()
    config = pg_config(tmp_path, f"postgresql://bot@127.0.0.1:{port}/ops")
    env = bot_env(tmp_path, **fake.env, PGPASSWORD="s3cret-pw")
    bot = await BotProcess.start(config, "--adapter", "slack", env=env)
    try:
        assert await bot.finish(60) == 3  # EXIT_STORAGE: the storage cannot be used
        stderr = await bot.stderr()
    finally:
        await bot.kill()
    assert stderr.startswith(f"durable-bots: cannot open storage postgresql://***@127.0.0.1:{port}/ops"), (
        stderr
    )
    assert "Traceback" not in stderr and "s3cret-pw" not in stderr


async def test_a_standby_stops_at_once_on_sigterm_and_leaves_the_leader_alone(pair: Pair) -> None:
    leader, standby = await pair.leader_and_standby()
    assert await standby.terminate(15) == 0, await standby.stderr()
    assert "durable-bots: stopped while on standby" in standby.output()
    assert leader.process.returncode is None
    assert await leader.terminate() == 0, await leader.stderr()


async def test_the_leader_prunes_operator_requests_finished_more_than_a_week_ago(
    pair: Pair, pg_url: str
) -> None:
    # One bot over one partition (leader and standby), not the workers: it keeps the request table small too.
    conn = await asyncpg.connect(pg_url)
    try:
        await migrate(conn, "test")
        stale, recent = [
            await conn.fetchval(
                "INSERT INTO operator_requests (partition, kind, args, status, outcome, created_at, finished_at) "
                "VALUES (0, 'retry', '{}', 'done', '{}', 0, (extract(epoch FROM now()) * 1000)::bigint - $1) "
                "RETURNING id",
                age_ms,
            )
            for age_ms in (8 * 86_400_000, 86_400_000)
        ]
    finally:
        await conn.close()
    leader = await pair.start()
    await wait_ready(leader, 60)
    reader = await PostgresStorage.open_read_only(pg_url)
    try:
        for _ in range(100):
            if await reader.operator_request(stale) is None:
                break
            await asyncio.sleep(0.05)
        assert await reader.operator_request(stale) is None
        assert await reader.operator_request(recent) is not None
    finally:
        await reader.close()
    assert await leader.terminate() == 0, await leader.stderr()


async def test_a_standby_survives_sighup_and_applies_the_reload_once_it_takes_over(pair: Pair) -> None:
    """SIGHUP's default action ends a process: `systemctl reload` or a deploy tool signalling every bot process
    must not kill the standby (the one that would take over)."""
    leader, standby = await pair.leader_and_standby()
    standby.process.send_signal(signal.SIGHUP)
    noted = await standby.wait_for(lambda line: "reload requested before the bot runs" in line, 10)
    assert noted is not None and standby.process.returncode is None, f"{standby.output()}"
    assert await leader.terminate() == 0, await leader.stderr()
    await wait_ready(standby, 30)
    reloaded = await standby.wait_for(lambda line: line.startswith("durable-bots: reloaded"), 10)
    assert reloaded is not None, standby.output()
    assert await standby.terminate() == 0, await standby.stderr()


def with_admin(config: Path, port: int) -> Path:
    path = config.with_name(f"admin-{port}.toml")
    path.write_text(config.read_text() + f'\n[admin]\nlisten = "127.0.0.1:{port}"\n')
    return path


async def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/{path}") as response,
    ):
        return response.status, await response.json(content_type=None)


async def test_a_standby_answers_healthz_and_is_ready_only_once_it_holds_the_lease(
    fake: FakeSlack, tmp_path: Path, pg_url: str
) -> None:
    """Kubernetes probes every replica: a standby with no /healthz would be restarted forever."""
    env = bot_env(tmp_path, **fake.env)
    config = pg_config(tmp_path, pg_url)
    leader_port, standby_port = free_port(), free_port()
    pair = Pair(with_admin(config, leader_port), env)
    try:
        leader = await pair.start()
        await wait_ready(leader, 60)
        pair.config = with_admin(config, standby_port)
        standby = await pair.start()
        assert await standby.wait_for(lambda line: line.startswith("durable-bots: standby"), 30), (
            standby.output()
        )
        assert (await probe(standby_port, "healthz"))[0] == 200
        status, body = await probe(standby_port, "readyz")
        assert status == 503 and f"lease is held by pid {leader.pid}" in body["not_ready"]["bot"], body
        assert (await probe(leader_port, "readyz"))[0] == 200
        assert await leader.terminate() == 0, await leader.stderr()
        await wait_ready(standby, 30)
        assert await probe(standby_port, "readyz") == (200, {"ready": True})
        assert await standby.terminate() == 0, await standby.stderr()
    finally:
        await pair.close()


async def test_a_standby_on_the_leaders_admin_port_takes_the_port_over_with_the_lease(
    fake: FakeSlack, tmp_path: Path, pg_url: str
) -> None:
    """Two instances on one host with one config: the standby cannot listen while the leader does; it must
    neither exit nor stay without its endpoint once it leads."""
    env = bot_env(tmp_path, **fake.env)
    port = free_port()
    pair = Pair(with_admin(pg_config(tmp_path, pg_url), port), env)
    try:
        leader, standby = await pair.leader_and_standby()
        assert await leader.terminate() == 0, await leader.stderr()
        await wait_ready(standby, 30)
        assert any(line.startswith(f"admin: http://127.0.0.1:{port}/") for line in standby.lines), (
            standby.output()
        )
        assert await probe(port, "readyz") == (200, {"ready": True})
        assert await standby.terminate() == 0, await standby.stderr()
    finally:
        await pair.close()
