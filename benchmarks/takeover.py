"""Issue 15: takeover time. A leader and a standby (`python -m bots run`, two real processes) on one PostgreSQL
store, against the fake Slack. Each run: kill the leader (SIGKILL) or stop it (SIGTERM), post a message at once,
and time until the standby's answer appears in the channel. Goals: SIGKILL <= lease ttl + 2 s (p50 and max),
SIGTERM <= 2 s.

The server: `DURABLE_BOTS_BENCH_DATABASE_URL`, else a throwaway cluster (see `benchmarks.postgres`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

from adapters.slack.testing import FakeSlack
from benchmarks._env import REPO, Options, cleanup
from benchmarks._report import Report
from benchmarks.postgres import database, server

NAME = "takeover"
TITLE = "standby takeover: leader SIGKILL / SIGTERM -> first answer by the standby (issue 15)"
TTL = 10.0  # the default [storage] lease_ttl
TINY_TTL = 3.0  # --tiny (the smoke test) only checks that it runs: no need to wait out the default
LAST_LINE = "without running a tool twice."  # the end of the demo's greeting
CONFIG = """
[bot]
name = "bench-bot"
model = "faux:demo"

[storage]
url = {url}
lease_ttl = {ttl}

[answer]
mode = "all"

[approvals]
tools = []

[tickets]
path = {tickets}

[deploy]
record_path = {deploys}

[adapters.slack]
mode = "socket"
edit_interval = 0.05
"""


class Process:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []

    async def wait_for(self, prefix: str, timeout: float) -> None:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            raw = await asyncio.wait_for(
                self.process.stdout.readline(), max(0.01, deadline - time.monotonic())
            )
            if not raw:
                raise RuntimeError(f"bot ended before {prefix!r}: {self.lines}")
            line = raw.decode().rstrip("\n")
            self.lines.append(line)
            if line.startswith(prefix):
                return

    async def end(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()


async def start(config: Path, env: dict[str, str]) -> Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bots",
        "run",
        "--config",
        str(config),
        "--adapter",
        "slack",
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    return Process(process)


async def one_run(admin_url: str, scratch: Path, how: signal.Signals, n: int, ttl: float) -> float:
    """Seconds from the signal to the standby's first answer."""
    async with database(admin_url) as url, FakeSlack(ack_timeout=10.0) as fake:
        channel = fake.add_channel("general")
        alice = fake.add_user("UALICE", name="alice", display_name="Alice")
        config = scratch / f"bot-{n}.toml"
        config.write_text(
            CONFIG.format(
                url=json.dumps(url),
                ttl=ttl,
                tickets=json.dumps(str(scratch / "tickets.json")),
                deploys=json.dumps(str(scratch / "deploys.jsonl")),
            )
        )
        env = {**os.environ, **fake.env, "DURABLE_BOTS_DEMO_DELAY_MS": "0"}
        leader = await start(config, env)
        standby: Process | None = None
        try:
            await leader.wait_for("durable-bots: ready", 60)
            standby = await start(config, env)
            await standby.wait_for("durable-bots: standby", 60)
            # The leader answers once (the channel becomes a place the bot knows, so a new leader's catch-up
            # reads it), then runs on for a renewal or two, as a bot that has been up a while.
            await fake.user_posts(channel, alice, "hello bot")
            await fake.wait_for_message(channel, contains=LAST_LINE, timeout=60)
            await asyncio.sleep(ttl / 2)
            leader.process.send_signal(how)
            signalled = time.monotonic()
            await fake.user_posts(channel, alice, "hello again")
            await fake.wait_for(
                lambda: len(fake.bot_messages(channel)) >= 2, ttl + 60, description="the answer"
            )
            return time.monotonic() - signalled
        finally:
            for bot in (leader, standby):
                if bot is not None:
                    await bot.end()


async def run(options: Options) -> Report:
    runs = options.size(10, 3, 1)
    ttl = TINY_TTL if options.tiny else TTL
    report = Report(
        NAME,
        TITLE,
        f"{runs} runs each: a leader and a standby `python -m bots run` (faux:demo, Slack Socket Mode against the "
        f"fake Slack) on a fresh PostgreSQL database, lease_ttl {ttl:g} s. The leader has run at least ttl/2; "
        "then SIGKILL (or SIGTERM), a user message posted at once, and the time from the signal to the first "
        "bot message after it (the standby's answer: takeover, start-up, catch-up or delivery, answer).",
    )
    scratch = options.scratch(NAME)
    try:
        async with server() as admin_url:
            killed = [await one_run(admin_url, scratch, signal.SIGKILL, n, ttl) for n in range(runs)]
            stopped = [await one_run(admin_url, scratch, signal.SIGTERM, runs + n, ttl) for n in range(runs)]
    finally:
        cleanup(scratch)
    k50 = report.add("SIGKILL -> answer, p50", statistics.median(killed), "s")
    kmax = report.add("SIGKILL -> answer, max", max(killed), "s")
    t50 = report.add("SIGTERM -> answer, p50", statistics.median(stopped), "s")
    tmax = report.add("SIGTERM -> answer, max", max(stopped), "s")
    report.note("SIGKILL runs: " + ", ".join(f"{x:.2f}" for x in killed))
    report.note("SIGTERM runs: " + ", ".join(f"{x:.2f}" for x in stopped))
    report.goal(
        f"SIGKILL: p50 and max <= lease ttl + 2 s ({ttl + 2:g} s)",
        kmax <= ttl + 2,
        f"{k50:.2f} / {kmax:.2f} s",
    )
    report.goal("SIGTERM: p50 and max <= 2 s", tmax <= 2.0, f"{t50:.2f} / {tmax:.2f} s")
    return report
