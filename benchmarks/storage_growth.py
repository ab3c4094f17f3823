"""Issue 8.2: storage growth. Bytes on disk per turn after 5, 25 and 100 turns per conversation, ours vs
LangGraph (whose checkpoints copy the whole message history). Goal: flat, at most 4 KB per turn."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from benchmarks import _langgraph, _script
from benchmarks._env import Options, cleanup, file_bytes
from benchmarks._report import Report

NAME = "storage_growth"
TITLE = "storage bytes per turn (issue 8.2)"
GOAL_BYTES = 4096


def table_bytes(path: Path) -> dict[str, int]:
    """Pages per table and index (SQLite's dbstat), for where-the-bytes-go notes."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC").fetchall()
    return {str(name): int(size) for name, size in rows}


async def ours(
    options: Options, conversations: int, marks: list[int]
) -> tuple[dict[int, int], dict[str, int]]:
    """Store size (closed, WAL checkpointed) at each mark of turns per conversation; mark 0 = conversations
    created, no turn yet; mark -1 = the empty store (schema only)."""
    scratch = options.scratch(NAME)
    try:
        path = scratch / "ours.sqlite"
        await (await _script.open_harness(path, options.durability)).close()
        sizes: dict[int, int] = {-1: file_bytes(path)}
        harness = await _script.open_harness(path, options.durability)
        ids = [(await harness.create_conversation(agent=_script.AGENT)).id for _ in range(conversations)]
        done = 0
        for mark in [0, *marks]:
            if mark > done:
                harness = await _script.open_harness(path, options.durability)
                handles = [h for h in [await harness.conversation(i) for i in ids] if h is not None]
                await _script.run_turns(handles, mark - done, start=done)
                done = mark
            await harness.close()  # checkpoints the WAL into the file
            sizes[mark] = file_bytes(path)
        return sizes, table_bytes(path)
    finally:
        cleanup(scratch)


async def langgraph(options: Options, conversations: int, marks: list[int]) -> dict[int, int]:
    scratch = options.scratch(NAME)
    try:
        path = scratch / "langgraph.sqlite"
        threads = [f"conversation-{n}" for n in range(conversations)]
        async with _langgraph.open_app(path, options.durability):
            pass
        await _langgraph.checkpoint_wal(path)
        sizes: dict[int, int] = {-1: file_bytes(path)}
        done = 0
        for mark in [0, *marks]:
            async with _langgraph.open_app(path, options.durability) as app:
                await _langgraph.run_turns(app, threads, mark - done, start=done)
            done = mark
            await _langgraph.checkpoint_wal(path)
            sizes[mark] = file_bytes(path)
        return sizes
    finally:
        cleanup(scratch)


async def run(options: Options) -> Report:
    conversations = options.size(20, 10, 2)
    marks = [5, 25, 100] if not (options.quick or options.tiny) else [5, 25] if options.quick else [2, 4]
    report = Report(
        NAME,
        TITLE,
        f"Measured: the SQLite file (closed, WAL checkpointed) after {', '.join(map(str, marks))} scripted turns "
        f"in each of {conversations} conversations; bytes per turn = (file size - empty store's size) / "
        "(conversations x turns), so per-conversation bytes (documents) are included, the schema's pages are "
        "not. Marginal = growth between two marks / turns added. Same script and conversation count for "
        "LangGraph (AsyncSqliteSaver).",
    )
    ours_sizes, tables = await ours(options, conversations, marks)
    anchor_sizes = await langgraph(options, conversations, marks)
    previous = 0
    ours_marginals: list[float] = []
    for mark in marks:
        turns = conversations * mark
        mine = report.add(
            f"ours after {mark} turns/conversation", (ours_sizes[mark] - ours_sizes[-1]) / turns, "bytes/turn"
        )
        theirs = report.add(
            f"LangGraph after {mark} turns/conversation",
            (anchor_sizes[mark] - anchor_sizes[-1]) / turns,
            "bytes/turn",
        )
        report.ratio(f"  LangGraph / ours at {mark}", theirs, mine)
        added = conversations * (mark - previous)
        marginal = report.add(
            f"  ours marginal {previous}->{mark}",
            (ours_sizes[mark] - ours_sizes[previous]) / added,
            "bytes/turn",
        )
        report.add(
            f"  LangGraph marginal {previous}->{mark}",
            (anchor_sizes[mark] - anchor_sizes[previous]) / added,
            "bytes/turn",
        )
        ours_marginals.append(marginal)
        previous = mark
    worst = max((ours_sizes[m] - ours_sizes[-1]) / (conversations * m) for m in marks)
    report.goal("at most 4 KB per turn at every mark", worst <= GOAL_BYTES, f"worst {worst:,.0f} bytes/turn")
    flat = ours_marginals[-1] <= 1.25 * ours_marginals[1] if len(ours_marginals) > 2 else None
    report.goal(
        "flat (late marginal bytes/turn within 1.25x of the early one)",
        flat,
        " -> ".join(f"{m:,.0f}" for m in ours_marginals),
    )
    top = ", ".join(f"{name} {size / 1024:,.0f} KiB" for name, size in list(tables.items())[:6])
    report.note(f"ours at {marks[-1]} turns, pages by table/index: {top}")
    return report
