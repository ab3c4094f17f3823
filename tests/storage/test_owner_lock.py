"""The owner lock: one process (and one open) per persistent storage; the kernel frees it on death."""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import stat
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from harness_core.errors import StorageLocked
from harness_core.storage import JsonlStorage, SqliteStorage, Storage
from harness_core.storage._lock import OwnerLock

Opener = Callable[[Path], Awaitable[Storage]]


async def open_sqlite(root: Path) -> Storage:
    return await SqliteStorage.open(root / "bot.db")


async def open_jsonl(root: Path) -> Storage:
    return await JsonlStorage.open(root / "bot")


BACKENDS: dict[str, tuple[Opener, str]] = {
    "sqlite": (open_sqlite, "bot.db.lock"),
    "jsonl": (open_jsonl, "bot/.lock"),
}

# Opens the storage in a separate process and reports what happened on stdout.
PROBE = """
import asyncio, sys, time
from harness_core.errors import StorageLocked
from harness_core.storage import JsonlStorage, SqliteStorage

async def main(kind, path):
    started = time.monotonic()
    try:
        storage = await (SqliteStorage.open(path) if kind == "sqlite" else JsonlStorage.open(path))
    except StorageLocked as exc:
        print(f"LOCKED after {time.monotonic() - started:.3f} s:", exc.holder, flush=True)
        return
    print("OPENED", flush=True)
    await storage.close()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def probe(kind: str, root: Path) -> str:
    target = root / ("bot.db" if kind == "sqlite" else "bot")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PROBE, kind, str(target), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0
    return out.decode().strip()


@pytest.mark.parametrize("kind", sorted(BACKENDS))
async def test_second_open_in_the_same_process_is_refused(kind: str, tmp_path: Path) -> None:
    opener, _ = BACKENDS[kind]
    first = await opener(tmp_path)
    try:
        with pytest.raises(StorageLocked) as caught:
            await opener(tmp_path)
        assert f"pid {os.getpid()}" in caught.value.holder
        assert socket.gethostname() in caught.value.holder
        assert first.description in str(caught.value)
    finally:
        await first.close()
    second = await opener(tmp_path)  # released on close
    await second.close()


@pytest.mark.parametrize("kind", sorted(BACKENDS))
async def test_second_process_is_refused_and_told_who_holds_it(kind: str, tmp_path: Path) -> None:
    opener, _ = BACKENDS[kind]
    holder = await opener(tmp_path)
    try:
        report = await probe(kind, tmp_path)
    finally:
        await holder.close()
    assert report.startswith("LOCKED")
    # refused at once (the lock is tried without waiting), not after SQLite's busy timeout
    assert float(report.split()[2]) < 1.0, report
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in report
    assert await probe(kind, tmp_path) == "OPENED"


@pytest.mark.parametrize("kind", sorted(BACKENDS))
async def test_lock_file_is_private_and_names_the_holder(kind: str, tmp_path: Path) -> None:
    opener, lock_name = BACKENDS[kind]
    storage = await opener(tmp_path)
    lock_file = tmp_path / lock_name
    try:
        assert stat.S_IMODE(lock_file.stat().st_mode) == 0o600
        assert f'"pid": {os.getpid()}' in lock_file.read_text()
    finally:
        await storage.close()
    assert lock_file.read_text() == ""  # a released lock names nobody


def test_a_holder_that_has_not_written_its_name_yet(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # locked, but empty, like a holder mid-startup
    try:
        with pytest.raises(StorageLocked) as caught:
            OwnerLock.acquire(path, "x")
        assert caught.value.holder == "holder unknown"
    finally:
        os.close(fd)
    lock = OwnerLock.acquire(path, "x")
    assert lock.held
    lock.release()
    lock.release()  # idempotent
    assert not lock.held
