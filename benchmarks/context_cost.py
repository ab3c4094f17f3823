"""Issue 8.5: context cost. Request preparation in a conversation with 100 entries vs one with 100,000 entries
(compacted every 1,000 entries, the last compaction leaving the same ~100-entry active context). Goal: within
1.5x: the cost follows the active context, not the history."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks import _bulk, _script
from benchmarks._env import Options, cleanup, copy_store, median, percentile
from benchmarks._report import Report
from harness_core import ConversationHandle, ProviderDoc, replay_system
from harness_core.context import provider_messages
from harness_core.models import ModelRequest

NAME = "context_cost"
TITLE = "context cost vs history size (issue 8.5)"


async def prepare_request(handle: ConversationHandle) -> ModelRequest:
    """The reads the generation's request phase does before calling the model, through the public API."""
    view = await handle.context()
    prompt = replay_system(view.messages)
    await handle.agent()
    provider = await handle.snapshot(ProviderDoc) or {}
    return ModelRequest(
        system_prompt=prompt.system_prompt(),
        messages=provider_messages(view.messages),
        tools=prompt.tools,
        session_id=provider.get("session_id"),
    )


async def timed(action: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await action()
    return time.perf_counter() - started


async def run(options: Options) -> Report:
    big_turns = options.size(25_000, 2_500, 100)
    repeats = options.size(200, 50, 5)
    turn_repeats = options.size(20, 10, 2)
    small = _bulk.Plan(turns=25)
    every = 250 if big_turns > 1000 else 25
    big = _bulk.Plan(turns=big_turns, compact_every=every, keep_turns=5, tail_turns=20)
    report = Report(
        NAME,
        TITLE,
        "Store: conversation S (25 scripted turns, 101 entries, no compaction) and conversation L (the same "
        f"turns x {big_turns:,}, a compaction marker every {every} turns keeping 5 turns, the last one followed by 20 "
        "turns: ~102 active entries), bulk-built in one file. Timed, alternating S and L: `prepare` = what the "
        "request phase reads before calling the model (context(), replay_system, provider_messages, agent(), "
        f"provider document, ModelRequest), median of {repeats}; `cold` = the first prepare after opening the "
        f"harness; `turn` = a whole scripted turn (submit -> answer, 2 model calls), median of {turn_repeats}.",
    )
    pristine, info = await _bulk.cached_store(options.cache("stores"), f"context-{big_turns}", [small, big])
    small_id, big_id = info["conversation_ids"]
    scratch = options.scratch(NAME)
    try:
        path = scratch / "store.sqlite"
        copy_store(pristine, path)
        harness = await _script.open_harness(path, options.durability)
        handles = {}
        for label, conversation_id in (("S", small_id), ("L", big_id)):
            handle = await harness.conversation(conversation_id)
            assert handle is not None
            handles[label] = handle
        cold = {label: await timed(functools.partial(prepare_request, h)) for label, h in handles.items()}
        sizes = {label: len((await h.context()).entries) for label, h in handles.items()}
        prepare: dict[str, list[float]] = {"S": [], "L": []}
        for _ in range(repeats):
            for label, handle in handles.items():
                prepare[label].append(await timed(functools.partial(prepare_request, handle)))
        turns: dict[str, list[float]] = {"S": [], "L": []}
        for n in range(turn_repeats):
            for label, handle in handles.items():
                turns[label].append(
                    await timed(functools.partial(_script.turn, handle, f"ctx:{n}", f"What is k? ({n})"))
                )
        await harness.close()
    finally:
        cleanup(scratch)
    entries = {"S": 101, "L": info["entries"] - 101}
    for label in ("S", "L"):
        name = f"{label} ({entries[label]:,} entries, {sizes[label]} active)"
        report.add(f"{name}: prepare, median", median(prepare[label]) * 1e6, "us")
        report.add(f"{name}: prepare, p90", percentile(prepare[label], 90) * 1e6, "us")
        report.add(f"{name}: prepare, cold", cold[label] * 1e6, "us")
        report.add(f"{name}: turn, median", median(turns[label]) * 1e3, "ms")
    ratio = report.ratio("L / S: prepare (median)", median(prepare["L"]), median(prepare["S"]))
    report.ratio("L / S: prepare (cold)", cold["L"], cold["S"])
    turn_ratio = report.ratio("L / S: turn (median)", median(turns["L"]), median(turns["S"]))
    report.goal("request preparation within 1.5x", ratio <= 1.5, f"{ratio:.2f}x (turn {turn_ratio:.2f}x)")
    return report
