"""Issue 16: what bounds the intake p99 of 2 workers on this machine. The `workers` load (2 workers, a separate
intake each, 64 partitions) run four ways, one after another in one run, each on a fresh database:

- **the mixed load**, as `workers` runs it;
- **no answered turns**: the same messages, none mentioning the bot (the owners only record them);
- **owners paused**: the mixed load with both worker processes stopped (SIGSTOP) while it is sent, so only
  their intake children, PostgreSQL and the fake Slack run: the intake path's own floor on this machine.
  They are continued (SIGCONT) after it and take everything in; the lease TTL is 60 s here so no lease lapses;
- **commits not waiting for the WAL flush**: the mixed load on a server set to `synchronous_commit = off`.
  Not something durable-bots may run with (an ack would then promise a record a server crash can lose); it
  is measured only to bound what the disk's flushes cost the intake. A throwaway cluster only.

Around each load the server's WAL flushes are counted and timed (`pg_stat_wal` with `track_wal_io_timing`, set
on a throwaway cluster only): an ingress put is acknowledged once its commit's flush returned, and every other
commit on the server flushes the same WAL. Backends report these counters about once a second, so a load's
last second may be missing from them (and a report from just before it included): about 10% on a 10 s load.
The cases run in this order every time, so a machine that slows during a run slows the later ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg
import psutil

from benchmarks._env import Options, median, percentile
from benchmarks._pg_server import Probe, Server, durable_server
from benchmarks._report import Report
from benchmarks.workers import (
    CHANNELS,
    GOAL_P99,
    GOAL_WORKERS,
    MENTION_EVERY,
    PARTITIONS,
    RATE,
    AroundLoad,
    Outcome,
    one_case,
)

NAME = "intake_bounds"
TITLE = "what bounds the 2-worker intake p99 under the `workers` load (issue 16)"

PAUSED_LEASE_TTL = 60.0  # seconds: longer than any load here, so a paused owner keeps its leases
WAL_STATS = "SELECT wal_sync, wal_sync_time FROM pg_stat_wal"


@dataclass(frozen=True)
class Case:
    name: str
    mention_every: int = MENTION_EVERY
    pause_owners: bool = False
    unflushed: bool = False  # the server runs with synchronous_commit = off (a throwaway cluster only)


CASES = (
    Case("the mixed load"),
    Case("no answered turns", mention_every=0),
    Case("owners paused", pause_owners=True),
    Case("commits not waiting for the WAL flush", unflushed=True),
)


@dataclass
class Watched:
    """What one load did to the server and the workers: the server's WAL flushes (fsync-like calls, with their
    summed time; None where they cannot be read) and what was checked to be in effect during it."""

    flushes: int | None = None
    milliseconds: float = 0.0
    checked: list[str] = field(default_factory=list)


async def _set_server(server: Server, settings: dict[str, str | None]) -> None:
    """ALTER SYSTEM (None: RESET) and reload; a throwaway cluster only, never someone's own server."""
    assert server.local
    conn = await asyncpg.connect(server.admin_url)
    try:
        for name, value in settings.items():
            if value is None:
                await conn.execute(f"ALTER SYSTEM RESET {name}")
            else:
                await conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


async def _wal_stats(conn: asyncpg.Connection | None) -> asyncpg.Record | None:
    """The server's flush counters, or None where there are none to read (a shared server; PostgreSQL 18
    moved them to `pg_stat_io`)."""
    if conn is None:
        return None
    try:
        row: asyncpg.Record | None = await conn.fetchrow(WAL_STATS)
    except asyncpg.UndefinedColumnError:
        return None
    return row


async def _stopped(pids: list[int], within: float = 1.0) -> int:
    """How many of `pids` the kernel shows stopped, waiting up to `within` s (a signal is not acted on at once)."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        count = sum(1 for pid in pids if psutil.Process(pid).status() == psutil.STATUS_STOPPED)
        if count == len(pids) or asyncio.get_running_loop().time() > deadline:
            return count
        await asyncio.sleep(0.01)


def around(server: Server, case: Case, watched: Watched) -> AroundLoad:
    @contextlib.asynccontextmanager
    async def load(worker_pids: list[int]) -> AsyncIterator[None]:
        conn = await asyncpg.connect(server.admin_url) if server.local else None
        paused: list[int] = []
        try:
            before = await _wal_stats(conn)
            if conn is not None:  # a fresh session: it reads the server's setting, as the workers' do
                setting = await conn.fetchval("SELECT current_setting('synchronous_commit')")
                watched.checked.append(f"synchronous_commit {setting}")
            try:
                if case.pause_owners:
                    for (
                        pid
                    ) in worker_pids:  # the worker only: its intake child (a process of its own) runs on
                        os.kill(pid, signal.SIGSTOP)
                        paused.append(pid)
                    watched.checked.append(f"{await _stopped(paused)} of {len(worker_pids)} workers stopped")
                yield
                # Read before the workers are continued: their catch-up is not the load's. Each backend
                # reports its counters about once a second, so up to a second of them may be missing here.
                after = await _wal_stats(conn)
                if before is not None and after is not None:
                    watched.flushes = int(after["wal_sync"] - before["wal_sync"])
                    watched.milliseconds = float(after["wal_sync_time"] - before["wal_sync_time"])
            finally:
                for pid in paused:
                    with contextlib.suppress(ProcessLookupError):  # died meanwhile: the case fails anyway
                        os.kill(pid, signal.SIGCONT)
        finally:
            if conn is not None:
                await conn.close()

    return load


async def measure(
    server: Server, probe: Probe, options: Options, case: Case, count: int
) -> tuple[Outcome, Watched]:
    watched = Watched()
    if server.local:
        await _set_server(
            server,
            {"track_wal_io_timing": "on", "synchronous_commit": "off" if case.unflushed else None},
        )
    try:
        outcome = await one_case(
            server,
            probe,
            options,
            GOAL_WORKERS,
            PARTITIONS,
            count,
            "separate",
            mention_every=case.mention_every,
            around_load=around(server, case, watched),
            lease_ttl=PAUSED_LEASE_TTL if case.pause_owners else 10.0,
        )
    finally:
        if server.local:
            await _set_server(server, {"track_wal_io_timing": None, "synchronous_commit": None})
    return outcome, watched


async def run(options: Options) -> Report:
    seconds = options.size(10, 4)
    count = RATE * seconds if not options.tiny else 100
    report = Report(
        NAME,
        TITLE,
        f"The `workers` load ({count:,} messages at {RATE}/s over {CHANNELS} channels, one in {MENTION_EVERY} "
        f"mentioning the bot) against {GOAL_WORKERS} `durable-bots run` workers with `[workers] intake = "
        f'"separate"` on {PARTITIONS} partitions, run four ways: '
        + "; ".join(case.name for case in CASES)
        + " (see the module's docstring). Intake as in `workers`: per event, from its scheduled arrival to "
        "the ack. WAL flushes: the server's `pg_stat_wal` during the load (a throwaway cluster only).",
    )
    outcomes: dict[str, tuple[Outcome, Watched]] = {}
    async with durable_server() as server:
        probe = await Probe.open(server)
        try:
            for case in CASES:
                if case.unflushed and not server.local:
                    report.note(
                        f"{case.name}: not run (it changes the server's settings: a throwaway cluster only)"
                    )
                    continue
                outcomes[case.name] = await measure(server, probe, options, case, count)
        finally:
            await probe.close()
    for name, (outcome, watched) in outcomes.items():
        lat, lags = outcome.latencies, outcome.send_lags
        report.add(f"{name}: intake p50", median(lat) * 1000, "ms")
        report.add(f"{name}: intake p99", percentile(lat, 99) * 1000, "ms", f"{len(lat)} events acked")
        report.add(f"{name}: of which before the fake sent it, p99", percentile(lags, 99) * 1000, "ms")
        if watched.flushes is not None:
            report.add(f"{name}: WAL flushes", watched.flushes / max(outcome.seconds, 1e-9), "/s")
            if watched.flushes:
                report.add(f"{name}: WAL flush mean", watched.milliseconds / watched.flushes, "ms")
        report.add(
            f"{name}: answered turns/s during the load",
            outcome.answered_in_load / max(outcome.seconds, 1e-9),
            "/s",
            f"{outcome.answered_in_load} of {outcome.asked}",
        )
        report.add(
            f"{name}: CPU workers / server / fake Slack",
            outcome.worker_cpu,
            "s",
            f"{outcome.server_cpu:.1f} s, {outcome.slack_cpu:.1f} s",
        )
        if outcome.failed:
            report.note(f"{name}: {len(outcome.failed)} event(s) not acked, first: {outcome.failed[0]}")
        report.note(
            f"{name}: {outcome.unfinished} not taken in, {outcome.channels_unanswered} channel(s) unanswered"
            + "".join(f"; {check}" for check in watched.checked)
        )
    if "owners paused" in outcomes:
        paused = outcomes["owners paused"][0]
        p99 = percentile(paused.latencies, 99)
        report.goal(
            f"a diagnostic, not the issue's goal: with the owners paused, intake p99 < {GOAL_P99 * 1000:g} ms "
            "(the intake path without the owners' work)",
            p99 < GOAL_P99 and not paused.failed,
            f"p99 {p99 * 1000:.1f} ms, {len(paused.failed)} not acked",
        )
    return report
