"""Issue 8.3: intake latency. The platform bridge (`adapters.bridge`, in process, with its in-memory transport)
takes 500 messages/s across 50 channels; p50/p99 from receipt to durable commit. Goal: p99 under 10 ms."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable

import aiosqlite

from adapters.bridge import Bridge, IncomingMessage, Place
from adapters.bridge.testing import MemoryTransport
from benchmarks import _script
from benchmarks._env import Options, cleanup, median, percentile
from benchmarks._report import Report
from bots.runtime import freeze_startup_heap
from harness_core import Harness, Models
from harness_core.storage import SqliteStorage

NAME = "intake_latency"
TITLE = "intake latency through the platform bridge (issue 8.3)"
RATE = 500  # messages per second
CHANNELS = 50


def message(n: int, places: list[Place], mention_every: int) -> IncomingMessage:
    mention = mention_every > 0 and n % mention_every == 0
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
    start = loop.time() + 0.05
    latencies = [0.0] * count

    async def one(n: int, arrival: float) -> None:
        await receive(n)
        latencies[n] = loop.time() - arrival

    try:
        async with asyncio.TaskGroup() as group:
            for n in range(count):
                arrival = start + n / RATE
                delay = arrival - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                group.create_task(one(n, arrival))
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
        f"{CHANNELS}, for {count:,} messages. Timed per message: from its arrival to `Bridge.intake()` returning "
        "(the submission and its delivery record committed to SQLite). Bridge in process with its in-memory "
        "transport, scripted faux model; channels created before the clock starts and the heap then frozen (`freeze_startup_heap()`, as `durable-bots run` does once ready). `recorded`: no message "
        "addresses the bot (kept as context); `mixed`: every 10th mentions it and starts a scripted turn "
        "(tool call + answer + delivery) while intake goes on. Anchor: one aiosqlite INSERT + commit per "
        "message on the same schedule.",
    )
    figures = {}
    for label, every in (("recorded", 0), ("mixed", 10)):
        latencies, rate, outcomes = await ours(options, count, every)
        figures[label] = latencies
        report.add(f"{label}: p50", median(latencies) * 1000, "ms")
        report.add(f"{label}: p99", percentile(latencies, 99) * 1000, "ms")
        report.add(f"{label}: max", max(latencies) * 1000, "ms")
        report.add(
            f"{label}: achieved rate",
            rate,
            "messages/s",
            ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())),
        )
    anchor, anchor_rate = await raw(options, count)
    report.add("raw aiosqlite: p50", median(anchor) * 1000, "ms")
    report.add("raw aiosqlite: p99", percentile(anchor, 99) * 1000, "ms")
    report.add("raw aiosqlite: achieved rate", anchor_rate, "messages/s")
    for label, latencies in figures.items():
        report.ratio(f"{label} p99 / raw p99", percentile(latencies, 99), percentile(anchor, 99))
    worst = max(percentile(v, 99) for v in figures.values())
    report.goal(
        "p99 receipt -> durable commit under 10 ms", worst < 0.010, f"worst p99 {worst * 1000:.1f} ms"
    )
    return report
