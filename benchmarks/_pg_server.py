"""The PostgreSQL server side of the issue-16 benchmarks: a throwaway durable cluster (or
`DURABLE_BOTS_BENCH_DATABASE_URL`), and what the server did between two moments: WAL bytes
(`pg_current_wal_lsn`), its WAL records by type (`pg_waldump --stats`, local cluster only: rows inserted,
updated, deleted, transactions committed) and the CPU time of its processes (local cluster only)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import asyncpg
import psutil

from benchmarks.postgres import ENV_URL
from harness_core.testing import TemporaryPostgres, start_cluster

# pg_waldump --stats=record lines: "Heap/INSERT   123 ( 45.67)   6789 ( 12.34)   0 (  0.00)   6789 ( 12.34)"
_STATS_LINE = re.compile(
    r"^(\S+/\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)"
)


@dataclass
class Server:
    """A server to measure: `admin_url` is a superuser URL; `cluster` is set when we started it here."""

    admin_url: str
    cluster: TemporaryPostgres | None

    @property
    def local(self) -> bool:
        return self.cluster is not None and self.cluster.data_dir is not None


@asynccontextmanager
async def durable_server() -> AsyncIterator[Server]:
    if os.environ.get(ENV_URL):
        yield Server(os.environ[ENV_URL], None)
        return
    cluster = await asyncio.to_thread(start_cluster, durable=True)
    try:
        yield Server(cluster.url, cluster)
    finally:
        await asyncio.to_thread(cluster.stop)


@dataclass
class Mark:
    """The server at one moment."""

    lsn: int
    cpu: float  # seconds of CPU used by the server's processes so far (local cluster), else 0


@dataclass
class Activity:
    """What the server did between two marks."""

    seconds: float
    wal_bytes: int
    cpu: float
    records: dict[str, int] = field(default_factory=dict)  # WAL record type -> count (local cluster)
    record_bytes: dict[str, int] = field(default_factory=dict)  # WAL record type -> bytes incl. full pages
    full_page_bytes: int = 0  # of which full-page images (the first change of a page after a checkpoint)

    def count(self, *kinds: str) -> int:
        return sum(self.records.get(kind, 0) for kind in kinds)

    @property
    def commits(self) -> int:
        """Transactions that wrote and committed (a read-only transaction writes no commit record)."""
        return self.count("Transaction/COMMIT")

    @property
    def rows_inserted(self) -> int:
        return self.count("Heap/INSERT", "Heap/INSERT+INIT", "Heap2/MULTI_INSERT", "Heap2/MULTI_INSERT+INIT")

    @property
    def rows_updated(self) -> int:
        return self.count("Heap/UPDATE", "Heap/HOT_UPDATE", "Heap/UPDATE+INIT", "Heap/HOT_UPDATE+INIT")

    @property
    def rows_deleted(self) -> int:
        return self.count("Heap/DELETE")


class Probe:
    """Marks and activity of one server (one admin connection, kept open)."""

    def __init__(self, server: Server, conn: asyncpg.Connection) -> None:
        self.server = server
        self.conn = conn
        self._postmaster: psutil.Process | None = None
        if server.cluster is not None and server.cluster.data_dir is not None:
            pid = int((server.cluster.data_dir / "postmaster.pid").read_text().split()[0])
            self._postmaster = psutil.Process(pid)

    @classmethod
    async def open(cls, server: Server) -> Probe:
        return cls(server, await asyncpg.connect(server.admin_url))

    async def close(self) -> None:
        await self.conn.close()

    def cpu(self) -> float:
        """CPU seconds of the server: the postmaster, its live children, and the children it already reaped."""
        if self._postmaster is None:
            return 0.0
        times = self._postmaster.cpu_times()
        total: float = times.user + times.system + times.children_user + times.children_system
        for child in self._postmaster.children():
            try:
                ct = child.cpu_times()
            except psutil.Error:
                continue
            total += ct.user + ct.system
        return total

    async def mark(self) -> Mark:
        lsn = int(await self.conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"))
        return Mark(lsn, self.cpu())

    async def since(self, start: Mark, seconds: float, *, records: bool = True) -> Activity:
        end = await self.mark()
        found = Activity(seconds, end.lsn - start.lsn, end.cpu - start.cpu)
        if records and self.server.local and end.lsn > start.lsn:
            counts, sizes, fpi = await asyncio.to_thread(self._waldump, start.lsn, end.lsn)
            found.records, found.record_bytes, found.full_page_bytes = counts, sizes, fpi
        return found

    def _waldump(self, start: int, end: int) -> tuple[dict[str, int], dict[str, int], int]:
        cluster = self.server.cluster
        assert cluster is not None and cluster.data_dir is not None and cluster.bin_dir is not None
        done = subprocess.run(
            [
                str(cluster.bin_dir / "pg_waldump"),
                "--stats=record",
                "-p",
                str(cluster.data_dir / "pg_wal"),
                "-s",
                _lsn(start),
                "-e",
                _lsn(end),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        counts: dict[str, int] = {}
        sizes: dict[str, int] = {}
        fpi = 0
        for line in done.stdout.splitlines():
            match = _STATS_LINE.match(line.strip())
            if match:
                name = match.group(1)
                counts[name] = counts.get(name, 0) + int(match.group(2))
                sizes[name] = sizes.get(name, 0) + int(match.group(5))
                fpi += int(match.group(4))
        if not counts:
            raise RuntimeError(f"pg_waldump gave no records: {done.stderr[-2000:]}")
        return counts, sizes, fpi


def _lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"
