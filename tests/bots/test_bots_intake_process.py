"""A worker's separate intake process (`[workers] intake = "separate"`): real `python -m bots run` workers on a
real PostgreSQL store, against the fake Slack in Socket Mode.

What it is for: the worker's own event loop (turns, deliveries) no longer stands between a Slack event and its
acknowledgement. Shown directly: with the worker itself frozen (SIGSTOP), its intake process still commits and
acknowledges every event, and the worker answers them once it runs again, each exactly once. Then the child is
SIGKILLed (started again by the worker, nothing lost), and the worker is SIGKILLed (the child goes with it).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import psutil
import pytest
from bots_cli_support import bot_env, cli, free_port, shipped_config_in, toml_value
from priority_support import thread_nice
from workers_support import TOKEN, EchoModel, Worker, token

from adapters.slack.testing import Channel, FakeSlack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TTL = 3.0
PARTITIONS = 4


def separate_config(workdir: Path, url: str, admin: int) -> Path:
    return shipped_config_in(
        workdir,
        replace={
            'path = "var/ops.sqlite"': f"url = {toml_value(url)}\nlease_ttl = {TTL}\npartitions = {PARTITIONS}",
            'model = "faux:demo"': 'model = "openai:gpt-4o"',
        },
        append=(
            '\n[workers]\nintake = "separate"\n'
            '\n[adapters.slack]\nmode = "socket"\nedit_interval = 0.05\n'
            f'\n[admin]\nlisten = "127.0.0.1:{admin}"\n'
        ),
    )


def intake_children(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children() if "intake" in " ".join(p.cmdline())]


def answered(fake: FakeSlack, channel: Channel) -> list[str]:
    return [t for m in fake.bot_messages(channel) for t in TOKEN.findall(m.text or "")]


async def readyz(port: int) -> dict[str, object]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/readyz") as response:
        body: dict[str, object] = await response.json()
        return {"status": response.status, **body}


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    # Slack sends an envelope nobody acknowledged (or that found no connection open) again, later.
    async with FakeSlack(auto_retry=True, ack_timeout=2.0, retry_delays=(0.0, 4.0, 10.0), seed=7) as running:
        yield running


async def test_a_frozen_worker_still_acknowledges_through_its_intake_process_and_answers_each_event_once(
    fake: FakeSlack, tmp_path: Path, pg_url: str
) -> None:
    channels = [fake.add_channel(f"ops-{n}") for n in range(3)]
    alice = fake.add_user("UALICE", name="alice", display_name="Alice")
    admin = free_port()
    async with EchoModel() as model:
        env = bot_env(tmp_path, **fake.env, OPENAI_BASE_URL=model.url, OPENAI_API_KEY="sk-test-intake")
        worker = await Worker.start("w1", separate_config(tmp_path, pg_url, admin), env, tmp_path)
        try:
            await worker.ready()
            # One Socket Mode connection, and it is the child's: the worker itself holds none.
            assert len(fake.open_connections) == 1
            children = intake_children(worker.pid)
            assert len(children) == 1, worker.output()
            child = children[0]
            assert any(
                line.startswith(f"intake (pid {child.pid}): durable-bots intake: ready")
                for line in worker.lines
            )
            assert (await readyz(admin))["status"] == 200
            # The worker lowered its threads below its child (`worker_nice`, default 10); the child did not.
            assert "durable-bots: worker CPU priority lowered to nice 10 (its threads)" in worker.output()
            assert thread_nice(worker.pid) == 10 and thread_nice(child.pid) == 0

            for n, channel in enumerate(channels):
                await (await fake.user_posts(channel, alice, f"{token(n, 0)} warm up")).wait_acked(30)
            await fake.wait_for(lambda: all(answered(fake, c) for c in channels), 60, description="warm-up")

            # The worker frozen: its intake process goes on committing and acknowledging.
            worker.process.send_signal(signal.SIGSTOP)
            try:
                posts = [
                    await fake.user_posts(channel, alice, f"{token(n, m)} while frozen")
                    for m in (1, 2)
                    for n, channel in enumerate(channels)
                ]
                for post in posts:  # raises if one is not acknowledged while the worker is frozen
                    await post.wait_acked(20)
                assert all(p.deliveries[0].attempts[0].outcome == "acked" for p in posts)
                assert all(len(p.deliveries[0].attempts) == 1 for p in posts)  # acked at once, never resent
                assert not any(answered(fake, c)[1:] for c in channels)  # nothing answered yet: it is frozen
            finally:
                worker.process.send_signal(signal.SIGCONT)
            await fake.wait_for(
                lambda: all(len(answered(fake, c)) >= 3 for c in channels), 60, description="the frozen ones"
            )

            # The intake process dies: the worker starts another; an event sent meanwhile is sent again by
            # Slack once a connection is open, and is answered once.
            child.kill()
            await worker.wait_for(lambda line: "the separate intake process exited" in line, 30)
            late = await fake.user_posts(channels[0], alice, f"{token(0, 3)} after the restart")
            await worker.wait_for(
                lambda line: "durable-bots intake: ready" in line and f"pid {child.pid}" not in line, 60
            )
            await late.wait_acked(30)  # resent by Slack to the new child's connection
            # Started again by the worker, whose threads are at nice 10: the new child still runs at 0.
            [restarted] = intake_children(worker.pid)
            assert restarted.pid != child.pid and thread_nice(restarted.pid) == 0
            await fake.wait_for(lambda: len(answered(fake, channels[0])) >= 4, 60, description="the late one")
            await asyncio.sleep(1.5)  # time for anything (wrongly) answered twice to show up
            for n, channel in enumerate(channels):
                asked = [token(n, m) for m in range(4 if n == 0 else 3)]
                assert answered(fake, channel) == asked, (channel.name, answered(fake, channel), asked)
            conn = await asyncpg.connect(pg_url)
            try:  # every event went through the intake process as one ingress record, each once
                keys = await conn.fetchval("SELECT count(*) FROM ingress")
                assert keys == len(channels) + 2 * len(channels) + 1  # warm-up 3, frozen 6, late 1
            finally:
                await conn.close()

            # The worker SIGKILLed: its intake process goes too (nothing is left taking events for nobody).
            second = intake_children(worker.pid)[0]
            worker.process.send_signal(signal.SIGKILL)
            assert await worker.finish(30) == -signal.SIGKILL
            deadline = time.monotonic() + 15
            while second.is_running() and second.status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < deadline, "the intake process outlived its worker"
                await asyncio.sleep(0.2)
        finally:
            if worker.process.returncode is None:
                worker.process.send_signal(signal.SIGCONT)
            for orphan in intake_children(worker.pid) if worker.process.returncode is None else []:
                orphan.kill()
            await worker.kill()


async def test_a_worker_whose_intake_process_cannot_start_says_why_and_exits(
    fake: FakeSlack, tmp_path: Path, pg_url: str
) -> None:
    async with EchoModel() as model:
        env = bot_env(
            tmp_path,
            **{**fake.env, "SLACK_APP_TOKEN": "xoxb-not-an-app-token"},
            OPENAI_BASE_URL=model.url,
            OPENAI_API_KEY="sk-test-intake",
        )
        worker = await Worker.start("w1", separate_config(tmp_path, pg_url, free_port()), env, tmp_path)
        try:
            code = await worker.finish(90)
            assert code != 0, worker.output()
            said = worker.output() + worker.stderr()
            assert "the separate intake process did not start (exit code 1)" in said, said
            assert "SLACK_APP_TOKEN must be an app-level token" in said, said
            assert not fake.open_connections
        finally:
            await worker.kill()


async def test_the_intake_role_is_refused_without_a_separate_intake(tmp_path: Path) -> None:
    result = await cli(shipped_config_in(tmp_path), "run", "--role", "intake", env=bot_env(tmp_path))
    assert result.returncode != 0
    assert '[workers] intake = "separate"' in result.stderr + result.stdout


async def test_in_http_mode_the_intake_process_serves_the_request_url(tmp_path: Path, pg_url: str) -> None:
    port = free_port()
    async with FakeSlack(mode="http", ack_timeout=3.0) as fake, EchoModel() as model:
        fake.request_url = f"http://127.0.0.1:{port}/slack/events"
        channel = fake.add_channel("ops-http")
        alice = fake.add_user("UALICE", name="alice", display_name="Alice")
        config = separate_config(tmp_path, pg_url, free_port())
        text = config.read_text().replace('mode = "socket"', f'mode = "http"\nport = {port}')
        config.write_text(text)
        env = bot_env(tmp_path, **fake.env, OPENAI_BASE_URL=model.url, OPENAI_API_KEY="sk-test-intake")
        worker = await Worker.start("w1", config, env, tmp_path)
        try:
            await worker.ready()
            child = intake_children(worker.pid)[0]
            # The Request URL is the child's (said by it, through the worker); the worker serves no port.
            assert any(
                line.startswith(f"intake (pid {child.pid}): slack: http://127.0.0.1:{port}/slack/events")
                for line in worker.lines
            ), worker.output()
            listening = {c.laddr.port for c in child.net_connections() if c.status == psutil.CONN_LISTEN}
            assert port in listening
            assert port not in {
                c.laddr.port
                for c in psutil.Process(worker.pid).net_connections()
                if c.status == psutil.CONN_LISTEN
            }
            for n in range(3):
                await (await fake.user_posts(channel, alice, f"{token(0, n)} over http")).wait_acked(30)
            await fake.wait_for(lambda: len(answered(fake, channel)) >= 3, 60, description="three answers")
            await asyncio.sleep(1.0)
            assert answered(fake, channel) == [token(0, n) for n in range(3)]
            worker.process.send_signal(signal.SIGTERM)
            assert await worker.finish(60) == 0, worker.output() + worker.stderr()
            assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
        finally:
            await worker.kill()


async def test_with_separate_intakes_a_killed_worker_and_a_joining_one_lose_and_double_nothing(
    fake: FakeSlack, tmp_path: Path, pg_url: str
) -> None:
    """Traffic over two workers with separate intakes; one worker is SIGKILLed mid-traffic (its intake process
    goes with it: what it held unacknowledged is sent again by Slack to the other's), a third joins. Every
    message is answered exactly once, in order within its channel."""
    channels = [fake.add_channel(f"team-{n}") for n in range(8)]
    people = [fake.add_user(f"U{n:03d}", name=f"p{n}", display_name=f"P {n}") for n in range(5)]
    count, span = 120, 12.0
    async with EchoModel() as model:
        env = bot_env(tmp_path, **fake.env, OPENAI_BASE_URL=model.url, OPENAI_API_KEY="sk-test-intake")
        workers: list[Worker] = []

        async def start(name: str) -> Worker:
            own = tmp_path / name
            own.mkdir()
            worker = await Worker.start(name, separate_config(own, pg_url, free_port()), env, tmp_path)
            workers.append(worker)
            await worker.ready()
            return worker

        try:
            await start("w1")
            second = await start("w2")
            asked: dict[str, list[str]] = {c.id: [] for c in channels}
            began = time.monotonic()

            async def traffic() -> None:
                for n in range(count):
                    await asyncio.sleep(max(0.0, began + n * span / count - time.monotonic()))
                    channel = channels[n % len(channels)]
                    text = token(n % len(channels), n // len(channels))
                    asked[channel.id].append(text)
                    await fake.user_posts(channel, people[n % len(people)], f"{text} status?")

            async def operations() -> None:
                await asyncio.sleep(span * 0.3)
                (orphan,) = intake_children(second.pid)
                second.process.send_signal(signal.SIGKILL)
                assert await second.finish(30) == -signal.SIGKILL
                for _ in range(150):  # its intake process went with it
                    if not orphan.is_running() or orphan.status() == psutil.STATUS_ZOMBIE:
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError("the killed worker's intake process is still running")
                await asyncio.sleep(span * 0.2)
                await start("w3")

            await asyncio.gather(traffic(), operations())
            await fake.wait_for(
                lambda: all(len(answered(fake, c)) >= len(asked[c.id]) for c in channels),
                120,
                description="every message answered",
            )
            for worker in workers:
                if worker.process.returncode is None:
                    worker.process.send_signal(signal.SIGTERM)
            for worker in workers:
                if worker is not second:
                    assert await worker.finish(60) == 0, worker.output() + worker.stderr()
            # Nothing can arrive any more: each message answered once, in order.
            for channel in channels:
                assert answered(fake, channel) == asked[channel.id], channel.name
        finally:
            for worker in workers:
                await worker.kill()
