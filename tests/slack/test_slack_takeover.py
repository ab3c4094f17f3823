"""Takeover on PostgreSQL, case (a): the leader is SIGKILLed after an intake commit and before its ack, while a
standby waits for the lease. The standby takes over, Slack redelivers the unacked event (a duplicate for the
bridge, acked now), and the message is answered once."""

from __future__ import annotations

import pytest
from slack_e2e import Bots, People, replies_of_bot

from adapters.slack.testing import FakeSlack

pytestmark = pytest.mark.timeout(120)


async def test_standby_answers_a_message_the_leader_took_in_but_never_acked(
    fake: FakeSlack, people: People, bots: Bots, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_BOTS_CRASH_STORAGE_URL", pg_url)  # both processes on this database
    ops = fake.add_channel("ops")
    mention = f"<@{fake.bot_user_id}>"
    leader = await bots.start({"hold_after_intake": True})
    standby = await bots.start({}, wait_ready=False)  # waits for the lease before it connects to Slack

    post = await fake.user_posts(ops, people.alice, f"{mention} how are you")
    await leader.wait_event("held")
    # (`message` and `app_mention` both arrive; the second is a duplicate of the first)
    assert [e["outcome"] for e in leader.intakes() if e["outcome"] != "duplicate"] == ["answering"]
    assert standby.named("ready") == []
    await leader.kill()
    unacked = [d for d in post.deliveries if not d.acked]
    assert unacked, "the delivery whose intake committed must not have been acked"

    await standby.wait_event("ready", timeout=30)  # the 1 s lease of the dead leader expired
    for delivery in unacked:
        attempt = await fake.deliver(delivery)
        assert await attempt.wait_settled(10) == "acked"
    assert standby.intakes() and all(e["outcome"] == "duplicate" for e in standby.intakes())
    answer = await fake.wait_for_message(ops, contains="answer to", timeout=30)
    assert "how are you" in answer.text
    assert len(replies_of_bot(fake, ops)) == 1
