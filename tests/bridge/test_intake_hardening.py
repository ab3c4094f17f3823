"""Intake of hostile outside text: lone surrogates become U+FFFD and the message is answered once (also after a
restart); a reused request id with other content is a loud `RequestIdConflict`, not a silent duplicate; a
message the harness refuses is logged with its id and dropped while the next one is still taken in."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.bridge import (
    IncomingMessage,
    MessageDoc,
    PayloadTooDeep,
    Place,
    may_hold_surrogates,
    valid_payload,
    valid_text,
)
from harness_core import StrictJsonError

from .support import CHANNEL, Bot

Bots = Callable[..., Awaitable[Bot]]


def test_valid_text_replaces_lone_surrogates_and_joins_split_pairs() -> None:
    assert valid_text("plain") == "plain"
    assert valid_text("a\ud83db") == "a\ufffdb"
    assert valid_text("\udc00") == "\ufffd"
    assert valid_text("\ud83d\ude00") == "\U0001f600"  # a pair split into two code points is one character
    assert valid_payload({"k\ud800": ["x\udfff", 1, None, {"y": "\ud83d"}]}) == {
        "k\ufffd": ["x\ufffd", 1, None, {"y": "\ufffd"}]
    }
    nested: Any = "leaf"
    for _ in range(100):
        nested = [nested]
    with pytest.raises(PayloadTooDeep):
        valid_payload(nested)
    for raw in ('"\\ud83d"', '"\\udc00"', '"\\uDFFF"', b'"\\ud800"', "\ud800"):
        assert may_hold_surrogates(raw), raw
    for raw in ('"\\u0041"', '"\\ue000"', b"plain", "plain \U0001f600"):
        assert not may_hold_surrogates(raw), raw


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF)))
def test_valid_text_always_encodes_and_keeps_valid_text(text: str) -> None:
    fixed = valid_text(text)
    fixed.encode("utf-8")  # never raises
    if not any("\ud800" <= c <= "\udfff" for c in text):
        assert fixed is text


async def test_lone_surrogates_are_answered_once_and_survive_a_restart(bots: Bots, tmp_path: Path) -> None:
    path = tmp_path / "bot.sqlite"
    place = Place("memory", "T\ud83d", "C\udc00")
    bot = await bots(path)
    message = IncomingMessage(place, "100.1", "U\ud800", "al\udc00ice", "<@BOT> hi \ud83d there", True)
    first = await bot.bridge.intake(message)
    assert first.outcome == "answering"
    assert (await bot.bridge.intake(message)).outcome == "duplicate"  # the retry of the same post
    await bot.settle()
    fixed = Place("memory", "T\ufffd", "C\ufffd")
    assert bot.platform.texts(fixed) == ["answer to al\ufffdice: <@BOT> hi \ufffd there"]
    await bot.close()

    again = await bots(path, platform=bot.platform)  # a clean restart over the same store
    assert (await again.bridge.intake(message)).outcome == "duplicate"
    assert (await again.say("100.2", "<@BOT> next", place=fixed)).outcome == "answering"
    await again.settle()
    assert again.platform.texts(fixed) == [
        "answer to al\ufffdice: <@BOT> hi \ufffd there",
        "answer to alice: <@BOT> next",
    ]
    assert len(again.faux.requests) == 1


async def test_a_reused_id_with_other_content_is_a_loud_conflict(
    bots: Bots, caplog: pytest.LogCaptureFixture
) -> None:
    bot = await bots()
    assert (await bot.say("7", "<@BOT> first post")).outcome == "answering"
    assert (await bot.say("7", "<@BOT> first post", name="Alice Renamed")).outcome == "duplicate"
    with caplog.at_level(logging.ERROR, logger="adapters.bridge"):
        conflict = await bot.say("7", "<@BOT> a different post under the same id")
    assert conflict.outcome == "conflict"
    assert [r.getMessage() for r in caplog.records if "RequestIdConflict" in r.getMessage()] != []
    assert "memory:T1:C1:7" in caplog.text
    await bot.settle()
    assert bot.platform.texts(CHANNEL) == ["answer to alice: <@BOT> first post"]
    record = await bot.harness.snapshot(MessageDoc, key="memory:T1:C1:7")
    assert record is not None and record["digest"]


async def test_a_message_the_harness_refuses_is_logged_and_dropped(
    bots: Bots, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    bot = await bots()
    original = bot.harness.submit_in

    async def refusing(tx: Any, conversation_id: int, draft: Any) -> Any:
        if "poison" in str(getattr(draft, "content", "")):
            raise StrictJsonError("$.content: not valid JSON")
        return await original(tx, conversation_id, draft)

    monkeypatch.setattr(bot.harness, "submit_in", refusing)
    with caplog.at_level(logging.ERROR, logger="adapters.bridge"):
        refused = await bot.say("1", "<@BOT> poison")
    assert refused.outcome == "refused"
    assert "memory:T1:C1:1" in caplog.text and "StrictJsonError" in caplog.text
    assert (await bot.say("2", "<@BOT> fine")).outcome == "answering"
    await bot.settle()
    assert bot.platform.texts(CHANNEL) == ["answer to alice: <@BOT> fine"]
    assert not bot.harness.closed.done()
