"""Issue 16, on paper: how many workers and turns/s one PostgreSQL server carries. Measures what the server
does for the work a worker hands it, on a throwaway cluster with PostgreSQL's default durability:

- one answered turn and one recorded message of a real `durable-bots run` process (Slack Socket Mode against
  the fake Slack, `faux:demo` running `/call lookup`: model, tool call, tool result, model, answer), one at a
  time: transactions, rows, WAL bytes and server CPU per turn (from `pg_waldump --stats` between two LSNs and
  the server processes' CPU time), and the bot's own commit count (`/metrics`);
- N writers committing at once, each on its own partition (emulated: its own schema, one `PostgresStorage`
  each), sequential small harness commits: commits/s, server CPU and WAL per commit; anchor: N raw asyncpg
  connections inserting a 500-byte row per transaction into one table;
- ingress (a record another worker writes for a partition's owner): INSERT ... ON CONFLICT DO NOTHING, its NOTIFY
  sent after it by the store, one per partition per short window
  in one transaction, then the owner's UPDATE that finishes it, emulated with the contract's table shape.

The estimate itself (arithmetic and assumptions) is in benchmarks/RESULTS.md, "Many workers (issue 16)".
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import psutil

from adapters.slack.testing import FakeSlack
from benchmarks._bot_process import LAST_LINE, READY, BotProcess, lookup_text
from benchmarks._env import Options, cleanup
from benchmarks._pg_server import Activity, Probe, Server, durable_server
from benchmarks._report import Report
from benchmarks.commit_rate import small_commit
from benchmarks.postgres import database
from benchmarks.workers import partitions_supported
from harness_core import Harness
from harness_core.storage import PostgresStorage, PostgresStore

NAME = "pg_capacity"
TITLE = (
    "one PostgreSQL server under many workers: cost of a turn, commits/s with N writers, ingress (issue 16)"
)
CHANNELS = 10
LOAD_MESSAGES = 500  # the mixed load: messages/s ...
LOAD_TURNS = 50  # ... of which answered (each also one more event, app_mention)
COMMITS = "durable_bots_commit_seconds_count"
PARTITIONS = 64  # the contract's default `[storage] partitions`
PAYLOAD: dict[str, Any] = {
    "place": {"platform": "slack", "workspace": "T0123ABCD", "channel": "C0123ABCDEF", "thread": None},
    "request_id": "slack:C0123ABCDEF:1796147009.658640",
    "user_id": "U0123ABCD",
    "user_name": "alice",
    "text": "message 1234: the deploy of service 3 looks fine, nothing to do here for now " * 3,
    "mentions_bot": False,
    "ts": "1796147009.658640",
}


@dataclass
class PerUnit:
    """Server work per unit (turn, message, commit), the idle background subtracted."""

    units: int
    transactions: float
    inserted: float
    updated: float
    deleted: float
    wal_bytes: float
    full_page_bytes: float
    cpu_ms: float
    bot_commits: float = 0.0
    worker_cpu_ms: float = 0.0  # the bot process's own CPU per unit (turn costs only)

    @classmethod
    def of(cls, activity: Activity, units: int, idle: Activity | None = None) -> PerUnit:
        scale = activity.seconds / idle.seconds if idle is not None and idle.seconds > 0 else 0.0

        def net(value: float, background: float) -> float:
            return max(0.0, value - background * scale) / units

        return cls(
            units,
            net(activity.commits, idle.commits if idle else 0),
            net(activity.rows_inserted, idle.rows_inserted if idle else 0),
            net(activity.rows_updated, idle.rows_updated if idle else 0),
            net(activity.rows_deleted, idle.rows_deleted if idle else 0),
            net(activity.wal_bytes, idle.wal_bytes if idle else 0),
            net(activity.full_page_bytes, idle.full_page_bytes if idle else 0),
            net(activity.cpu * 1000, idle.cpu * 1000 if idle else 0),
        )


@dataclass
class TurnCosts:
    tool_turn: PerUnit  # `/call lookup`: model, tool call, tool result, model, answer
    plain_turn: PerUnit  # the demo's plain answer: model, answer (the `workers` benchmark's turn)
    recorded: PerUnit  # a message kept as context
    idle: Activity  # the idle worker's background


def worker_partitions() -> int | None:
    """The bot of the turn measurements: a worker on the default 64 partitions (every message through the
    router's ingress, as with many workers), or, in a build without partitions, today's single owner."""
    return PARTITIONS if partitions_supported() else None


async def turn_costs(
    server: Server, probe: Probe, options: Options, turns: int, recorded: int, idle_seconds: float
) -> TurnCosts:
    """What the server does for one real bot process's turns and messages, one at a time."""
    scratch = options.scratch(NAME)
    try:
        async with database(server.admin_url) as url, FakeSlack(ack_timeout=10.0) as fake:
            channels = [fake.add_channel(f"cost-{n}") for n in range(CHANNELS)]
            users = [fake.add_user(f"U{n:03d}", name=f"user{n}") for n in range(CHANNELS)]
            bot = BotProcess("cost", scratch, url, partitions=worker_partitions())
            await bot.start({**os.environ, **fake.env, "DURABLE_BOTS_DEMO_DELAY_MS": "0"})
            try:
                await bot.wait_for(READY, 60)
                mention = f"<@{fake.bot_user_id}> "
                process = psutil.Process(bot.pid)

                def bot_cpu() -> float:
                    times = process.cpu_times()
                    return float(times.user + times.system)

                async def answered_turn(n: int) -> None:
                    channel = channels[n % CHANNELS]
                    key = f"k{n}"
                    post = await fake.user_posts(channel, users[n % CHANNELS], mention + lookup_text(key))
                    await post.wait_acked(30)
                    await fake.wait_for_message(channel, contains=f"{key} = 42", timeout=60)

                async def plain_turn(n: int) -> None:
                    channel = channels[n % CHANNELS]
                    before = sum(1 for m in fake.bot_messages(channel) if m.text.endswith(LAST_LINE))
                    post = await fake.user_posts(
                        channel, users[n % CHANNELS], f"{mention}message {n}: all fine"
                    )
                    await post.wait_acked(30)
                    await fake.wait_for(
                        lambda: (
                            sum(1 for m in fake.bot_messages(channel) if m.text.endswith(LAST_LINE)) > before
                        ),
                        60,
                        description="the plain answer",
                    )

                # Each channel's conversation exists and its user's name is cached before anything is measured.
                for n in range(CHANNELS):
                    await answered_turn(-1 - n)
                await asyncio.sleep(1.0)  # the last answer's trailing commits

                start = await probe.mark()
                began = time.monotonic()
                await asyncio.sleep(idle_seconds)
                idle = await probe.since(start, time.monotonic() - began)

                async def recorded_message(n: int) -> None:
                    post = await fake.user_posts(
                        channels[n % CHANNELS], users[n % CHANNELS], f"message {n}: all fine"
                    )
                    await post.wait_acked(30)

                async def per_unit(unit: Callable[[int], Awaitable[None]], count: int) -> PerUnit:
                    """What `count` units cost the server and the bot, the idle background subtracted."""
                    before, cpu = await bot.metrics(), bot_cpu()
                    start, began = await probe.mark(), time.monotonic()
                    for n in range(count):
                        await unit(n)
                    await asyncio.sleep(0.5)
                    activity = await probe.since(start, time.monotonic() - began)
                    after = await bot.metrics()
                    measured = PerUnit.of(activity, count, idle)
                    measured.worker_cpu_ms = (bot_cpu() - cpu) * 1000 / count
                    measured.bot_commits = (after[COMMITS] - before[COMMITS]) / count
                    return measured

                per_turn = await per_unit(answered_turn, turns)
                per_plain = await per_unit(plain_turn, turns)
                per_message = await per_unit(recorded_message, recorded)
            finally:
                await bot.stop()
        return TurnCosts(per_turn, per_plain, per_message, idle)
    finally:
        cleanup(scratch)


async def ours_writers(server: Server, probe: Probe, writers: int, seconds: float) -> tuple[float, PerUnit]:
    """Commits/s of `writers` partitions of one store (`PostgresStore.open_partition`, a Harness each, a pool
    connection per writer) committing small harness commits one after another, all at once."""
    async with database(server.admin_url) as url:
        store = await PostgresStore.open(url, partitions=PARTITIONS, pool_size=writers + 2)
        harnesses: list[Harness] = []
        try:
            for n in range(writers):
                handle = await store.open_partition(n)
                if not isinstance(handle, PostgresStorage):
                    raise RuntimeError(f"partition {n} is held by {handle.describe()}")
                harnesses.append(await Harness.open(handle))
            conversations = [(await h.create_conversation()).id for h in harnesses]
            for harness, conversation_id in zip(harnesses, conversations, strict=True):
                await harness.commit(small_commit(conversation_id, 0))
            done = [0] * writers
            loop = asyncio.get_running_loop()
            deadline = loop.time() + seconds

            async def write(n: int) -> None:
                while loop.time() < deadline:
                    done[n] += 1
                    await harnesses[n].commit(small_commit(conversations[n], done[n]))

            start, began, cpu = await probe.mark(), time.monotonic(), time.process_time()
            await asyncio.gather(*(write(n) for n in range(writers)))
            elapsed, cpu = time.monotonic() - began, time.process_time() - cpu
            activity = await probe.since(start, elapsed)
        finally:
            for harness in harnesses:
                await harness.close()
            await store.close()
    total = sum(done)
    found = PerUnit.of(activity, total)
    found.bot_commits = cpu * 1000 / total  # here: client CPU ms per commit (this process, all writers)
    return total / elapsed, found


async def raw_writers(server: Server, probe: Probe, writers: int, seconds: float) -> tuple[float, PerUnit]:
    """The anchor: `writers` asyncpg connections, one 500-byte INSERT per transaction each, into one table."""
    async with database(server.admin_url) as url:
        conns = [await asyncpg.connect(url) for _ in range(writers)]
        try:
            await conns[0].execute(
                "CREATE TABLE rows (id BIGSERIAL PRIMARY KEY, partition INTEGER NOT NULL, record BYTEA NOT NULL)"
            )
            payload = b"x" * 500
            insert = "INSERT INTO rows (partition, record) VALUES ($1, $2)"
            done = [0] * writers
            loop = asyncio.get_running_loop()
            deadline = loop.time() + seconds

            async def write(n: int) -> None:
                while loop.time() < deadline:
                    async with conns[n].transaction():
                        await conns[n].execute(insert, n, payload)
                    done[n] += 1

            start, began, cpu = await probe.mark(), time.monotonic(), time.process_time()
            await asyncio.gather(*(write(n) for n in range(writers)))
            elapsed, cpu = time.monotonic() - began, time.process_time() - cpu
            activity = await probe.since(start, elapsed)
        finally:
            for conn in conns:
                await conn.close()
    total = sum(done)
    found = PerUnit.of(activity, total)
    found.bot_commits = cpu * 1000 / total
    return total / elapsed, found


async def ingress(
    server: Server, probe: Probe, count: int, writers: int
) -> tuple[float, PerUnit, float, PerUnit, float, int, float, float]:
    """(puts/s, per put, finishes/s, per finish, puts/s from `writers` tasks at once, notifications heard of
    the `count` sequential puts), through `PostgresStore.put_ingress` / `finish_ingress` on one store whose
    `on_ingress` listener counts the NOTIFYs."""
    async with database(server.admin_url) as url:
        store = await PostgresStore.open(url, partitions=PARTITIONS, pool_size=writers)
        heard = [0]
        try:
            store.on_ingress(lambda _partition: heard.__setitem__(0, heard[0] + 1))
            await store.listening()
            start, began = await probe.mark(), time.monotonic()
            for n in range(count):
                await store.put_ingress(n % PARTITIONS, "message", f"slack:C1:{n}", PAYLOAD)
            elapsed = time.monotonic() - began
            put = await probe.since(start, elapsed)
            await asyncio.sleep(0.2)  # the last notifications on their way to the listener
            heard_sequential = heard[0]
            records = await store.pending_ingress(range(PARTITIONS), limit=count)
            start, began = await probe.mark(), time.monotonic()
            for record in records:
                await store.finish_ingress(record.id)
            finish_elapsed = time.monotonic() - began
            finish = await probe.since(start, finish_elapsed)
            done = [0] * writers
            loop = asyncio.get_running_loop()
            deadline = loop.time() + max(1.0, elapsed)

            async def write(w: int) -> None:
                while loop.time() < deadline:
                    await store.put_ingress(w % PARTITIONS, "message", f"slack:C2:{w}:{done[w]}", PAYLOAD)
                    done[w] += 1

            began = time.monotonic()
            await asyncio.gather(*(write(w) for w in range(writers)))
            concurrent = sum(done) / (time.monotonic() - began)
            silent = await puts_without_notify(url, writers, max(1.0, elapsed))
            after = await puts_without_notify(url, writers, max(1.0, elapsed), notify_after=True)
        finally:
            await store.close()
    return (
        count / elapsed,
        PerUnit.of(put, count),
        len(records) / finish_elapsed,
        PerUnit.of(finish, len(records)),
        concurrent,
        heard_sequential,
        silent,
        after,
    )


# The store's put without its NOTIFY: PostgreSQL serializes the commits of transactions that NOTIFY (one lock
# per database, held through the commit's WAL flush), so this is what the same inserts do without that.
SILENT_PUT = (
    "INSERT INTO ingress (key, partition, kind, payload, created_at) VALUES ($1, $2, 'message', $3, 0) "
    "ON CONFLICT (key) DO NOTHING RETURNING id"
)


async def puts_without_notify(url: str, writers: int, seconds: float, *, notify_after: bool = False) -> float:
    """Ingress inserts into the store's own table from `writers` asyncpg connections at once, no NOTIFY in
    their transaction; `notify_after`: each followed by a NOTIFY in a transaction of its own (which writes no
    WAL, so its turn at the lock is short)."""
    conns = [await asyncpg.connect(url) for _ in range(writers)]
    try:
        text = json.dumps(PAYLOAD)
        done = [0] * writers
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds

        async def write(w: int) -> None:
            while loop.time() < deadline:
                key = f"slack:C{4 if notify_after else 3}:{w}:{done[w]}"
                await conns[w].fetch(SILENT_PUT, key, w % PARTITIONS, text)
                if notify_after:
                    await conns[w].execute("SELECT pg_notify('bench_ingress', $1)", str(w % PARTITIONS))
                done[w] += 1

        began = time.monotonic()
        await asyncio.gather(*(write(w) for w in range(writers)))
        return sum(done) / (time.monotonic() - began)
    finally:
        for conn in conns:
            await conn.close()


def _describe(unit: PerUnit) -> str:
    return (
        f"{unit.transactions:.2f} transactions, rows +{unit.inserted:.1f} ~{unit.updated:.1f} -{unit.deleted:.1f}, "
        f"WAL {unit.wal_bytes:,.0f} B (full pages {unit.full_page_bytes:,.0f} B)"
    )


async def run(options: Options) -> Report:
    turns = options.size(200, 60, 4)
    recorded = options.size(400, 100, 6)
    idle_seconds = options.size(20, 8, 1)
    counts = (
        [1, 2, 4, 8, 16, 32]
        if not (options.quick or options.tiny)
        else ([1, 4, 16] if options.quick else [1, 2])
    )
    seconds = 5.0 if not (options.quick or options.tiny) else (3.0 if options.quick else 0.5)
    ingress_count = options.size(2_000, 500, 20)
    report = Report(
        NAME,
        TITLE,
        "One PostgreSQL server (a throwaway cluster with fsync and synchronous commits on, or "
        "$DURABLE_BOTS_BENCH_DATABASE_URL), the same disk and 2 cores as everything else. Turns: a real "
        "`durable-bots run` (Slack Socket Mode, fake Slack, faux:demo"
        + (
            f"; a worker on {PARTITIONS} partitions, so every message goes through the router's ingress"
            if worker_partitions()
            else "; one process owning the store"
        )
        + "), one at a time over "
        f"{CHANNELS} channels: {turns} tool turns (`/call lookup`: model, tool, model, answer), {turns} plain "
        f"turns (a mention the demo answers in one model call, as in `workers`), then {recorded} recorded "
        "messages; per unit: the server's WAL records between two LSNs (`pg_waldump --stats`: COMMIT records "
        "= writing transactions, heap INSERT/UPDATE/DELETE = rows), WAL bytes, the server processes' CPU (reads "
        f"included), the bot's `commit_seconds_count`; an idle worker's background ({idle_seconds} s: lease "
        "renewals) subtracted. Writers: N partitions of one store (`PostgresStore.open_partition`, "
        f"{PARTITIONS} partitions, a Harness each) committing one-entry + one-document harness commits one "
        f"after another, all N at once, {seconds:g} s; anchor: N asyncpg connections, one 500-byte INSERT per "
        "transaction into one table. Ingress: `PostgresStore.put_ingress` (INSERT ... ON CONFLICT DO NOTHING + "
        "the store's coalesced pg_notify after it, a ~600-byte payload) one at a time with the store's listener counting NOTIFYs, then "
        "`finish_ingress` of each, then 8 puts at once, and the same inserts without the NOTIFY, and with it in a transaction of its own after each (raw asyncpg). Estimate: the issue's load on 2 workers (500 "
        "messages/s, 50 answered, every message through ingress, as the router does) from these costs.",
    )
    async with durable_server() as server:
        probe = await Probe.open(server)
        try:
            costs = await turn_costs(server, probe, options, turns, recorded, idle_seconds)
            writer_rates: dict[int, tuple[float, PerUnit, float, PerUnit]] = {}
            for n in counts:
                ours_rate, ours_unit = await ours_writers(server, probe, n, seconds)
                raw_rate, raw_unit = await raw_writers(server, probe, n, seconds)
                writer_rates[n] = (ours_rate, ours_unit, raw_rate, raw_unit)
            put_rate, put, finish_rate, finish, put_concurrent, heard, silent, after = await ingress(
                server, probe, ingress_count, 8
            )
        finally:
            await probe.close()

    for label, unit in (
        ("tool turn", costs.tool_turn),
        ("plain turn", costs.plain_turn),
        ("recorded message", costs.recorded),
    ):
        report.add(f"{label}: transactions", unit.transactions, "", _describe(unit))
        report.add(f"{label}: bot storage commits", unit.bot_commits, "", "the bot's commit_seconds_count")
        report.add(f"{label}: WAL bytes", unit.wal_bytes, "B")
        report.add(f"{label}: server CPU", unit.cpu_ms, "ms", "reads included")
        report.add(f"{label}: worker CPU", unit.worker_cpu_ms, "ms", "the bot process")
    idle = costs.idle
    report.add(
        "idle worker: WAL",
        idle.wal_bytes / idle.seconds,
        "B/s",
        f"{idle.commits} commits in {idle.seconds:.1f} s",
    )
    report.add("idle worker: server CPU", idle.cpu * 1000 / idle.seconds, "ms/s")
    for n, (ours_rate, ours_unit, raw_rate, raw_unit) in writer_rates.items():
        report.add(
            f"{n} writers: ours",
            ours_rate,
            "commits/s",
            f"server CPU {ours_unit.cpu_ms:.3f} ms, client CPU {ours_unit.bot_commits:.3f} ms, "
            f"WAL {ours_unit.wal_bytes:,.0f} B per commit",
        )
        report.add(
            f"{n} writers: raw asyncpg",
            raw_rate,
            "commits/s",
            f"server CPU {raw_unit.cpu_ms:.3f} ms, WAL {raw_unit.wal_bytes:,.0f} B per commit",
        )
        report.ratio(f"{n} writers: ours / raw", ours_rate, raw_rate)
    report.add(
        "ingress put (insert; NOTIFY coalesced after), one at a time", put_rate, "puts/s", _describe(put)
    )
    report.add("ingress put: server CPU", put.cpu_ms, "ms")
    report.add("ingress finish (UPDATE), one at a time", finish_rate, "finishes/s", _describe(finish))
    report.add("ingress finish: server CPU", finish.cpu_ms, "ms")
    report.add("ingress put, 8 at once", put_concurrent, "puts/s")
    report.add(
        "ingress insert without NOTIFY, 8 at once", silent, "puts/s", "raw asyncpg into the same table"
    )
    report.ratio("ingress put / insert without NOTIFY, 8 at once", put_concurrent, silent)
    report.add(
        "ingress insert, then NOTIFY in its own transaction, 8 at once",
        after,
        "puts/s",
        "raw asyncpg: what the put would do with its NOTIFY moved out",
    )
    report.add(
        "notifications heard", heard, "", f"of {ingress_count} puts (coalesced per partition and window)"
    )

    # The load on 2 workers: 500 messages/s, 50 of them answered. The router commits every message as
    # an ingress record whichever worker received it (so a channel's order holds), and the owner finishes it
    # after its intake; a mention's second event (app_mention) carries the same message id and finds it there.
    # The server's commit ceiling as measured: the best of both writers (raw asyncpg leaves the client the least
    # to do; in a deployment the workers' client work is spread over their own processes and machines).
    best = max(max(ours, raw) for ours, _, raw, _ in writer_rates.values())
    turn, message = costs.plain_turn, costs.recorded
    # Measured on a worker, a turn's and a message's costs already hold their ingress put and finish.
    forwarded = 0 if worker_partitions() is not None else LOAD_MESSAGES
    transactions = (
        LOAD_TURNS * turn.transactions
        + (LOAD_MESSAGES - LOAD_TURNS) * message.transactions
        + forwarded * (put.transactions + finish.transactions)
    )
    cpu = (
        LOAD_TURNS * turn.cpu_ms
        + (LOAD_MESSAGES - LOAD_TURNS) * message.cpu_ms
        + forwarded * (put.cpu_ms + finish.cpu_ms)
    ) / 1000
    report.add(
        "the issue's load on 2 workers: transactions/s",
        transactions,
        "/s",
        "no group commit (an upper bound); every message through ingress",
    )
    report.add("the issue's load on 2 workers: server CPU", cpu, "cores")
    report.add(
        "plain turns/s at the best measured commit rate",
        best / turn.transactions if turn.transactions else float("nan"),
        "turns/s",
        "plain turns alone, one transaction per commit (no group commit)",
    )
    report.add(
        "turns/s per server core",
        1000 / turn.cpu_ms if turn.cpu_ms else float("nan"),
        "turns/s",
        "server CPU only",
    )
    report.add(
        "issue loads the ingress puts carry",
        put_concurrent / LOAD_MESSAGES,
        "",
        f"{put_concurrent:,.0f} puts/s (8 at once) / {LOAD_MESSAGES} messages/s",
    )
    report.goal(
        "one server carries the issue's load on 2 workers: under the best measured commit rate and ingress put "
        "rate, under one core",
        transactions < best and put_concurrent > LOAD_MESSAGES and cpu < 1.0,
        f"{transactions:,.0f} of {best:,.0f} transactions/s, {LOAD_MESSAGES} of {put_concurrent:,.0f} puts/s, "
        f"{cpu:.2f} cores",
    )
    return report
