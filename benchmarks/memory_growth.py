"""Issue 12: bounded memory. 20,000 messages over 200 channels through the real bridge (SQLite, scripted faux
model, every message answered and delivered), RSS sampled every 1,000 messages in a fresh process. Goal: the
last 10,000 messages grow RSS by under 5 MB."""

from __future__ import annotations

import gc
import itertools
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._env import Options, cleanup, run_child
from benchmarks._report import Report

NAME = "memory_growth"
TITLE = "RSS growth under steady load through the bridge (issue 12)"
GOAL_BYTES = 5 * 2**20


class LeanTransport:
    """A platform that keeps nothing per message (the test transport records every call, which would be the
    benchmark's own leak). `find` answers None: nothing crashes here, so no reconciliation is needed."""

    platform = "bench"
    max_chars = 4000
    edit_interval = 0.0

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.creates = 0
        self.edits = 0

    async def create(
        self, target: Any, text: str, key: str, *, final: bool = False, requester: str | None = None
    ) -> str:
        self.creates += 1
        return str(next(self._ids))

    async def edit(self, target: Any, message_id: str, text: str, key: str, *, final: bool) -> None:
        self.edits += 1

    async def find(self, target: Any, key: str) -> str | None:
        return None

    async def post_approval(self, target: Any, gate: Any, key: str) -> str:
        return str(next(self._ids))

    async def update_approval(self, target: Any, message_id: str, gate: Any) -> None:
        return None

    async def history(self, place: Any, after: str | None) -> list[Any]:
        return []


async def measure(args: dict[str, Any]) -> dict[str, Any]:
    """Child: a bridge over SQLite with the lean transport; messages go in waves of one per channel (each
    wave taken in, answered and delivered before the next), RSS after gc every `sample_every` messages."""
    import asyncio

    from adapters.bridge import Bridge, IncomingMessage, Place
    from benchmarks import _script
    from benchmarks._env import rss_bytes
    from harness_core import Harness, Models
    from harness_core.storage import SqliteStorage

    total: int = args["messages"]
    every: int = args["sample_every"]
    channels: int = args["channels"]
    registry = _script.registry()
    storage = await SqliteStorage.open(Path(args["path"]))
    harness = await Harness.open(storage, models=Models(_script.scripted_faux()), registry=registry)
    bridge = Bridge(harness, agent=_script.AGENT)
    registry.install(bridge.extension())
    transport = LeanTransport()
    bridge.attach(transport)  # type: ignore[arg-type]  # structurally a Transport
    await bridge.start()
    harness.resume()
    places = [Place("bench", "W1", f"C{n}") for n in range(channels)]
    samples: list[tuple[int, int]] = []
    sent = 0
    started = time.monotonic()

    async def settle() -> None:
        await asyncio.wait_for(harness.wait_for_idle(), 300)
        await asyncio.wait_for(bridge.delivery.idle(), 300)

    gc.collect()
    samples.append((0, rss_bytes()))
    blocks = [sys.getallocatedblocks()]  # live objects: flat while RSS steps means the allocator kept pages
    waits = [0]  # misses that waited for the context cache's miss budget, so far
    peaks = [0]  # the most contexts read on a miss in use at once, since the sample before
    while sent < total:
        wave = min(channels, total - sent)
        for offset in range(wave):
            n = sent + offset
            place = places[n % channels]
            text = f"<@BOT> message {n}: what is k for service {n % 7}?"
            await bridge.intake(IncomingMessage(place, str(n), f"U{n % 40}", f"user{n % 40}", text, True))
        await settle()
        before = sent
        sent += wave
        if sent // every != before // every or sent == total:
            gc.collect()
            samples.append((sent, rss_bytes()))
            blocks.append(sys.getallocatedblocks())
            cache = harness.context_cache
            waits.append(cache.admit_waits)
            peaks.append(cache.missing_peak)
            cache.missing_peak = cache.missing[0]
    answered = transport.creates
    cache = harness.context_cache
    await bridge.stop()
    await harness.close()
    return {
        "samples": samples,
        "answered": answered,
        "reads": cache.reads,
        "gets": cache.gets,
        "admit_waits": cache.admit_waits,
        "admit_timeouts": cache.admit_timeouts,
        "blocks": blocks,
        "waits": waits,
        "peaks": peaks,
        "seconds": time.monotonic() - started,
    }


async def run(options: Options) -> Report:
    messages = options.size(20_000, 4_000, 400)
    channels = options.size(200, 100, 20)
    every = options.size(1_000, 200, 100)
    report = Report(
        NAME,
        TITLE,
        f"A fresh process runs the bridge over SQLite with the scripted faux model (tool call + answer per turn) "
        f"and an in-process transport that keeps nothing per message. {messages:,} messages over {channels} "
        "channels, each mentioning the bot, in waves of one per channel (a wave is taken in, answered and "
        f"delivered before the next). RSS after gc every {every:,} messages. Figure: RSS growth over "
        "the second half of the messages.",
    )
    scratch = options.scratch(NAME)
    try:
        result = await run_child(
            "memory_growth",
            "measure",
            {
                "path": str(scratch / "store.sqlite"),
                "messages": messages,
                "channels": channels,
                "sample_every": every,
            },
        )
    finally:
        cleanup(scratch)
    samples: list[tuple[int, int]] = [tuple(s) for s in result["samples"]]
    half = messages // 2
    middle = min(samples, key=lambda s: abs(s[0] - half))
    first, last = samples[0], samples[-1]
    report.add("RSS at start (bridge open, no message)", first[1] / 2**20, "MiB")
    report.add(f"RSS after {middle[0]:,} messages", middle[1] / 2**20, "MiB")
    report.add(f"RSS after {last[0]:,} messages", last[1] / 2**20, "MiB")
    growth = report.add(
        f"growth over the last {last[0] - middle[0]:,} messages", (last[1] - middle[1]) / 2**20, "MiB"
    )
    report.add("answers delivered", result["answered"], "messages")
    report.add("contexts read from storage (cache misses)", result["reads"], f"of {result['gets']:,} gets")
    report.add(
        "misses that waited for the miss budget",
        result["admit_waits"],
        "misses",
        f"{result['admit_timeouts']:,} of them went over it after the wait limit",
    )
    report.add("wall time of the child", result["seconds"], "s")
    report.note("RSS samples (messages: MiB): " + ", ".join(f"{n}: {rss / 2**20:.1f}" for n, rss in samples))
    report.note(
        "Live Python objects (sys.getallocatedblocks, thousands) at the same samples: "
        + ", ".join(f"{b / 1000:.0f}" for b in result["blocks"])
    )
    report.note(
        "Misses that waited for the miss budget, so far / the most contexts read on a miss in use at once since "
        "the sample before: "
        + ", ".join(f"{w}/{p}" for w, p in zip(result["waits"], result["peaks"], strict=True))
    )
    report.goal(
        "the second half of the messages grows RSS by under 5 MB",
        growth * 2**20 < GOAL_BYTES,
        f"{growth:.1f} MiB",
    )
    return report
