"""Issue 15: the PostgreSQL store. On one server, in one run: turn throughput ours vs LangGraph +
`langgraph-checkpoint-postgres` (goal >= 5x), a small commit vs raw asyncpg insert+commit (goal >= 0.5x),
storage per turn (goal <= 4 KB, flat), and how entry bodies store as `bytea` vs `jsonb` (the measurement
behind the schema's choice).

The server: `DURABLE_BOTS_BENCH_DATABASE_URL` (a superuser URL), else a throwaway cluster with PostgreSQL's
default durability (fsync and synchronous commits on), started and stopped here. Every measurement gets a
fresh database on it.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from benchmarks import _script
from benchmarks._env import Options
from benchmarks._report import Report
from benchmarks.commit_rate import small_commit
from harness_core import Harness, Models
from harness_core.storage import PostgresStorage
from harness_core.testing import start_cluster

NAME = "postgres"
TITLE = (
    "PostgreSQL store: turns vs LangGraph postgres, small commit vs raw asyncpg, bytes per turn (issue 15)"
)
ENV_URL = "DURABLE_BOTS_BENCH_DATABASE_URL"
GOAL_BYTES = 4096
TABLES = ("conversations", "entries", "tasks", "submissions", "doc_records", "doc_contents")


@asynccontextmanager
async def server() -> AsyncIterator[str]:
    if os.environ.get(ENV_URL):
        yield os.environ[ENV_URL]
        return
    cluster = await asyncio.to_thread(start_cluster, durable=True)
    try:
        yield cluster.url
    finally:
        await asyncio.to_thread(cluster.stop)


@asynccontextmanager
async def database(admin_url: str) -> AsyncIterator[str]:
    name = "bench_" + uuid.uuid4().hex[:12]
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield urlunsplit(urlsplit(admin_url)._replace(path="/" + name))
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def open_harness(url: str) -> Harness:
    storage = await PostgresStorage.open(url)
    return await Harness.open(storage, models=Models(_script.scripted_faux()), registry=_script.registry())


async def ours_turns(admin_url: str, conversations: int, turns: int) -> dict[str, float]:
    async with database(admin_url) as url:
        harness = await open_harness(url)
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


async def langgraph_turns(admin_url: str, conversations: int, turns: int) -> dict[str, float]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    from benchmarks import _langgraph

    async with database(admin_url) as url, AsyncPostgresSaver.from_conn_string(url) as saver:
        await saver.setup()
        app = _langgraph.build_graph().compile(checkpointer=saver)
        threads = [f"conversation-{n}" for n in range(conversations)]
        started, cpu = time.perf_counter(), time.process_time()
        await _langgraph.run_turns(app, threads, turns)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        total = conversations * turns
        return {"turns_per_s": total / elapsed, "cpu_ms_per_turn": cpu * 1000 / total}


async def small_commits(admin_url: str, count: int) -> float:
    """Our sequential small commit (one entry + one document change) on PostgreSQL, commits/s."""
    async with database(admin_url) as url:
        harness = await Harness.open(await PostgresStorage.open(url))
        conversation_id = (await harness.create_conversation()).id
        await harness.commit(small_commit(conversation_id, 0))
        started = time.perf_counter()
        for n in range(1, count + 1):
            await harness.commit(small_commit(conversation_id, n))
        elapsed = time.perf_counter() - started
        await harness.close()
        return count / elapsed


async def raw_commits(admin_url: str, count: int, row_bytes: int = 500) -> float:
    """Raw asyncpg: one INSERT in its own transaction, sequentially, commits/s."""
    async with database(admin_url) as url:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "CREATE TABLE rows (id BIGSERIAL PRIMARY KEY, conversation_id BIGINT, record BYTEA)"
            )
            payload = b"x" * row_bytes
            insert = "INSERT INTO rows (conversation_id, record) VALUES ($1, $2)"
            for _ in range(min(200, count)):
                async with conn.transaction():
                    await conn.execute(insert, 1, payload)
            started = time.perf_counter()
            for _ in range(count):
                async with conn.transaction():
                    await conn.execute(insert, 1, payload)
            return count / (time.perf_counter() - started)
        finally:
            await conn.close()


async def bytes_per_turn(admin_url: str, conversations: int, marks: list[int]) -> dict[int, float]:
    """Bytes of every harness row (pg_column_size of the whole row, TOAST compression included) per turn, at
    each mark of turns per conversation, minus the rows of the conversations themselves before any turn."""
    async with database(admin_url) as url:
        harness = await open_harness(url)
        handles = [await harness.create_conversation(agent=_script.AGENT) for _ in range(conversations)]
        await harness.close()
        conn = await asyncpg.connect(url)
        try:

            async def row_bytes() -> int:
                total = 0
                for table in TABLES:
                    total += int(
                        await conn.fetchval(f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t")
                    )
                return total

            base = await row_bytes()
            found: dict[int, float] = {}
            done = 0
            for mark in marks:
                harness = await open_harness(url)
                handles = [h for h in [await harness.conversation(x.id) for x in handles] if h is not None]
                await _script.run_turns(handles, mark - done, start=done)
                await harness.close()
                done = mark
                found[mark] = (await row_bytes() - base) / (conversations * mark)
            return found
        finally:
            await conn.close()


async def body_formats(admin_url: str, conversations: int, turns: int) -> dict[str, float]:
    """The real entry records of a store inserted again into a bytea and a jsonb table: rows/s and bytes."""
    async with database(admin_url) as url:
        harness = await open_harness(url)
        handles = [await harness.create_conversation(agent=_script.AGENT) for _ in range(conversations)]
        await _script.run_turns(handles, turns)
        await harness.close()
        conn = await asyncpg.connect(url)
        try:
            records: list[bytes] = [r[0] for r in await conn.fetch("SELECT record FROM entries")]
            await conn.execute("CREATE TABLE as_bytea (id BIGSERIAL PRIMARY KEY, record BYTEA NOT NULL)")
            await conn.execute("CREATE TABLE as_jsonb (id BIGSERIAL PRIMARY KEY, record JSONB NOT NULL)")
            texts = [r.decode() for r in records]
            result: dict[str, float] = {
                "records": len(records),
                "mean_json_bytes": sum(map(len, records)) / len(records),
            }
            for table, values in (("as_bytea", records), ("as_jsonb", texts)):
                rounds: list[float] = []
                for _ in range(3):
                    await conn.execute(f"TRUNCATE {table}")
                    started = time.perf_counter()
                    for value in values:  # one row per transaction, like a commit
                        await conn.execute(f"INSERT INTO {table} (record) VALUES ($1)", value)
                    rounds.append(len(values) / (time.perf_counter() - started))
                result[f"{table}_rows_per_s"] = max(rounds)
                result[f"{table}_bytes_per_row"] = float(
                    await conn.fetchval(f"SELECT avg(pg_column_size(record)) FROM {table}")
                )
            return result
        finally:
            await conn.close()


async def run(options: Options) -> Report:
    conversations = options.size(100, 50, 2)
    turns = options.size(10, 5, 2)
    rounds = options.size(3, 1, 1)
    commits = options.size(2_000, 1_000, 50)
    marks = [5, 25, 100] if not (options.quick or options.tiny) else ([5, 25] if options.quick else [2, 4])
    report = Report(
        NAME,
        TITLE,
        f"One PostgreSQL server (${ENV_URL}, else a throwaway cluster with fsync and synchronous commits on). "
        f"Turns: {conversations} conversations x {turns} scripted turns at once (the `turns` benchmark's "
        "script), ours on PostgresStorage vs LangGraph's tool graph on AsyncPostgresSaver, each on a fresh "
        f"database, rounds alternating, best of {rounds}. Small commit: our sequential one-entry + "
        "one-document commit vs raw asyncpg INSERT in its own transaction (500-byte row). Bytes per turn: "
        "pg_column_size of every harness row, per turn, at several turns per conversation. Body format: the "
        "store's own entry records inserted one per transaction into a bytea and a jsonb table.",
    )
    async with server() as admin_url:
        best: tuple[dict[str, float], dict[str, float]] = ({"turns_per_s": 0.0}, {"turns_per_s": 0.0})
        for _ in range(rounds):
            found = (
                await ours_turns(admin_url, conversations, turns),
                await langgraph_turns(admin_url, conversations, turns),
            )
            best = (
                max(best[0], found[0], key=lambda r: r["turns_per_s"]),
                max(best[1], found[1], key=lambda r: r["turns_per_s"]),
            )
        ours_commit = max([await small_commits(admin_url, commits) for _ in range(rounds)])
        raw_commit = max([await raw_commits(admin_url, commits) for _ in range(rounds)])
        growth = await bytes_per_turn(admin_url, options.size(10, 5, 2), marks)
        formats = await body_formats(admin_url, options.size(20, 10, 2), options.size(10, 5, 2))

    rate = report.add("ours on PostgreSQL", best[0]["turns_per_s"], "turns/s")
    anchor = report.add("LangGraph + AsyncPostgresSaver", best[1]["turns_per_s"], "turns/s")
    ratio = report.ratio("ours / LangGraph", rate, anchor)
    mine = report.add("ours: CPU per turn", best[0]["cpu_ms_per_turn"], "ms", "process time, all threads")
    theirs = report.add("LangGraph: CPU per turn", best[1]["cpu_ms_per_turn"], "ms")
    report.ratio("LangGraph CPU / ours CPU per turn", theirs, mine)
    report.add("ours: commits per turn", best[0]["commits_per_turn"], "commits")
    report.add(
        "ours: transactions per turn", best[0]["transactions_per_turn"], "transactions", "group commit"
    )
    ours_c = report.add("ours: small commit, sequential", ours_commit, "commits/s")
    raw_c = report.add("raw asyncpg insert+commit", raw_commit, "commits/s")
    commit_ratio = report.ratio("ours / raw", ours_c, raw_c)
    for mark, size in growth.items():
        report.add(f"bytes per turn at {mark} turns/conversation", size, "B")
    report.add(
        "entry records measured", formats["records"], "rows", f"mean JSON {formats['mean_json_bytes']:.0f} B"
    )
    for kind in ("bytea", "jsonb"):
        report.add(f"{kind}: insert rate", formats[f"as_{kind}_rows_per_s"], "rows/s", "one per transaction")
        report.add(f"{kind}: stored bytes per record", formats[f"as_{kind}_bytes_per_row"], "B")
    report.goal(">= 5x LangGraph turns/s on the same server", ratio >= 5, f"{ratio:.2f}x")
    report.goal(">= 0.5x raw asyncpg insert+commit", commit_ratio >= 0.5, f"{commit_ratio:.2f}x")
    sizes = list(growth.values())
    flat = max(sizes) <= GOAL_BYTES and max(sizes) <= 1.25 * min(sizes)
    report.goal("<= 4 KB per turn, flat", flat, " / ".join(f"{s:,.0f} B" for s in sizes))
    return report
