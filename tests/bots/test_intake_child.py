"""`IntakeChild`, the worker's side of its separate intake process, over small stand-in children (real
processes): it waits for the ready line, says what the child says, starts a child that exited again, stops it
with SIGTERM, and refuses to run deaf when the first start fails."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bots import cpu_priority
from bots.intake_process import READY, IntakeChild
from bots.runtime import BotError

HERE = Path(__file__).resolve().parent  # priority_support, for the worker script below

# Says it is ready, then waits for SIGTERM (exit 0). The first time (no marker file yet) it exits with code 5
# soon after it is ready, as a crashing child would.
CHILD = f"""
import os, signal, sys, time
marker = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("hello from the child", flush=True)
print({READY!r}, flush=True)
if not os.path.exists(marker):
    open(marker, "w").close()
    time.sleep(0.3)
    sys.exit(5)
while True:
    time.sleep(1)
"""
SILENT = "import time\nwhile True: time.sleep(1)\n"
FAILING = "import sys\nprint('cannot connect to Slack', flush=True)\nsys.exit(1)\n"


async def wait_until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("not in time")


async def test_a_child_that_exits_is_started_again_and_stopped_with_sigterm(tmp_path: Path) -> None:
    said: list[str] = []
    child = IntakeChild(
        [sys.executable, "-c", CHILD, str(tmp_path / "started-once")], {}, said.append, restart_delays=(0.1,)
    )
    await child.begin()
    first = child.pid
    assert child.problem() is None and child.starts == 1
    assert f"intake (pid {first}): hello from the child" in said
    # It exits with code 5: said, not ready meanwhile, started again, ready again.
    await wait_until(lambda: child.starts == 2 and child.problem() is None)
    assert child.pid != first
    assert any("the separate intake process exited (code 5)" in line for line in said), said
    process = child.process
    assert process is not None
    await child.end()
    assert process.returncode == 0  # SIGTERM: it stopped as asked
    assert child.problem() == "the separate intake process is not running"


async def test_a_first_start_that_fails_is_an_error_naming_the_exit_code() -> None:
    said: list[str] = []
    child = IntakeChild([sys.executable, "-c", FAILING], {}, said.append)
    with pytest.raises(BotError, match=r"did not start \(exit code 1\)"):
        await child.begin()
    assert any(line.endswith("cannot connect to Slack") for line in said), said


async def test_a_child_never_ready_is_stopped_and_named_after_the_timeout() -> None:
    child = IntakeChild([sys.executable, "-c", SILENT], {}, [].append, start_timeout=0.5)
    with pytest.raises(BotError, match=r"did not start within 0.5 s"):
        await child.begin()
    assert child.process is not None and child.process.returncode is not None  # not left running


async def test_stopping_while_the_child_starts_does_not_wait_out_the_start() -> None:
    stop = asyncio.Event()
    child = IntakeChild([sys.executable, "-c", SILENT], {}, [].append, start_timeout=60)
    asyncio.get_running_loop().call_later(0.3, stop.set)
    async with asyncio.timeout(10):
        await child.begin(stop)
        await child.end()
    assert child.process is not None and child.process.returncode is not None


# Start 1: ready, then exits. Start 2: hangs before its ready line. Start 3: ready, and stays.
FLAKY = f"""
import os, signal, sys, time
counter = sys.argv[1]
n = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
open(counter, "w").write(str(n))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
if n != 2:
    print({READY!r}, flush=True)
if n == 1:
    time.sleep(0.2)
    sys.exit(3)
while True:
    time.sleep(1)
"""


async def test_a_restarted_child_that_hangs_before_ready_is_stopped_and_started_again(tmp_path: Path) -> None:
    child = IntakeChild(
        [sys.executable, "-c", FLAKY, str(tmp_path / "starts")],
        {},
        [].append,
        start_timeout=1.0,
        restart_delays=(0.1,),
    )
    await child.begin()
    try:
        await wait_until(lambda: child.starts == 3 and child.problem() is None)
    finally:
        await child.end()


# A worker in a session of its own (as under a service manager): it lowers its threads and, where the kernel
# groups CPU time by session, its session; children it starts (and starts again) keep the normal priority.
LOWERING = f"""
import asyncio, json, os, sys
from bots.cpu_priority import lower_priority
from priority_support import session_nice, thread_nice
from bots.intake_process import IntakeChild

async def main():
    child = IntakeChild([sys.executable, "-c", {CHILD!r}, sys.argv[1]], {{}}, lambda line: None,
                        restart_delays=(0.1,))
    await child.begin()
    lowered = lower_priority(7, keep={{child.spawner.thread_id}})
    while child.starts < 2 or child.problem() is not None:  # the stand-in exits once; started again
        await asyncio.sleep(0.05)
    second = child.pid
    assert second is not None
    report = {{
        "lowered_session": lowered.session,
        "worker": thread_nice(os.getpid()),
        "worker_session": session_nice(os.getpid()),
        "second": thread_nice(second),
        "second_session": session_nice(second),
        "autogroup": open("/proc/sys/kernel/sched_autogroup_enabled").read().strip() == "1",
    }}
    await child.end()
    print(json.dumps(report), flush=True)

asyncio.run(main())
"""


async def test_a_worker_leading_its_session_lowers_it_and_its_threads_but_never_its_children(
    tmp_path: Path,
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LOWERING,
        str(tmp_path / "started-once"),
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
        },
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, out
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report["worker"] == 7
    assert report["second"] == 0  # started again after the worker lowered itself: forked by the spawner
    if report["autogroup"]:  # the kernel shares CPU time between sessions: the worker's session is lowered
        assert report["lowered_session"] and report["worker_session"] == 7
        assert report["second_session"] == 0
    else:
        assert not report["lowered_session"]


async def test_stopping_while_a_restart_forks_stops_the_child_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[subprocess.Popen[bytes]] = []
    forking = threading.Event()
    popen = cpu_priority._popen

    def slow_fork(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        if started:  # the restart: a fork that takes a while (a busy machine), still running when `end` comes
            forking.set()
            time.sleep(0.5)
        started.append(popen(argv, env))
        return started[-1]

    monkeypatch.setattr(cpu_priority, "_popen", slow_fork)
    child = IntakeChild(
        [sys.executable, "-c", CHILD, str(tmp_path / "started-once")], {}, [].append, restart_delays=(0.05,)
    )
    await child.begin()
    await wait_until(forking.is_set)
    await child.end()
    await wait_until(lambda: len(started) == 2)
    await wait_until(lambda: started[1].returncode is not None, 5)  # killed and reaped, not left unwatched
