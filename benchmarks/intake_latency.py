"""Issue 8.3: intake latency. The platform bridge (`adapters.bridge`, in process, with its in-memory transport)
takes 500 messages/s across 50 channels; p50/p99 from receipt to durable commit. Goal: p99 under 10 ms."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import aiosqlite

from adapters.bridge import Bridge, IncomingMessage, Place
from adapters.bridge.testing import MemoryTransport
from adapters.slack.adapter import create as create_slack
from benchmarks import _script
from benchmarks._env import REPO, Options, cleanup, median, percentile
from benchmarks._report import Report
from benchmarks._slack_load import mentions_bot
from benchmarks._slack_load import open_loop as open_loop_schedule
from bots.runtime import freeze_startup_heap
from harness_core import Harness, Models
from harness_core.storage import SqliteStorage

NAME = "intake_latency"
TITLE = "intake latency through the platform bridge (issue 8.3)"
RATE = 500  # messages per second
CHANNELS = 50


def message(n: int, places: list[Place], mention_every: int) -> IncomingMessage:
    mention = mentions_bot(n, mention_every, len(places))
    text = f"{'<@BOT> ' if mention else ''}message {n}: the deploy of service {n % 7} looks fine"
    return IncomingMessage(
        places[n % len(places)], f"{n}", f"U{n % 40}", f"user{n % 40}", text, mentions_bot=mention
    )


async def open_loop(count: int, receive: Callable[[int], Awaitable[None]]) -> tuple[list[float], float]:
    """Start `receive(n)` at n / RATE seconds (whether or not earlier ones finished); latency of each from its
    scheduled arrival; and the achieved rate.

    Each message's task is started when it arrives, as a web server starts a handler when a request comes in;
    starting all of them up front would leave thousands of sleeping tasks on the heap, and the garbage
    collector's full passes over them (30-50 ms each) would be charged to intake. What is alive when the
    clock starts is frozen, as `durable-bots run` does once it is ready."""
    freeze_startup_heap()
    loop = asyncio.get_running_loop()
    latencies = [0.0] * count

    async def one(n: int, arrival: float) -> None:
        await receive(n)
        latencies[n] = loop.time() - arrival

    try:
        start = await open_loop_schedule(count, RATE, one)
    finally:
        gc.unfreeze()  # the benchmarks that follow in this process start from a normal collector
    return latencies, count / (loop.time() - start)


async def ours(options: Options, count: int, mention_every: int) -> tuple[list[float], float, dict[str, int]]:
    scratch = options.scratch(NAME)
    try:
        registry = _script.registry()
        storage = await SqliteStorage.open(scratch / "bridge.sqlite", durability=options.durability)
        harness = await Harness.open(storage, models=Models(_script.scripted_faux()), registry=registry)
        bridge = Bridge(harness, agent=_script.AGENT)
        registry.install(bridge.extension())
        bridge.attach(MemoryTransport("bench"))
        await bridge.start()
        places = [Place("bench", "W1", f"C{n}") for n in range(CHANNELS)]
        for n, place in enumerate(places):  # each channel's conversation exists before the clock starts
            await bridge.intake(IncomingMessage(place, f"warm-{n}", "U0", "user0", "hello"))
        harness.resume()
        outcomes: dict[str, int] = {}

        async def receive(n: int) -> None:
            result = await bridge.intake(message(n, places, mention_every))
            outcomes[result.outcome] = outcomes.get(result.outcome, 0) + 1

        latencies, rate = await open_loop(count, receive)
        await bridge.stop()
        await harness.close()
        return latencies, rate, outcomes
    finally:
        cleanup(scratch)


async def slack(
    options: Options, mode: str, count: int, mention_every: int
) -> tuple[list[float], float, list[str]]:
    """The same load through the Slack adapter's HTTP Events API: the fake Slack and the load run in a child
    process (`_slack_load`), which times each event from the post's scheduled arrival to the bot's HTTP 200,
    i.e. through signature check, slack-bolt dispatch, the adapter and `Bridge.intake()`."""
    scratch = options.scratch(NAME)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks._slack_load",
        mode,
        str(count),
        str(RATE),
        str(CHANNELS),
        str(mention_every),
        cwd=REPO,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        limit=1 << 26,  # the result line holds every latency
    )
    assert child.stdin is not None and child.stdout is not None
    stdin, stdout = child.stdin, child.stdout

    async def tell(value: dict[str, object]) -> None:
        stdin.write((json.dumps(value) + "\n").encode())
        await stdin.drain()

    async def hear() -> dict[str, Any]:
        line = await asyncio.wait_for(stdout.readline(), 120)
        if not line:
            raise RuntimeError("the Slack load process ended early")
        value: dict[str, Any] = json.loads(line)
        return value

    try:
        env = (await hear())["env"]
        async with contextlib.AsyncExitStack() as stack:
            registry = _script.registry()
            storage = await SqliteStorage.open(scratch / "slack.sqlite", durability=options.durability)
            harness = await Harness.open(storage, models=Models(_script.scripted_faux()), registry=registry)
            stack.push_async_callback(harness.close)
            bridge = Bridge(harness, agent=_script.AGENT)
            registry.install(bridge.extension())
            adapter = create_slack({"mode": mode, "port": 0}, env)
            await bridge.start()
            stack.push_async_callback(bridge.stop)
            await adapter.start(bridge)
            stack.push_async_callback(adapter.stop)
            harness.resume()
            await tell({"url": adapter.url})
            await hear()  # warmed: one message per channel taken in
            freeze_startup_heap()
            try:
                await tell({"go": True})
                result = await hear()
            finally:
                gc.unfreeze()
            # every answer delivered before the adapter stops
            await asyncio.wait_for(harness.wait_for_idle(), 60)
            await asyncio.wait_for(bridge.delivery.idle(), 120)
        latencies: list[float] = result["latencies"]
        return latencies, count / float(result["seconds"]), list(result["failed"])
    finally:
        stdin.close()
        try:
            await asyncio.wait_for(child.wait(), 30)
        except TimeoutError:
            child.kill()
            await child.wait()
        cleanup(scratch)


async def raw(options: Options, count: int) -> tuple[list[float], float]:
    """The floor: one aiosqlite INSERT + commit per message at the same arrival schedule."""
    scratch = options.scratch(NAME)
    try:
        async with aiosqlite.connect(str(scratch / "raw.sqlite")) as conn:
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute(f"PRAGMA synchronous={options.durability.upper()}")
            await conn.execute("CREATE TABLE messages (id TEXT PRIMARY KEY, channel TEXT, text TEXT)")
            await conn.commit()
            places = [Place("bench", "W1", f"C{n}") for n in range(CHANNELS)]

            async def receive(n: int) -> None:
                incoming = message(n, places, 0)
                await conn.execute(
                    "INSERT INTO messages VALUES (?, ?, ?)",
                    (incoming.request_id, incoming.place.key, incoming.text),
                )
                await conn.commit()

            return await open_loop(count, receive)
    finally:
        cleanup(scratch)


async def run(options: Options) -> Report:
    seconds = options.size(10, 4, 1)
    count = RATE * seconds if not options.tiny else 100
    report = Report(
        NAME,
        TITLE,
        f"Open loop: message n arrives at n/{RATE} s (next arrivals do not wait for earlier ones), channel n mod "
        f"{CHANNELS}, for {count:,} messages. `bridge`: timed per message from its arrival to `Bridge.intake()` returning "
        "(the submission and its delivery record committed to SQLite). Bridge in process with its in-memory "
        "transport, scripted faux model; channels created before the clock starts and the heap then frozen (`freeze_startup_heap()`, as `durable-bots run` does once ready). `recorded`: no message "
        "addresses the bot (kept as context); `mixed`: one in 10 mentions it (one in 10 of each channel's messages) and starts a scripted turn "
        "(tool call + answer + delivery) while intake goes on. `slack socket` / `slack http`: the same two loads "
        "through the Slack adapter (Socket Mode envelopes, or signed HTTP Events API requests: signature check, "
        "slack-bolt, adapter, bridge) from the loopback fake Slack in a child process, timed per event from the "
        "post's scheduled arrival to the bot's ack (a mention is two events, message and app_mention); the "
        "answers go back to the fake over its Web API. Anchor: one aiosqlite INSERT + commit per "
        "message on the same schedule.",
    )
    figures: dict[str, list[float]] = {}

    def add(label: str, latencies: list[float], rate: float, detail: str) -> None:
        figures[label] = latencies
        report.add(f"{label}: p50", median(latencies) * 1000, "ms")
        report.add(f"{label}: p99", percentile(latencies, 99) * 1000, "ms")
        report.add(f"{label}: max", max(latencies) * 1000, "ms")
        report.add(f"{label}: achieved rate", rate, "messages/s", detail)

    for load, every in (("recorded", 0), ("mixed", 10)):
        latencies, rate, outcomes = await ours(options, count, every)
        add(f"bridge {load}", latencies, rate, ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
        for mode in ("socket", "http"):
            latencies, rate, failed = await slack(options, mode, count, every)
            add(f"slack {mode} {load}", latencies, rate, f"{len(latencies)} events acked")
            if failed:
                report.note(f"slack {mode} {load}: {len(failed)} event(s) not acked, first: {failed[0]}")
    anchor, anchor_rate = await raw(options, count)
    report.add("raw aiosqlite: p50", median(anchor) * 1000, "ms")
    report.add("raw aiosqlite: p99", percentile(anchor, 99) * 1000, "ms")
    report.add("raw aiosqlite: achieved rate", anchor_rate, "messages/s")
    for label, latencies in figures.items():
        report.ratio(f"{label} p99 / raw p99", percentile(latencies, 99), percentile(anchor, 99))
    for load, text in (
        ("recorded", "p99 receipt -> durable commit under 10 ms (intake only, every path)"),
        ("mixed", "the same with one message in 10 answered meanwhile"),
    ):
        labels = [label for label in figures if label.endswith(load)]
        worst = max(labels, key=lambda label: percentile(figures[label], 99))
        p99 = percentile(figures[worst], 99)
        report.goal(text, p99 < 0.010, f"worst p99 {p99 * 1000:.1f} ms ({worst})")
    return report
