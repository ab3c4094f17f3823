"""A worker's separate intake process (`[workers] intake = "separate"`, DESIGN.md §9, issue 16).

Why: a process whose one event loop both acknowledges Slack events and runs turns makes every acknowledgement
wait for whatever that loop is doing; under 50 turns/s the intake p99 was hundreds of ms (benchmarks/RESULTS.md,
"Many workers"). A thread would not help much: it still waits for the interpreter lock the turns hold. So the
worker starts a child, `durable-bots run --role intake` with the same config, arguments and environment: the
child holds the Slack connection (Socket Mode, or the HTTP endpoint), commits every event as an ingress record
and acknowledges it; the worker owns partitions, takes the records in through its router's consumers, answers
and delivers. The child owns no partition and no lease: an ingress record is exactly once by the event's
identity whoever puts it, so nothing the child writes needs fencing.

Ownership: the worker starts the child once its adapters start and stops it (SIGTERM: the child stops taking
events, acknowledges those it holds, exits) when they stop. A child that exits on its own is started again,
after a backoff. If the worker dies, even by SIGKILL, the kernel sends the child SIGTERM (Linux
`PR_SET_PDEATHSIG`), and the child also checks every second that its parent is still there. Events the child
did not acknowledge are sent again by Slack to a connection that is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from adapters.base import Adapter
from adapters.bridge import Router
from adapters.redact import install_log_redaction, redact_url
from bots.background import OwnedLoop
from bots.config import BotConfig
from bots.cpu_priority import SpawnedProcess, Spawner
from bots.runtime import EXIT_OK, EXIT_STORAGE, BotError, Console, adapter_url, freeze_startup_heap
from harness_core import StorageError
from harness_core.storage import PostgresStore

log = logging.getLogger("bots.intake")

READY = "durable-bots intake: ready"
PARENT_ENV = "DURABLE_BOTS_INTAKE_PARENT"  # the worker's pid, told to its intake child
SEPARATE_ADAPTERS = (
    "slack",
)  # adapters whose intake can run in the child (Discord's shards stay in the worker)
START_TIMEOUT = 60.0  # seconds for the child's first start (auth.test, the connection)
STOP_TIMEOUT = 15.0  # seconds the child gets to acknowledge what it holds after SIGTERM
RESTART_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0)  # after the child exited on its own, the n-th time in a row
PR_SET_PDEATHSIG = 1


def intake_adapter_options(name: str, options: dict[str, Any], *, child: bool) -> dict[str, Any]:
    """A worker with a separate intake: its Slack adapter delivers and catches up but takes no events; the
    child's takes events only (the worker catches up)."""
    if name not in SEPARATE_ADAPTERS:
        return options
    if child:
        return {**options, "listen": True, "catch_up": False}
    return {**options, "listen": False}


class IntakeChild(OwnedLoop):
    """The worker's side: starts, watches and stops the child. `problem()` feeds the worker's `/readyz`."""

    task_name = "intake-child"

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        say: Callable[[str], None],
        *,
        start_timeout: float = START_TIMEOUT,
        restart_delays: Sequence[float] = RESTART_DELAYS,
    ) -> None:
        self.argv = list(argv)
        self.env = {**env, PARENT_ENV: str(os.getpid())}
        self.say = say
        self.start_timeout = start_timeout
        self.restart_delays = tuple(restart_delays)
        self.process: SpawnedProcess | None = None
        # Started now, before the worker may lower its priority: children are forked from its thread.
        self.spawner = Spawner()
        self.ready = False
        self.starts = 0  # children started (tests, the console)
        self._ready = asyncio.Event()
        self._lines: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def problem(self) -> str | None:
        if self.ready and self.process is not None and self.process.returncode is None:
            return None
        return "the separate intake process is not running"

    async def begin(self, stop: asyncio.Event | None = None) -> None:
        """Start the child and wait for it to be ready (or for `stop`); then watch it. Raises `BotError` when
        its first start fails (a wrong token, the database unreachable): the worker must not run deaf."""
        await self._spawn()
        if not await self._wait_ready(self.start_timeout, stop):
            if stop is not None and stop.is_set():
                return  # stopping while it starts: `end` stops it
            assert self.process is not None
            exited = self.process.returncode
            await self._end(self.process)
            self.spawner.close()
            raise BotError(
                "the separate intake process did not start"
                + (f" (exit code {exited})" if exited is not None else f" within {self.start_timeout:g} s")
                + "; its own lines above say why"
            )
        self.start()

    async def _spawn(self) -> None:
        self.ready = False
        self._ready = asyncio.Event()
        # A session of its own: a terminal's Ctrl-C reaches the worker only, which stops the child after its
        # drain; and where the kernel groups CPU time by session (autogroup), the child's few, short wake-ups
        # are not queued behind the worker's turns.
        self.process = await self.spawner.spawn(self.argv, self.env)
        self.starts += 1
        self._lines = asyncio.get_running_loop().create_task(
            self._relay(self.process), name="intake-child-lines"
        )

    async def _relay(self, process: SpawnedProcess) -> None:
        """The child's console lines, said here with a prefix; its ready line marks it ready."""
        assert process.stdout is not None
        while line := await process.stdout.readline():
            text = line.decode("utf-8", "replace").rstrip()
            if text == READY:
                self.ready = True
                self._ready.set()
            self.say(f"intake (pid {process.pid}): {text}")

    async def _wait_ready(self, timeout: float, stop: asyncio.Event | None = None) -> bool:
        assert self.process is not None
        waits = {asyncio.ensure_future(self.process.wait()), asyncio.ensure_future(self._ready.wait())}
        if stop is not None:
            waits.add(asyncio.ensure_future(stop.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        return self._ready.is_set() and self.process.returncode is None

    async def _run(self) -> None:
        failures = 0
        while True:
            process = self.process
            assert process is not None
            code = await process.wait()
            if self._lines is not None:
                await asyncio.gather(self._lines, return_exceptions=True)
            self.ready = False
            delay = self.restart_delays[min(failures, len(self.restart_delays) - 1)]
            self.say(
                f"durable-bots: the separate intake process exited (code {code}); starting it again in "
                f"{delay:g} s (Slack sends the events it did not acknowledge again)"
            )
            await asyncio.sleep(delay)
            try:
                await self._spawn()
            except OSError as exc:
                log.warning("starting the separate intake process failed: %s", exc)
                failures += 1
                continue
            if await self._wait_ready(self.start_timeout):
                failures = 0
                continue
            failures += 1
            await self._end(self.process)  # hung before its ready line: stopped, then started again

    async def end(self) -> None:
        """Stop watching, then stop the child: SIGTERM, then SIGKILL after `STOP_TIMEOUT`."""
        await self.stop()
        await self._end(self.process)
        self.spawner.close()

    async def _end(self, process: SpawnedProcess | None) -> int | None:
        if process is None:
            return None
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if self._lines is not None:
            await asyncio.gather(self._lines, return_exceptions=True)
        self.ready = False
        return process.returncode


def child_argv(cli_args: Sequence[str]) -> list[str]:
    """The command that runs this worker's intake: the same interpreter, config and logging arguments."""
    return [sys.executable, "-m", "bots", "run", *cli_args, "--role", "intake"]


# --- the child ---------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Ask the kernel for SIGTERM when the worker that started this process dies (Linux; elsewhere the
    parent check below does it within a second)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if os.getppid() != parent:
            log.warning("the worker that started this intake process is gone; stopping")
            stop.set()
            return
        await asyncio.sleep(1.0)


async def run_intake(
    config: BotConfig,
    adapters: Sequence[tuple[Adapter, dict[str, Any]]],
    env: Mapping[str, str],
    url: str,
    *,
    console: Console,
    stop: asyncio.Event | None = None,
) -> int:
    """`run --role intake`: take the adapters' events in as ingress records until SIGTERM or the parent
    worker is gone; then stop taking events, acknowledge those in hand, exit."""
    install_log_redaction()
    _die_with_parent()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
            installed.append(int(signum))
    watcher: asyncio.Task[None] | None = None
    parent = env.get(PARENT_ENV, "")
    if parent.isdigit():
        watcher = loop.create_task(_watch_parent(int(parent), stop), name="intake-parent")
    store: PostgresStore | None = None
    router: Router | None = None
    started: list[Adapter] = []
    try:
        try:
            store = await PostgresStore.open(
                url, partitions=config.storage.partitions, lease_ttl=config.storage.lease_ttl, pool_size=2
            )
        except StorageError as exc:
            raise BotError(str(exc), EXIT_STORAGE) from None
        # Owns nothing: every event becomes an ingress record for its partition's owner.
        router = Router(store, config.storage.partitions, consume=False)
        for adapter, options in adapters:
            if stop.is_set():
                break
            try:
                await adapter.start(router)
            except Exception as exc:
                log.exception("adapter %s failed to start", adapter.name)
                raise BotError(f"adapter {adapter.name!r} failed to start: {exc}") from None
            started.append(adapter)
            shown = adapter_url(adapter, options)
            if shown is not None:  # HTTP mode: the Request URL is served here, not by the worker
                console.say(f"{adapter.name}: {redact_url(shown)}")
        if not stop.is_set():
            freeze_startup_heap()  # a full collection would pause acknowledgements
            console.say(READY)
            await stop.wait()
        return EXIT_OK
    finally:
        for adapter in reversed(started):
            try:
                await asyncio.wait_for(adapter.stop(), STOP_TIMEOUT)
            except Exception as exc:
                log.warning("adapter %s did not stop cleanly: %r", adapter.name, exc)
        if router is not None:
            await router.stop()
        if store is not None:
            with contextlib.suppress(Exception):
                await store.close()
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        for number in installed:
            loop.remove_signal_handler(number)
