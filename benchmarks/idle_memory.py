"""Issue 8.6: idle memory. RSS per idle conversation with 10,000 conversations open, measured in a fresh
process. Goal: under 10 KB per conversation."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

from benchmarks import _bulk
from benchmarks._env import Options, cleanup, copy_store, run_child
from benchmarks._report import Report

NAME = "idle_memory"
TITLE = "RSS per idle conversation (issue 8.6)"
GOAL_BYTES = 10 * 1024


async def measure(args: dict[str, Any]) -> dict[str, Any]:
    """Child: open the store, then hold a handle to every conversation, then run one turn in each; RSS after each
    step (after gc), relative to the harness opened and warmed by one turn."""
    from benchmarks import _script
    from benchmarks._env import rss_bytes

    def settled_rss() -> int:
        gc.collect()
        return rss_bytes()

    ids: list[int] = args["conversations"]
    harness = await _script.open_harness(Path(args["path"]))
    warm = await harness.conversation(ids[0])
    assert warm is not None
    await _script.turn(warm, "warm:1", "What is k? (warm-up)")
    base = settled_rss()
    handles = [h for h in [await harness.conversation(i) for i in ids] if h is not None]
    opened = settled_rss()
    gate = asyncio.Semaphore(100)  # the turn benchmark's concurrency

    async def one(n: int) -> None:
        async with gate:
            await _script.turn(handles[n], f"idle:{n}", "What is k? (then idle)")

    await asyncio.gather(*(one(n) for n in range(len(handles))))
    await harness.wait_for_idle()
    after_turns = settled_rss()
    live = len(harness.session.published.live_tasks)
    await harness.close()
    return {
        "base": base,
        "opened": opened,
        "after_turns": after_turns,
        "handles": len(handles),
        "live_tasks": live,
    }


async def run(options: Options) -> Report:
    conversations = options.size(10_000, 2_000, 50)
    report = Report(
        NAME,
        TITLE,
        f"A fresh process opens a store of {conversations:,} conversations (one scripted turn of history each), "
        "runs one warm-up turn and takes the baseline RSS (after gc). `open`: it then holds a "
        f"ConversationHandle to each of the {conversations:,} conversations; `after a turn`: each of them runs "
        "one scripted turn (100 at a time) and goes idle. Figure = RSS growth over the baseline / conversations.",
    )
    pristine, info = await _bulk.cached_store(
        options.cache("stores"), f"idle-{conversations}", [_bulk.Plan(turns=1)] * conversations
    )
    scratch = options.scratch(NAME)
    try:
        path = scratch / "store.sqlite"
        copy_store(pristine, path)
        result = await run_child(
            "idle_memory", "measure", {"path": str(path), "conversations": info["conversation_ids"]}
        )
    finally:
        cleanup(scratch)
    count = result["handles"]
    report.add("baseline RSS (harness open, warmed)", result["base"] / 2**20, "MiB")
    report.add("per conversation, open (handle held)", (result["opened"] - result["base"]) / count, "bytes")
    per_idle = report.add(
        "per conversation, idle after a turn", (result["after_turns"] - result["base"]) / count, "bytes"
    )
    report.add("RSS with all conversations idle", result["after_turns"] / 2**20, "MiB")
    report.add("live tasks left", result["live_tasks"], "tasks")
    report.goal("under 10 KB per idle conversation", per_idle < GOAL_BYTES, f"{per_idle:,.0f} bytes")
    return report
