"""The `schedule` tool's timer across restarts (DESIGN.md §5 "Scheduling", §2.6 "Timers"): on a real SQLite
file, the bot is closed (or a real process SIGKILLed) while the timer waits; reopening before the deadline fires
nothing, reopening after it fires once, with the stable request id `schedule:<timer task id>`, and the reminder
is answered and shown once; a later reopen fires nothing again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from crash.support import Run
from crash.support import run_worker as run_crash_worker

from adapters.bridge.testing import MemoryTransport
from harness_core import Submission, Task
from harness_core.messages import UserMessage, user_text
from harness_core.storage import SqliteStorage

from .support import CHANNEL, Bot, Clock, remind

BotFactory = Callable[..., Awaitable[Bot]]
MINUTE = 60_000
REMINDER = "reminder: (scheduled) check the deploy"
WORKER = Path(__file__).with_name("worker.py")


async def stored(path: Path) -> tuple[list[Task], list[Submission], list[str]]:
    """The timer tasks, the scheduled submissions, and every user text of the channel, read from the file."""
    storage = await SqliteStorage.open(path)
    try:
        timers = (await storage.scan_tasks(kind="bridge.scheduled")).items
        submissions = [
            s
            for s in (await storage.scan_submissions(limit=500)).items
            if (s.request_id or "").startswith("schedule:")
        ]
        conversation_id = timers[0].conversation_id if timers else -1
        texts = [
            user_text(m)
            for e in (await storage.scan_entries(conversation_id=conversation_id, limit=500)).items
            for m in e.model or ()
            if isinstance(m, UserMessage)
        ]
    finally:
        await storage.close()
    return timers, submissions, texts


async def test_timer_survives_close_and_fires_once_at_its_time(tmp_path: Path, bots: BotFactory) -> None:
    path = tmp_path / "bot.sqlite"
    clock = Clock()
    platform = MemoryTransport()

    async def reopen(offset_ms: int) -> Bot:
        clock.offset_ms = offset_ms
        return await bots(path, responder=remind, platform=platform, clock=clock)

    bot = await reopen(0)
    await bot.say("100.1", "remind me")
    await bot.settle()
    assert platform.texts(CHANNEL)[0].startswith("ok: Scheduled in 10 minutes (at ")
    await bot.close()
    [timer], submissions, _ = await stored(path)
    assert (timer.state.status, timer.state.deadline) == ("waiting", timer.input["at"])
    at = int(timer.input["at"])
    assert submissions == []

    bot = await reopen(5 * MINUTE)  # down for 5 minutes: not due yet
    bot.harness.resume()
    await asyncio.sleep(0.3)
    await bot.settle()
    assert bot.faux.requests == []
    await bot.close()
    [timer], submissions, _ = await stored(path)
    assert timer.state.status == "waiting" and submissions == []

    bot = await reopen(10 * MINUTE + 1000)  # down past the deadline: fires now, once
    await asyncio.wait_for(bot.harness.wait_for_task(timer.id), 10)
    await bot.settle()
    assert len(bot.faux.requests) == 1
    await bot.close()
    [timer], [submission], texts = await stored(path)
    assert timer.state.status == "terminal" and timer.ended_at is not None and timer.ended_at >= at
    assert submission.request_id == f"schedule:{timer.id}" and submission.status == "done"
    assert texts.count("(scheduled) check the deploy") == 1
    assert platform.texts(CHANNEL) == [platform.texts(CHANNEL)[0], REMINDER]

    bot = await reopen(30 * MINUTE)  # and never again
    bot.harness.resume()
    await asyncio.sleep(0.3)
    await bot.settle()
    assert bot.faux.requests == []
    await bot.close()
    _, submissions, texts = await stored(path)
    assert [s.id for s in submissions] == [submission.id]
    assert texts.count("(scheduled) check the deploy") == 1
    assert platform.texts(CHANNEL)[1:] == [REMINDER]


# --- a real process, SIGKILLed ------------------------------------------------------------------------------


async def run_worker(
    workdir: Path, action: str, options: dict[str, Any], *, kill_on: str | None = None
) -> Run:
    """Run this directory's `worker.py`; SIGKILL it when it prints `kill_on`."""
    return await run_crash_worker(workdir, action, options, kill_on=kill_on, worker=WORKER)


def posts(workdir: Path) -> list[str]:
    path = workdir / "posts.txt"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow
async def test_timer_survives_sigkill_and_a_crash_right_after_firing_submits_once(tmp_path: Path) -> None:
    armed = await run_worker(tmp_path, "remind", {}, kill_on="armed")
    assert armed.killed, armed.stderr
    timer_id, at = armed.event("armed")["timer_id"], armed.event("armed")["at"]
    assert armed.event("armed")["deadline"] == at
    first_posts = posts(tmp_path)
    assert len(first_posts) == 1  # "ok: Scheduled in ..."

    early = await run_worker(tmp_path, "resume", {"offset_ms": 5 * MINUTE})
    assert early.event("done") == {
        "event": "done",
        "timer_status": "waiting",
        "model_requests": 0,
        "shown": [],
    }, early.stderr

    # Past the deadline: the timer fires, and the process dies in the publication of that very commit.
    fired = await run_worker(tmp_path, "resume", {"offset_ms": 10 * MINUTE + 1000, "die_on_fire": True})
    assert fired.killed, fired.stderr
    assert fired.event("scheduled")["request_id"] == f"schedule:{timer_id}"
    submission_id = fired.event("scheduled")["submission_id"]

    answered = await run_worker(tmp_path, "resume", {"offset_ms": 11 * MINUTE})
    done = answered.event("done")
    assert (done["timer_status"], done["model_requests"], done["shown"]) == ("terminal", 1, [REMINDER])

    again = await run_worker(tmp_path, "resume", {"offset_ms": 30 * MINUTE})
    assert again.event("done") == {
        "event": "done",
        "timer_status": "terminal",
        "model_requests": 0,
        "shown": [],
    }

    [timer], [submission], texts = await stored(tmp_path / "bot.sqlite")
    assert timer.id == timer_id and timer.ended_at is not None and timer.ended_at >= at
    assert (submission.id, submission.request_id, submission.status) == (
        submission_id,
        f"schedule:{timer_id}",
        "done",
    )
    assert texts.count("(scheduled) check the deploy") == 1
    all_posts = posts(tmp_path)
    assert all_posts[0] == first_posts[0]
    assert len(all_posts) == 2 and len(set(all_posts)) == 2  # the reminder was posted once
