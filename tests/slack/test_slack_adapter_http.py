"""The Slack adapter over the HTTP Events API (a real bot process serving signed requests from the fake):
signature verification before anything is read, malformed payloads answered without losing later messages,
clicks over HTTP."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from slack_e2e import Bots, People, approval_messages, button, replies_of_bot

from adapters.slack.safe_text import slack_text
from adapters.slack.testing import FakeSlack

HTTP = {"slack": {"mode": "http", "port": 0}}


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(mode="http", ack_timeout=10.0) as running:
        yield running


def event_body(fake: FakeSlack, event: Any, event_id: str) -> dict[str, Any]:
    return {
        "token": "fake-verification-token",
        "team_id": fake.team_id,
        "api_app_id": fake.app_id,
        "type": "event_callback",
        "event_id": event_id,
        "event_time": int(time.time()),
        "event": event,
    }


async def test_bad_signatures_are_refused_and_malformed_payloads_lose_nothing(
    fake: FakeSlack, people: People, bots: Bots
) -> None:
    general = fake.add_channel("general")
    bot = await bots.start(HTTP)
    fake.request_url = bot.url
    assert await fake.verify_url()  # Slack's url_verification challenge is answered

    mention = f"<@{fake.bot_user_id}>"
    forged = event_body(
        fake,
        {
            "type": "message",
            "channel": general.id,
            "channel_type": "channel",
            "user": people.mallory.id,
            "text": f"{mention} forged: deploy everything",
            "ts": "1700000000.000100",
        },
        "EvFORGED",
    )
    for signature, timestamp in (("invalid", None), ("missing", None), ("valid", int(time.time()) - 600)):
        result = await fake.post_to_app(forged, signature=signature, timestamp=timestamp)  # type: ignore[arg-type]
        assert result.status == 401, (signature, timestamp, result)

    undecodable = await fake.post_to_app(b"\xff\xfe{not json at all")
    assert undecodable.status == 400
    assert undecodable.headers.get("x-slack-no-retry") == "1"

    broken_events: list[Any] = [
        {"type": "message", "channel": general.id, "user": people.alice.id, "text": "no ts"},
        {"type": "message", "channel": general.id, "ts": "1700000000.000200", "text": "no user"},
        {"type": "app_mention", "user": people.alice.id, "text": mention},
        {"type": "reaction_added", "user": people.alice.id, "reaction": "eyes"},  # not handled: still acked
    ]
    for index, event in enumerate(broken_events):
        result = await fake.post_to_app(event_body(fake, event, f"EvBROKEN{index}"))
        assert result.status == 200, (event, result)
    garbage = await fake.post_to_app({"type": "event_callback", "event": "not an object", "event_id": "EvX"})
    assert garbage.status == 200, garbage

    post = await fake.user_posts(general, people.alice, f"{mention} is the api up?")
    await post.wait_acked()
    answer = await fake.wait_for_message(general, contains="is the api up?", timeout=10)
    await bot.stop()
    assert answer.text == slack_text(
        f"answer to Alice: {mention} is the api up? [saw: Alice: {mention} is the api up?]"
    )
    assert [e["text"] for e in bot.intakes() if e["outcome"] != "duplicate"] == [f"{mention} is the api up?"]
    assert "forged" not in bot.log()  # refused before the body was looked at
    assert bot.log().count("missing, stale or invalid signature") == 3
    assert "undecodable" in bot.log()
    assert bot.log().count("ignoring a malformed") == 3
    assert bot.log().count("acknowledging a malformed request") == 1
    assert len(replies_of_bot(fake, general)) == 1


async def test_http_retries_are_deduplicated_and_clicks_work_over_http(
    fake: FakeSlack, people: People, bots: Bots
) -> None:
    ops = fake.add_channel("ops")
    bot = await bots.start({**HTTP, "approvers": [people.boss.id, people.carol.id]})
    fake.request_url = bot.url
    post = await fake.user_posts(ops, people.boss, f"<@{fake.bot_user_id}> deploy api")
    await post.wait_acked()
    assert post.message_delivery is not None
    retry = await fake.deliver(post.message_delivery, retry_num=1, retry_reason="http_timeout")
    assert await retry.wait_settled(10) == "acked"
    [request] = await fake.wait_for(lambda: approval_messages(fake, ops) or None, 10)
    own = await fake.click(ops, request.ts, button(request, "approve"), user=people.boss)
    assert own.acked
    await fake.wait_for(lambda: fake.ephemerals, 10)
    assert [(e.user, e.text) for e in fake.ephemerals] == [
        (people.boss.id, "You cannot approve or deny your own request for `deploy`.")
    ]
    click = await fake.click(ops, request.ts, button(request, "approve"), user=people.carol)
    assert click.acked
    await fake.wait_for(
        lambda: (
            [m.text for m in replies_of_bot(fake, ops)]
            == [
                "Deploying api once approved.\n\nThe deploy of api waits for approval.",
                "deploy finished: deployed api",
            ]
        ),
        10,
    )
    await bot.stop()
    assert len(bots.ledger()) == 1
    assert [e["outcome"] for e in bot.intakes()].count("answering") == 1
    assert json.dumps(fake.message(ops, request.ts).blocks).count("Approved by Carol") == 1
