"""Shared plumbing: run options, scratch directories, the machine description, child processes, percentiles."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Durability = Literal["normal", "full"]
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Options:
    quick: bool = False
    tiny: bool = False  # smoke tests only: the smallest sizes that still exercise every code path
    workdir: Path = REPO / "var" / "bench"
    durability: Durability = "normal"

    def size(self, full: int, quick: int, tiny: int | None = None) -> int:
        if self.tiny:
            return tiny if tiny is not None else max(1, quick // 10)
        return quick if self.quick else full

    def scratch(self, name: str) -> Path:
        """A fresh directory for one measurement (removed by `cleanup`)."""
        path = self.workdir / "runs" / f"{name}-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        return path

    def cache(self, name: str) -> Path:
        """A directory kept between runs (built stores that take long to make)."""
        path = self.workdir / "cache" / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def machine() -> dict[str, Any]:
    try:
        import psutil

        ram = f"{psutil.virtual_memory().total / 2**30:.1f} GiB"
    except ImportError:
        ram = "unknown"
    return {
        "nproc": os.cpu_count(),
        "ram": ram,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank; good enough for latency figures."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def file_bytes(path: Path) -> int:
    """A SQLite store's size on disk: the database plus its WAL (the WAL is part of the data until checkpointed)."""
    total = 0
    for suffix in ("", "-wal"):
        candidate = Path(f"{path}{suffix}")
        if candidate.exists():
            total += candidate.stat().st_size
    return total


def copy_store(source: Path, target: Path) -> None:
    """Copy a closed SQLite store (and its WAL if one was left behind)."""
    for suffix in ("", "-wal"):
        candidate = Path(f"{source}{suffix}")
        if candidate.exists():
            shutil.copyfile(candidate, f"{target}{suffix}")


async def run_child(
    module: str, function: str, args: dict[str, Any], *, timeout: float = 1800
) -> dict[str, Any]:
    """Run `benchmarks.<module>.<function>(args)` in a fresh interpreter and return the JSON it printed last.

    Memory figures need a process that holds nothing else; timing from process start needs a cold start.
    `args["spawned_at"]` is the wall clock just before the spawn.
    """
    payload = json.dumps({**args, "spawned_at": time.time()})
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks._child",
        module,
        function,
        payload,
        cwd=str(REPO),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
    lines = [line for line in stdout.decode().splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(
            f"child {module}.{function} exited {process.returncode} without a result:\n{stderr.decode()[-4000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    result["returncode"] = process.returncode
    return result


def rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def peak_rss_bytes() -> int:
    """This process's peak RSS (VmHWM). Not ru_maxrss: Linux carries the parent's high-water mark across
    fork+exec, so a child spawned by a big parent would report the parent's size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
