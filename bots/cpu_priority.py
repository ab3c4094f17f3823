"""A worker below its separate intake process on the CPU (`[workers] worker_nice`, issue 16).

Why: on a machine whose CPU is saturated an acknowledgement waits for the CPU like everything else. The intake
child does little work, but must do it at once (Slack sends an event again when it is not acknowledged within
3 s, and the benchmark goal is a 10 ms p99); the worker's turns only end a little later when they yield to it.
Linux shares the CPU by weight at two levels: between sessions when the kernel groups tasks by session
(autogroup, for tasks in the root cgroup: a desktop, a plain VM) and between threads within a group (a
container or a systemd service with the CPU controller). So the worker lowers both: its session's group, only
when it leads that session (a shell it was started from is never slowed), and each of its own threads. The
child keeps the normal priority: it runs in a session of its own, and it is started from a thread kept at the
normal priority (`Spawner`), since a new process inherits the niceness of the thread that forks it and an
unprivileged process can never raise it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

AUTOGROUP_SWITCH = Path("/proc/sys/kernel/sched_autogroup_enabled")
AUTOGROUP = Path("/proc/self/autogroup")
TASKS = Path("/proc/self/task")


@dataclass(frozen=True)
class Lowered:
    """What `lower_priority` changed: threads set to `nice`, and whether the session's group was too."""

    nice: int
    threads: int
    session: bool
    problem: str | None = None

    def describe(self) -> str:
        if self.problem is not None:
            return f"durable-bots: worker CPU priority not lowered: {self.problem}"
        where = "its threads" + (" and its session" if self.session else "")
        return f"durable-bots: worker CPU priority lowered to nice {self.nice} ({where}), below its intake process"


def lower_priority(nice: int, *, keep: Collection[int] = ()) -> Lowered:
    """Set every thread of this process except those in `keep` (native thread ids) to niceness `nice` (never
    raising one that is already lower), and the session's group when this process leads its session."""
    if not TASKS.is_dir():
        return Lowered(nice, 0, False, "per-thread priorities are Linux only")
    changed = 0
    for entry in TASKS.iterdir():
        tid = int(entry.name)
        if tid in keep:
            continue
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed += 1
    return Lowered(nice, changed, _lower_session(nice))


def _lower_session(nice: int) -> bool:
    try:
        if AUTOGROUP_SWITCH.read_text().strip() != "1" or os.getsid(0) != os.getpid():
            return False
        AUTOGROUP.write_text(str(nice))
    except OSError:
        return False  # no autogroup in this kernel, or not allowed: the threads' niceness still applies
    return True


class Spawner:
    """Starts child processes from a thread of its own, started before the worker lowers its priority, so a
    child (and a child started again after it exited) gets the normal priority, not the worker's."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="child-spawner")
        self.thread_id: int = self._executor.submit(threading.get_native_id).result()

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> SpawnedProcess:
        """Start `argv` in a session of its own, stdout piped, stdin from /dev/null."""
        starting = asyncio.get_running_loop().run_in_executor(self._executor, _popen, list(argv), dict(env))
        try:
            popen = await asyncio.shield(starting)
        except asyncio.CancelledError:
            # The fork goes on in the thread: a child started after all is stopped, never left unwatched.
            starting.add_done_callback(_stop_started)
            raise
        try:
            return await SpawnedProcess.attach(popen)
        except BaseException:
            _stop(popen)
            raise

    def close(self) -> None:
        self._executor.shutdown(wait=False)


def _popen(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True
    )


def _stop_started(starting: asyncio.Future[subprocess.Popen[bytes]]) -> None:
    if not starting.cancelled() and starting.exception() is None:
        _stop(starting.result())


def _stop(popen: subprocess.Popen[bytes]) -> None:
    """Kill and reap a child nobody will watch (SIGKILL: it exits at once, so the wait is short)."""
    with contextlib.suppress(ProcessLookupError):
        popen.kill()
    popen.wait()
    if popen.stdout is not None:
        popen.stdout.close()


class SpawnedProcess:
    """The part of `asyncio.subprocess.Process` the worker uses, over a `subprocess.Popen` started elsewhere:
    `pid`, `returncode`, `stdout` (a stream reader), `wait()`, `send_signal()`, `kill()`."""

    def __init__(self, popen: subprocess.Popen[bytes], stdout: asyncio.StreamReader) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdout = stdout
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @classmethod
    async def attach(cls, popen: subprocess.Popen[bytes]) -> SpawnedProcess:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        assert popen.stdout is not None
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), popen.stdout)
        process = cls(popen, reader)
        process._watch_exit(loop)
        return process

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, signal: int) -> None:
        if self._popen.returncode is not None:
            raise ProcessLookupError(self.pid)
        self._popen.send_signal(signal)

    def kill(self) -> None:
        if self._popen.returncode is not None:
            raise ProcessLookupError(self.pid)
        self._popen.kill()

    def _watch_exit(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfd (not Linux 5.3+): a thread waits instead
            waiting = loop.run_in_executor(None, self._popen.wait)
            waiting.add_done_callback(lambda done: self._settle(done.result()))
            return

        def exited() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._settle(self._popen.wait())  # it has exited: reaping does not block

        loop.add_reader(pidfd, exited)

    def _settle(self, code: int) -> None:
        if not self._exited.done():
            self._exited.set_result(code)
