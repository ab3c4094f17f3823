"""A bot process (SQLite + bridge + `MemoryTransport` + faux model) that the schedule restart test starts,
SIGKILLs and starts again on the same store.

    python tests/bridge/worker.py <action> <workdir> [options as JSON]

Actions:
- `remind`: "remind me" is taken in; the model calls `schedule` (10 minutes). When the timer waits and the
  answer is shown, prints `armed` (timer id, deadline) and waits to be killed.
- `resume`: opens the store and resumes. If the timer is due it waits for it to fire and for the reminder to be
  answered and shown; otherwise it gives the timer a moment. Prints `done` (what this process did), closes.

Options: `offset_ms` moves this process's clock forward (the bot was down that long); `die_on_fire` makes the
process SIGKILL itself in the very publication that commits the scheduled input (a crash right after firing).
Every post is appended to `<workdir>/posts.txt` so the test counts posts across processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from support import Clock, open_bot, remind

from adapters.bridge.testing import PostedMessage
from harness_core import Publication, Task

ACTION = sys.argv[1]
WORKDIR = Path(sys.argv[2])
OPTIONS: dict[str, Any] = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def record_post(message: PostedMessage) -> None:
    with open(WORKDIR / "posts.txt", "a") as handle:
        handle.write(f"{message.key}\n")
        handle.flush()
        os.fsync(handle.fileno())


def on_publication(publication: Publication) -> None:
    for submission in publication.submissions:
        if (submission.request_id or "").startswith("schedule:") and submission.status != "done":
            emit("scheduled", request_id=submission.request_id, submission_id=submission.id)
            if OPTIONS.get("die_on_fire"):
                os.kill(os.getpid(), signal.SIGKILL)


async def timer_task(bot: Any) -> Task | None:
    tasks = (await bot.harness.session.storage.scan_tasks(kind="bridge.scheduled")).items
    assert len(tasks) <= 1, tasks
    return tasks[0] if tasks else None


async def main() -> None:
    clock = Clock(int(OPTIONS.get("offset_ms", 0)))
    bot = await open_bot(WORKDIR / "bot.sqlite", responder=remind, clock=clock)
    bot.platform.on_create = record_post
    bot.harness.add_publication_listener(on_publication)
    if ACTION == "remind":
        await bot.say("100.1", "remind me")
        await bot.settle()
        for _ in range(500):
            timer = await timer_task(bot)
            if timer is not None and timer.state.status == "waiting":
                break
            await asyncio.sleep(0.01)
        assert timer is not None
        emit("armed", timer_id=timer.id, at=timer.input["at"], deadline=timer.state.deadline)
        await asyncio.Event().wait()  # until killed
    elif ACTION == "resume":
        bot.harness.resume()
        timer = await timer_task(bot)
        assert timer is not None
        if timer.state.live and timer.input["at"] <= clock():
            await asyncio.wait_for(bot.harness.wait_for_task(timer.id), 10)
        else:
            await asyncio.sleep(0.3)
        await bot.settle()
        timer = await timer_task(bot)
        assert timer is not None
        emit(
            "done",
            timer_status=timer.state.status,
            model_requests=len(bot.faux.requests),
            shown=[m.text for m in bot.platform.messages],
        )
    await bot.close()


if __name__ == "__main__":
    asyncio.run(main())
