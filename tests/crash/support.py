"""Run the crash worker in a real subprocess and SIGKILL it at a chosen moment."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_core.storage import PostgresStorage, SqliteStorage, Storage

WORKER = Path(__file__).with_name("worker.py")
STORAGE_URL_ENV = (
    "DURABLE_BOTS_CRASH_STORAGE_URL"  # set: the worker and the checks use this PostgreSQL database
)


async def open_storage(workdir: Path) -> Storage:
    """The crash store: `<workdir>/agent.sqlite`, or the PostgreSQL database `DURABLE_BOTS_CRASH_STORAGE_URL` names.

    On PostgreSQL a SIGKILLed worker leaves its lease behind; the next opener waits for it like a standby
    (a 1 s ttl keeps that short)."""
    url = os.environ.get(STORAGE_URL_ENV)
    if url:
        return await PostgresStorage.open(url, lease_ttl=1.0, on_standby=lambda holder: None)
    return await SqliteStorage.open(workdir / "agent.sqlite")


@dataclass
class Run:
    returncode: int
    events: list[dict[str, Any]] = field(default_factory=list)
    stderr: str = ""

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def event(self, name: str) -> dict[str, Any]:
        found = [e for e in self.events if e["event"] == name]
        assert found, f"no {name!r} event in {self.events}\n{self.stderr}"
        return found[-1]


async def run_worker(
    workdir: Path,
    scenario: str,
    options: dict[str, Any] | None = None,
    *,
    kill_on: str | None = None,
    kill_after: int = 1,
    worker: Path = WORKER,
) -> Run:
    """Start the worker; if `kill_on` names an event, SIGKILL the process when it has printed it `kill_after`
    times. Returns the exit status and the events printed."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(worker),
        scenario,
        str(workdir),
        json.dumps(options or {}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    events: list[dict[str, Any]] = []
    seen = 0
    while True:
        line = await process.stdout.readline()
        if not line:
            break
        event = json.loads(line)
        events.append(event)
        if kill_on is not None and event["event"] == kill_on:
            seen += 1
            if seen == kill_after:
                process.kill()
                break
    stderr = (await process.stderr.read()).decode()
    await process.wait()
    assert process.returncode is not None
    return Run(process.returncode, events, stderr)


def ledger(workdir: Path) -> list[str]:
    path = workdir / "ledger.txt"
    return path.read_text().splitlines() if path.exists() else []
