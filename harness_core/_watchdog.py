"""The event-loop lag watchdog and the record of running tool executions it names.

One process, one event loop: a tool that blocks it (a `time.sleep`, a CPU-bound regex, blocking file or
socket I/O in `async def` code) freezes every conversation, the platform connections and the health checks,
and cannot even be cancelled by its time limit, since cancellation needs the loop. The watchdog cannot stop
such a tool either; it makes it visible: a task that sleeps `interval_ms` and, when it wakes `threshold_ms` or
more late, logs a WARNING with the lag and every tool execution that ran during it (task id and tool name).

Invariants: `ToolRuns` is bounded (running executions plus the last few finished ones, which a report may
still need: a blocking tool usually finishes before the watchdog gets the loop back). The watchdog task is
owned by `LoopWatchdog`: `start()` is idempotent, `stop()` cancels and awaits it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass

from harness_core.settings import WatchdogSettings

log = logging.getLogger("harness_core.watchdog")

FINISHED_KEPT = 64  # finished executions remembered for the next report


@dataclass
class ToolRun:
    task_id: int
    name: str
    started: float  # event-loop time
    ended: float | None = None

    def overlaps(self, start: float, end: float) -> bool:
        return self.started <= end and (self.ended is None or self.ended >= start)


class ToolRuns:
    """Which tool executions run now (and which finished lately), on the event loop's clock."""

    def __init__(self) -> None:
        self._running: dict[int, ToolRun] = {}
        self._finished: collections.deque[ToolRun] = collections.deque(maxlen=FINISHED_KEPT)

    def begin(self, task_id: int, name: str) -> ToolRun:
        run = ToolRun(task_id, name, asyncio.get_running_loop().time())
        self._running[id(run)] = run
        return run

    def end(self, run: ToolRun) -> None:
        if self._running.pop(id(run), None) is not None:
            run.ended = asyncio.get_running_loop().time()
            self._finished.append(run)

    def running(self) -> list[ToolRun]:
        return list(self._running.values())

    def during(self, start: float, end: float) -> list[ToolRun]:
        """Executions that ran at some point between `start` and `end`, by task id."""
        runs = [r for r in (*self._finished, *self._running.values()) if r.overlaps(start, end)]
        return sorted(runs, key=lambda r: (r.task_id, r.started))


class LoopWatchdog:
    def __init__(self, settings: Callable[[], WatchdogSettings], runs: ToolRuns) -> None:
        self._settings = settings  # read on every tick: settings are live
        self._runs = runs
        self._task: asyncio.Task[None] | None = None
        self.reports = 0  # how many lags were reported (for tests and metrics)

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="harness-loop-watchdog")

    def cancel(self) -> None:
        """Stop without waiting (from a callback: the session failed and will never be resumed)."""
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            settings = self._settings()
            interval = max(settings.interval_ms, 1) / 1000
            slept_at = loop.time()
            await asyncio.sleep(interval)
            woke_at = loop.time()
            lag = woke_at - slept_at - interval
            if settings.enabled and lag * 1000 >= settings.threshold_ms:
                self._report(lag, self._runs.during(slept_at, woke_at))

    def _report(self, lag: float, runs: list[ToolRun]) -> None:
        self.reports += 1
        if runs:
            names = ", ".join(f"task {r.task_id} ({r.name})" for r in runs)
            log.warning(
                "event loop blocked for %.0f ms; tool execution(s) running meanwhile: %s. A tool must not "
                "block the loop (use asyncio.to_thread for blocking work)",
                lag * 1000,
                names,
            )
        else:
            log.warning("event loop blocked for %.0f ms; no tool was running", lag * 1000)
