"""Issue 8.4: recovery. A store with 10,000 conversations and 1,000,000 entries whose process was SIGKILLed
with runs in flight: time from process start to the first answer after `resume()`, and peak RSS. Goal: under
1 s and under 300 MB, independent of history size (compared with a 100-conversation store)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from benchmarks import _bulk
from benchmarks._env import Options, cleanup, copy_store, median, run_child
from benchmarks._report import Report

NAME = "recovery"
TITLE = "recovery after a crash (issue 8.4)"
TURNS = 25  # 5 + 24 x 4 = 101 entries per conversation
INTERRUPTED = 10


async def crash(args: dict[str, Any]) -> dict[str, Any]:
    """Child: submit inputs to some conversations, wait until their model requests are in flight, SIGKILL."""
    from benchmarks import _script
    from harness_core import Harness, Input, Models
    from harness_core.models.faux import FauxProvider
    from harness_core.storage import SqliteStorage

    hanging = FauxProvider(delay_ms=10**9)  # the stream never produces: requests stay in flight
    in_flight = asyncio.Event()
    count = len(args["conversations"])

    def respond(request: Any) -> Any:  # called when a request starts streaming
        if len(hanging.requests) >= count:
            in_flight.set()
        return _script.respond(request)

    hanging.set_responder(respond)
    storage = await SqliteStorage.open(Path(args["path"]))
    harness = await Harness.open(storage, models=Models(hanging), registry=_script.registry())
    submissions = []
    for conversation_id in args["conversations"]:
        handle = await harness.conversation(conversation_id)
        assert handle is not None
        submissions.append(
            (await handle.submit(Input("What is k? (crash)", request_id=f"crash:{conversation_id}"))).id
        )
    await in_flight.wait()
    print(f'{{"submissions": {submissions}}}', flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


async def recover(args: dict[str, Any]) -> dict[str, Any]:
    """Child, timed from its spawn: open the crashed store, resume, wait for the interrupted runs' answers."""

    from benchmarks import _script
    from benchmarks._env import peak_rss_bytes, rss_bytes

    spawned = float(args["spawned_at"])
    imported = time.time()
    harness = await _script.open_harness(Path(args["path"]))
    opened = time.time()
    harness.resume()
    waits = [asyncio.ensure_future(harness.wait_submission(s)) for s in args["submissions"]]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    first = time.time()
    settled = await asyncio.gather(*waits)
    last = time.time()
    statuses = sorted({s.status for s in settled})
    # A fresh message to an old, idle conversation after recovery.
    handle = await harness.conversation(int(args["fresh"]))
    assert handle is not None
    started = time.perf_counter()
    await _script.turn(handle, "fresh:1", "What is k? (after recovery)")
    fresh = time.perf_counter() - started
    result = {
        "import_s": imported - spawned,
        "open_s": opened - imported,
        "first_answer_s": first - spawned,
        "all_answers_s": last - spawned,
        "fresh_turn_s": fresh,
        "statuses": statuses,
        "peak_rss": peak_rss_bytes(),
        "rss": rss_bytes(),
    }
    await harness.close()
    return result


async def measure(options: Options, pristine: Path, info: dict[str, Any], repeats: int) -> dict[str, float]:
    ids: list[int] = info["conversation_ids"]
    interrupted = ids[-min(INTERRUPTED, len(ids) // 2) :]
    runs = []
    for _ in range(repeats):
        scratch = options.scratch(NAME)
        try:
            path = scratch / "store.sqlite"
            copy_store(pristine, path)
            crashed = await run_child("recovery", "crash", {"path": str(path), "conversations": interrupted})
            if crashed["returncode"] != -signal.SIGKILL:
                raise RuntimeError(f"the crash child was not killed: {crashed}")
            result = await run_child(
                "recovery",
                "recover",
                {"path": str(path), "submissions": crashed["submissions"], "fresh": ids[0]},
            )
            if result["statuses"] != ["done"]:
                raise RuntimeError(f"interrupted runs did not all answer: {result}")
            runs.append(result)
        finally:
            cleanup(scratch)
    keys = ("import_s", "open_s", "first_answer_s", "all_answers_s", "fresh_turn_s", "peak_rss", "rss")
    return {k: median([float(r[k]) for r in runs]) for k in keys}


async def run(options: Options) -> Report:
    big_conversations = options.size(10_000, 1_000, 20)
    small_conversations = options.size(100, 100, 5)
    turns = options.size(TURNS, TURNS, 3)
    repeats = options.size(3, 2, 1)
    report = Report(
        NAME,
        TITLE,
        "Store: N conversations x 25 scripted turns (101 entries, 1 submission and 3 terminal tasks per turn), "
        f"bulk-built from a real sample (see _bulk.py). A child process submits to {INTERRUPTED} conversations, "
        "waits until their model requests are in flight and SIGKILLs itself. Timed: a fresh `python -m "
        "benchmarks._child` process from spawn (interpreter start and imports included) through "
        "SqliteStorage.open + Harness.open + resume() to the first answer of an interrupted run; peak RSS "
        f"(VmHWM) of that process at the end. Median of {repeats} crash/recover rounds per store.",
    )
    stores = {}
    for conversations in (small_conversations, big_conversations):
        plans = [_bulk.Plan(turns=turns)] * conversations
        started = time.perf_counter()
        pristine, info = await _bulk.cached_store(
            options.cache("stores"), f"recovery-{conversations}x{turns}", plans
        )
        report.note(
            f"store {conversations} conversations: {info['entries']:,} entries, {info['tasks']:,} tasks, "
            f"{pristine.stat().st_size / 2**20:,.0f} MiB (ready in {time.perf_counter() - started:.1f} s, "
            f"built in {info['seconds']:.1f} s)"
        )
        stores[conversations] = (pristine, info)
    figures = {n: await measure(options, *stores[n], repeats) for n in stores}
    big, small = figures[big_conversations], figures[small_conversations]
    big_entries = stores[big_conversations][1]["entries"]
    label = f"{big_conversations:,} conversations / {big_entries:,} entries"
    report.add(f"{label}: start -> first answer", big["first_answer_s"] * 1000, "ms")
    report.add("  of which interpreter start + imports", big["import_s"] * 1000, "ms")
    report.add("  of which SqliteStorage.open + Harness.open", big["open_s"] * 1000, "ms")
    report.add("  start -> all interrupted runs answered", big["all_answers_s"] * 1000, "ms")
    report.add("  a fresh turn on an old conversation after", big["fresh_turn_s"] * 1000, "ms")
    report.add("  peak RSS", big["peak_rss"] / 2**20, "MiB")
    report.add(
        f"{small_conversations} conversations: start -> first answer", small["first_answer_s"] * 1000, "ms"
    )
    report.add("  peak RSS", small["peak_rss"] / 2**20, "MiB")
    time_ratio = report.ratio(
        "big / small store: time to first answer", big["first_answer_s"], small["first_answer_s"]
    )
    rss_ratio = report.ratio("big / small store: peak RSS", big["peak_rss"], small["peak_rss"])
    report.goal(
        "first answer under 1 s", big["first_answer_s"] < 1.0, f"{big['first_answer_s'] * 1000:,.0f} ms"
    )
    report.goal("peak RSS under 300 MB", big["peak_rss"] < 300e6, f"{big['peak_rss'] / 1e6:,.0f} MB")
    report.goal(
        "independent of history size (big/small within 1.25x)",
        time_ratio <= 1.25 and rss_ratio <= 1.25,
        f"time {time_ratio:.2f}x, RSS {rss_ratio:.2f}x",
    )
    return report
