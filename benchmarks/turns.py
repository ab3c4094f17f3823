"""Issue 8.1: turn throughput. The scripted turn (user message -> tool call -> tool result -> answer) over
100 conversations x 10 turns on SQLite files, ours vs LangGraph + AsyncSqliteSaver, plus the raw aiosqlite
commit rate on the same disk. Goal: at least 10x LangGraph's turns/s."""

from __future__ import annotations

import time

from benchmarks import _langgraph, _script
from benchmarks._env import Options, cleanup
from benchmarks._raw import raw_commit_rate
from benchmarks._report import Report

NAME = "turns"
TITLE = "turn throughput vs LangGraph (issue 8.1)"


async def ours(options: Options, conversations: int, turns: int) -> dict[str, float]:
    scratch = options.scratch(NAME)
    try:
        harness = await _script.open_harness(scratch / "ours.sqlite", options.durability)
        handles = [await harness.create_conversation(agent=_script.AGENT) for _ in range(conversations)]
        counter = _script.CommitCounter.attach(harness)
        started, cpu = time.perf_counter(), time.process_time()
        await _script.run_turns(handles, turns)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        await harness.close()
        total = conversations * turns
        return {
            "turns_per_s": total / elapsed,
            "cpu_ms_per_turn": cpu * 1000 / total,
            "commits_per_turn": counter.batches / total,
            "transactions_per_turn": counter.transactions / total,
        }
    finally:
        cleanup(scratch)


async def langgraph(options: Options, conversations: int, turns: int) -> dict[str, float]:
    scratch = options.scratch(NAME)
    try:
        path = scratch / "langgraph.sqlite"
        async with _langgraph.open_app(path, options.durability) as app:
            threads = [f"conversation-{n}" for n in range(conversations)]
            started, cpu = time.perf_counter(), time.process_time()
            await _langgraph.run_turns(app, threads, turns)
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        rows = await _langgraph.row_counts(path)
        total = conversations * turns
        return {
            "turns_per_s": total / elapsed,
            "cpu_ms_per_turn": cpu * 1000 / total,
            "checkpoints_per_turn": rows["checkpoints"] / total,
            "writes_per_turn": rows["writes"] / total,
        }
    finally:
        cleanup(scratch)


async def alternate(
    options: Options, conversations: int, turns: int, rounds: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Best round of each side, rounds alternating (other load on the machine hits both alike)."""
    best: tuple[dict[str, float], dict[str, float]] = ({"turns_per_s": 0.0}, {"turns_per_s": 0.0})
    for _ in range(rounds):
        found = (await ours(options, conversations, turns), await langgraph(options, conversations, turns))
        best = (
            max(best[0], found[0], key=lambda r: r["turns_per_s"]),
            max(best[1], found[1], key=lambda r: r["turns_per_s"]),
        )
    return best


async def run(options: Options) -> Report:
    conversations = options.size(100, 50, 2)
    turns = options.size(10, 5, 2)
    rounds = options.size(3, 1, 1)
    report = Report(
        NAME,
        TITLE,
        f"Timed: {conversations} conversations x {turns} turns, every conversation running its turns one after "
        f"another and all {conversations} conversations at once (concurrency {conversations}, both sides), "
        "from the first submit to the last answer; setup (store, conversations, graph) untimed. Ours: "
        "`submit(Input)` + `wait()` per turn on a fresh SQLite file, faux provider, one tool. LangGraph: "
        "`ainvoke` per turn on agent -> ToolNode -> agent with AsyncSqliteSaver on a fresh SQLite file, a "
        f"fake chat model with the same messages. Rounds alternate ours/LangGraph; best of {rounds} each. "
        "CPU per turn = process time (all threads) / turns, from the same round.",
    )
    ours_best, anchor_best = await alternate(options, conversations, turns, rounds)
    scratch = options.scratch(NAME)
    try:
        raw = await raw_commit_rate(
            scratch / "raw.sqlite",
            options.size(5_000, 2_000, 100),
            row_bytes=500,
            durability=options.durability,
        )
    finally:
        cleanup(scratch)
    rate = report.add("ours", ours_best["turns_per_s"], "turns/s")
    anchor_rate = report.add("LangGraph + AsyncSqliteSaver", anchor_best["turns_per_s"], "turns/s")
    ratio = report.ratio("ours / LangGraph", rate, anchor_rate)
    mine = report.add("ours: CPU per turn", ours_best["cpu_ms_per_turn"], "ms", "process time, all threads")
    theirs = report.add("LangGraph: CPU per turn", anchor_best["cpu_ms_per_turn"], "ms")
    report.ratio("LangGraph CPU / ours CPU per turn", theirs, mine, "less sensitive to other load")
    per_turn = report.add("ours: commits per turn", ours_best["commits_per_turn"], "commits")
    report.add(
        "ours: SQLite transactions per turn",
        ours_best["transactions_per_turn"],
        "transactions",
        "group commit",
    )
    report.add("ours: commit rate", rate * per_turn, "commits/s")
    report.add("raw aiosqlite insert+commit (physical limit)", raw, "commits/s")
    report.add(
        "ceiling at one transaction per commit", raw / per_turn, "turns/s", "raw rate / commits per turn"
    )
    report.add("LangGraph: checkpoint rows per turn", anchor_best["checkpoints_per_turn"], "rows")
    report.add("LangGraph: write rows per turn", anchor_best["writes_per_turn"], "rows")
    # One conversation alone: the latency of a turn, not throughput.
    serial_turns = options.size(20, 10, 2)
    serial, serial_anchor = await alternate(options, 1, serial_turns, rounds)
    report.add(f"ours, 1 conversation x {serial_turns} turns", 1000 / serial["turns_per_s"], "ms/turn")
    report.add(
        f"LangGraph, 1 conversation x {serial_turns} turns", 1000 / serial_anchor["turns_per_s"], "ms/turn"
    )
    report.goal(">= 10x LangGraph turns/s", ratio >= 10, f"{ratio:.2f}x")
    report.note(
        f"durability {options.durability} on both sides (LangGraph's connection set to the same level)"
    )
    return report
