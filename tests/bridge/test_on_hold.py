"""What a reply shows for a task parked after repeated process deaths, and what becomes of it when the task is
retried. The end-to-end path, with real kills, a real park at reopen and `retry`, is in
tests/bots/test_bots_operations.py and tests/devchat/test_devchat_browser.py; here a running task is marked parked
by the commit the reopen would make, so the platform's side (an edit window that has passed) can be staged."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from adapters.bridge import Place
from adapters.bridge.model import EditExpired, RetryLater
from adapters.bridge.text import QUEUED, WAITING_BEHIND_HOLD, is_status_only, render_partial
from harness_core import Tx, tool
from harness_core.messages import AssistantMessage, ToolResultMessage
from harness_core.models import ModelRequest
from harness_core.models.faux import faux_assistant, faux_tool_call

from .support import CHANNEL, Bot, user_texts

Bots = Callable[..., Awaitable[Bot]]


def test_a_parked_answer_or_tool_call_says_so_in_the_chats_terms() -> None:
    live = {
        "run": {"task_id": 12, "inputs": [3]},
        "generation": {"message": {"content": [{"type": "text", "text": "Looking at the logs"}]}},
    }
    assert render_partial(live, [], {12: 6}).splitlines() == [
        "Looking at the logs …",
        "⚠️ The bot stopped 6 times in a row while writing this answer, so that is on hold until an operator "
        "retries it (task 12).",
    ]
    tools = {
        "run": {"task_id": 12, "inputs": [3]},
        "tools": [
            {"name": "search_logs", "task_id": 13, "status": "done"},
            {"name": "fragile", "task_id": 14, "status": "running"},
            {"name": "open_ticket", "task_id": 15, "status": "pending"},
        ],
    }
    assert render_partial(tools, [], {14: 2}).splitlines() == [
        "⚠️ The bot stopped 2 times in a row while running `fragile`, so that is on hold until an operator "
        "retries it (task 14).",
        "⏳ `open_ticket` queued",
    ]
    assert "on hold" not in render_partial(tools, [])  # nothing parked: the usual status lines


def test_only_status_lines_count_as_status() -> None:
    assert is_status_only("…") and is_status_only(WAITING_BEHIND_HOLD) and is_status_only(QUEUED)
    assert is_status_only("⚙️ running `deploy`…\n⏳ `open_ticket` queued")
    assert not is_status_only("Looking at the logs …\n⚙️ running `search_logs`…")  # answer text goes with it
    assert not is_status_only("") and not is_status_only("the build is green")
    # Every status line render_partial writes is recognised (the marks and the renderer must agree).
    live = {
        "run": {"task_id": 12, "inputs": [3]},
        "generation": {"retry": {"attempt": 1}},
        "tools": [
            {"name": "deploy", "task_id": 13, "status": "pending"},
            {"name": "search_logs", "task_id": 14, "status": "running"},
            {"name": "open_ticket", "task_id": 15, "status": "pending"},
            {"name": "fragile", "task_id": 16, "status": "running"},
        ],
    }
    rendered = render_partial(live, ["deploy"], {16: 2, 12: 3})
    assert len(rendered.splitlines()) == 6 and is_status_only(rendered), rendered
    assert is_status_only(render_partial({}, []))  # the bare placeholder


@pytest.mark.parametrize("restarted", [False, True], ids=["same process", "after a restart"])
async def test_notices_that_can_no_longer_be_edited_are_replaced_not_left_saying_on_hold(
    bots: Bots, restarted: bool
) -> None:
    release = asyncio.Event()
    bot, task_id = await parked_fragile_call(bots, release)
    await until(lambda: any("on hold" in text for text in bot.platform.texts(CHANNEL)), "the on-hold line")
    await bot.say("1.2", "<@BOT> is the build green?", user="U2", name="bob")
    await until(lambda: WAITING_BEHIND_HOLD in bot.platform.texts(CHANNEL), "the waiting notice")
    held = [m.id for m in bot.platform.in_place(CHANNEL)]
    assert len(held) == 2

    # Hours later: the platform refuses edits of those two messages (Discord after an hour, a Slack edit window).
    plain_edit = bot.platform.edit

    async def edit(target: Place, message_id: str, text: str, key: str, *, final: bool) -> Any:
        if message_id in held:
            raise EditExpired(f"{message_id} is too old to edit")
        return await plain_edit(target, message_id, text, key, final=final)

    bot.platform.edit = edit  # type: ignore[method-assign]
    plain_delete = bot.platform.delete
    limited: set[str] = set()

    async def delete(target: Place, message_id: str, key: str) -> None:  # each first delete is rate limited
        if message_id not in limited:
            limited.add(message_id)
            raise RetryLater(0.01)
        await plain_delete(target, message_id, key)

    bot.platform.delete = delete  # type: ignore[method-assign]
    if restarted:
        bot.bridge.shown.clear()  # what a new process knows of the texts shown: nothing
    await bot.harness.retry_task(task_id)
    release.set()
    await bot.settle()
    # Each answer in a new message (the two race for the channel: either may come first); the notices that could
    # not be edited are gone, not left saying "on hold".
    assert sorted(bot.platform.texts(CHANNEL)) == [
        "answer to is the build green?",
        "tool said: worked this time",
    ]
    assert not set(held) & {m.id for m in bot.platform.in_place(CHANNEL)}
    assert limited == set(held)  # each delete was rate limited once, then made


async def test_a_parked_task_cancelled_by_the_operator_leaves_no_on_hold_text(bots: Bots) -> None:
    bot, task_id = await parked_fragile_call(bots, asyncio.Event())
    await bot.say("1.2", "<@BOT> is the build green?", user="U2", name="bob")
    await until(lambda: WAITING_BEHIND_HOLD in bot.platform.texts(CHANNEL), "the waiting notice")
    assert await bot.harness.abort_task(task_id) in ("marked", "terminal")  # `durable-bots cancel`
    await bot.settle()
    texts = bot.platform.texts(CHANNEL)
    assert not [text for text in texts if "on hold" in text], texts
    assert "answer to is the build green?" in texts  # bob's question answered after all


async def parked_fragile_call(bots: Bots, release: asyncio.Event) -> tuple[Bot, int]:
    """A bot whose answer to alice runs `fragile` (it hangs until `release`; in the real case it kills its
    process until repaired), with that tool task parked as reopening after the limit of deaths leaves it and
    every live reply shown again (what the restarted bridge does). Returns the bot and the task id."""

    @tool
    async def fragile() -> str:
        """Hangs until released."""
        await release.wait()
        return "worked this time"

    def responder(request: ModelRequest) -> AssistantMessage:
        last = request.messages[-1]
        if isinstance(last, ToolResultMessage):
            return faux_assistant(f"tool said: {last.text()}")
        text = user_texts(request)[-1]
        if "fragile" in text:
            return faux_assistant([faux_tool_call("fragile", {}, id="f1")])
        return faux_assistant(f"answer to {text.split('> ')[-1]}")

    bot = await bots(responder=responder, tools=[fragile])
    await bot.say("1.1", "<@BOT> run fragile", user="U1", name="alice")
    task_id = await until_running(bot, "core.tool")

    async def park(tx: Tx) -> None:
        task = await tx.task(task_id)
        assert task is not None
        tx.put_task(task.model_copy(update={"parked": True, "restarts": 2}))

    await bot.harness.commit(park)
    for key in list(bot.bridge.delivery.active):
        bot.bridge.delivery.kick(key)
    return bot, task_id


async def until_running(bot: Bot, kind: str) -> int:
    for _ in range(500):
        running = [
            t for t in (await bot.harness.inspect()).tasks if t.record.kind == kind and t.state == "running"
        ]
        if running:
            return running[0].record.id
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {kind} task ran")


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never saw {what}")
