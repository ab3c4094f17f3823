"""Issue 2: commits/s of a small commit (one entry + one document change) on SQLite, against raw aiosqlite
insert+commit in the same run. Target: at least half the raw rate."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from benchmarks._env import Options, cleanup
from benchmarks._raw import raw_commit_rate
from benchmarks._report import Report
from benchmarks._script import CommitCounter
from harness_core import EntryDraft, Harness, Tx, define_doc
from harness_core.storage import SqliteStorage

NAME = "commit_rate"
TITLE = "small commit rate (issue 2)"
COUNTER = define_doc("bench.counter", initial=lambda: {"n": 0})
NOTE = "a note written by the commit-rate benchmark, about the size of a short chat message"


def small_commit(conversation_id: int, n: int) -> Any:
    async def commit(tx: Tx) -> None:
        tx.append_entry(conversation_id, EntryDraft(kind="bench.note", data={"n": n, "text": NOTE}))
        draft = await tx.doc(COUNTER, conversation_id)
        draft.value["n"] = n

    return commit


async def _ours(options: Options, count: int, concurrency: int) -> tuple[float, float]:
    """(commits/s, commits per SQLite transaction) with `concurrency` writers, each on its own conversation."""
    scratch = options.scratch(NAME)
    try:
        harness = await Harness.open(
            await SqliteStorage.open(scratch / "ours.sqlite", durability=options.durability)
        )
        conversations = [(await harness.create_conversation()).id for _ in range(concurrency)]
        for conversation_id in conversations:  # warm: creates the document, fills caches
            await harness.commit(small_commit(conversation_id, 0))
        counter = CommitCounter.attach(harness)
        per_writer = max(1, count // concurrency)

        async def writer(conversation_id: int) -> None:
            for n in range(1, per_writer + 1):
                await harness.commit(small_commit(conversation_id, n))

        started = time.perf_counter()
        await asyncio.gather(*(writer(c) for c in conversations))
        elapsed = time.perf_counter() - started
        await harness.close()
        return per_writer * concurrency / elapsed, counter.batches / max(1, counter.transactions)
    finally:
        cleanup(scratch)


def _entry_bytes() -> int:
    from harness_core import Entry

    entry = Entry(id=123456, conversation_id=42, kind="bench.note", data={"n": 1234, "text": NOTE}, seq=99999)
    return len(entry.model_dump_json())


async def run(options: Options) -> Report:
    count = options.size(5_000, 2_000, 100)
    rounds = options.size(3, 2, 1)
    report = Report(
        NAME,
        TITLE,
        "Timed: N awaited `harness.commit()` calls, each appending one entry and changing one document "
        "(`bench.counter`), on a SQLite file; sequential (one commit in flight) and with 100 concurrent "
        "writers (group commit). Anchor: N sequential aiosqlite `INSERT` + `commit()` of a row the size of "
        "the entry's JSON, same disk, WAL, same synchronous level. Rounds alternate anchor/ours; best of "
        f"{rounds} each (the least disturbed by other load on the machine).",
    )
    raw = sequential = concurrent = 0.0
    group = 0.0
    for _ in range(rounds):
        scratch = options.scratch(NAME)
        try:
            raw = max(
                raw,
                await raw_commit_rate(
                    scratch / "raw.sqlite", count, row_bytes=_entry_bytes(), durability=options.durability
                ),
            )
        finally:
            cleanup(scratch)
        sequential = max(sequential, (await _ours(options, count, 1))[0])
        rate, per_transaction = await _ours(options, count * 2, 100)
        if rate > concurrent:
            concurrent, group = rate, per_transaction
    report.add("ours, sequential", sequential, "commits/s")
    report.add(
        "ours, 100 concurrent writers", concurrent, "commits/s", f"{group:.1f} commits per transaction"
    )
    report.add("raw aiosqlite insert+commit", raw, "commits/s")
    seq_ratio = report.ratio("ours sequential / raw", sequential, raw)
    conc_ratio = report.ratio("ours concurrent / raw", concurrent, raw)
    report.goal("sequential >= 0.5x raw", seq_ratio >= 0.5, f"{seq_ratio:.2f}x")
    report.goal("concurrent >= 0.5x raw", conc_ratio >= 0.5, f"{conc_ratio:.2f}x")
    report.note(f"N = {count} sequential, {count * 2} concurrent; durability {options.durability}")
    return report
