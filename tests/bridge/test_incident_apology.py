"""An internal failure reaches the chat only as a short apology with an incident id; the log line with the
same id holds the detail (paths, class names)."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from adapters.bridge.text import render_unanswered
from harness_core import StorageCorrupt

from .support import CHANNEL, Bot

Bots = Callable[..., Awaitable[Bot]]
PATH = "/srv/durable-bots/var/bot.sqlite"


async def test_a_corrupt_page_found_mid_answer_shows_an_apology_and_logs_the_detail(
    bots: Bots, caplog: pytest.LogCaptureFixture
) -> None:
    bot = await bots()
    storage: Any = bot.harness.session.storage
    scan = storage.scan_entries
    broken = [True]

    async def scan_once_broken(*args: Any, **kwargs: Any) -> Any:
        if broken:
            broken.clear()
            raise StorageCorrupt(f"storage {PATH} holds an unreadable entries row")
        return await scan(*args, **kwargs)

    storage.scan_entries = scan_once_broken
    with caplog.at_level(logging.ERROR, logger="adapters.bridge"):
        await bot.say("1.1", "<@BOT> status?")
        await bot.settle()
    assert not broken, "the generation never read its context"
    [shown] = bot.platform.texts(CHANNEL)
    found = re.fullmatch(
        r"⚠️ Sorry, something went wrong on my side while answering \(incident ([0-9a-f]{8})\)\.", shown
    )
    assert found is not None, shown
    for leak in (PATH, "StorageCorrupt", "faulted", "Something broke"):
        assert leak not in shown
    logged = [r.getMessage() for r in caplog.records if found.group(1) in r.getMessage()]
    assert logged and PATH in logged[0] and "StorageCorrupt" in logged[0]


def test_internal_reasons_never_show_their_detail_and_known_ones_keep_theirs() -> None:
    for reason in ("faulted", "missing_task", "something_new", None):
        text = render_unanswered(reason, f"KeyError: {PATH}", "abc12345")
        assert text == "⚠️ Sorry, something went wrong on my side while answering (incident abc12345)."
    assert render_unanswered("model_error", "rate limited (429)") == "⚠️ The model failed: rate limited (429)"
    assert render_unanswered("aborted", None) == "⚠️ Stopped."
    # the same failure shows the same id in every process that renders it
    assert (
        render_unanswered("faulted", "x")
        == render_unanswered("faulted", "x")
        != render_unanswered("faulted", "y")
    )
