"""The Slack adapter under SIGKILL: a real bot process is killed at exact moments and restarted on the same
store (SQLite, then PostgreSQL) while the fake Slack keeps running. After each restart: no message lost, no duplicate post, no
duplicate deploy, no approval asked twice.

The kill moments come from outside the product code: the fake Slack kills the process when a request reaches
it (`kill_on`), or the test kills it when the bot process reports a state (`held`). No timing asserts."""

from __future__ import annotations

from typing import Any

import pytest
from slack_e2e import STORY, Bots, People, approval_messages, button, replies_of_bot

from adapters.slack.testing import FakeSlack, RecordedCall

# Every test runs on SQLite and on PostgreSQL (the `crash_backend` fixture, tests/conftest.py).
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("crash_backend")]


def newest_pid(bots: Bots) -> Any:
    """The pid of the bot started last, read when a kill hook fires (the bot may not be ready yet)."""
    return lambda: bots.started[-1].pid


def text_of(call: RecordedCall) -> str:
    return str(call.args.get("markdown_text") or call.args.get("text") or "")


async def test_approval_flow_survives_a_kill_at_every_step(
    fake: FakeSlack, people: People, bots: Bots
) -> None:
    ops = fake.add_channel("ops")
    fake.add_usergroup("oncall", [people.carol], group_id="SONCALL")
    options: dict[str, Any] = {"approvers": ["UBOSS"], "groups": ["SONCALL"]}
    mention = f"<@{fake.bot_user_id}>"

    # (a) SIGKILL after the intake commit, before the ack: Slack never saw an ack and redelivers later.
    bot = await bots.start({**options, "hold_after_intake": True})
    post = await fake.user_posts(ops, people.alice, f"{mention} please deploy api")
    await bot.wait_event("held")
    assert [e["outcome"] for e in bot.intakes() if e["outcome"] != "duplicate"] == ["answering"]
    await bot.kill()
    unacked = [d for d in post.deliveries if not d.acked]
    assert unacked, "the delivery whose intake committed must not have been acked"

    # (b) SIGKILL when the approval request reached Slack, before the bridge recorded its id.
    approval_post = fake.kill_on(
        "chat.postMessage", newest_pid(bots), after_effect=True, match=lambda c: "blocks" in c.args
    )
    bot = await bots.start(options, wait_ready=False)
    assert await bot.wait_exit() == -9
    assert len(approval_post.fired) == 1
    [request] = approval_messages(fake, ops)
    approve = button(request, "approve")

    # Restart; Slack redelivers what was never acked: a duplicate for the bridge, acked now, answered once.
    bot = await bots.start(options)
    for delivery in unacked:
        attempt = await fake.deliver(delivery)
        assert attempt.retry_num >= 1
        assert await attempt.wait_settled(10) == "acked"
    assert bot.intakes() and all(e["outcome"] == "duplicate" for e in bot.intakes())

    # (c) SIGKILL while Carol's click looks up her groups, before the decision commit: the click is not
    # acknowledged (a click is committed before its ack), so Slack tells her it failed; nothing is decided.
    groups_lookup = fake.kill_on("usergroups.users.list", newest_pid(bots), after_effect=False)
    # (Not waiting out the ack window: once the process is dead no ack can come, so "no ack at all" is final.)
    click = await fake.click(ops, request.ts, approve, user=people.carol, wait=False)
    assert await bot.wait_exit() == -9
    assert not click.attempt.acked
    assert len(groups_lookup.fired) == 1
    assert bots.ledger() == []
    assert any(
        b.get("type") == "actions" for b in fake.message(ops, request.ts).blocks or []
    )  # still pending

    # After the restart, clicks by people who are no approvers (one of them the requester) are refused
    # privately; nothing is decided. Then Carol clicks again: SIGKILL right after her decision is committed,
    # before the ack and before the tool runs.
    bot = await bots.start({**options, "die_on_decision": True})
    for clicker in (people.mallory, people.alice):
        result = await fake.click(ops, request.ts, approve, user=clicker)
        assert result.acked
    await fake.wait_for(lambda: len(fake.ephemerals) == 2, 10)
    refusals = {e.user: e.text for e in fake.ephemerals}
    assert "not an approver" in refusals[people.mallory.id]
    assert "not an approver" in refusals[people.alice.id]
    click = await fake.click(ops, request.ts, approve, user=people.carol, wait=False)
    assert await bot.wait_exit() == -9
    assert not click.attempt.acked
    assert bots.ledger() == []

    # (d) The committed decision runs the tool after the restart; SIGKILL inside the tool, after its effect.
    bot = await bots.start({**options, "die_in_deploy": True}, wait_ready=False)
    assert await bot.wait_exit() == -9
    assert len(bots.ledger()) == 1

    # (e) SIGKILL before the report reaches Slack: the tool is not run again (it is not replay-safe: the
    # outcome says it may have partially run), and the report's first post never landed.
    hold = {"when": "(approval #", "after_chunks": 2}
    report_post = fake.kill_on(
        "chat.postMessage",
        newest_pid(bots),
        after_effect=False,
        match=lambda c: "blocks" not in c.args,  # the only answer posted in this process is the report
    )
    bot = await bots.start({**options, "hold": hold}, wait_ready=False)
    assert await bot.wait_exit() == -9
    assert len(report_post.fired) == 1

    # (f) SIGKILL mid-stream: the report is being shown when the process dies.
    mid_stream = fake.kill_on(
        "chat.update", newest_pid(bots), after_effect=True, match=lambda c: "deploy finished" in text_of(c)
    )
    bot = await bots.start({**options, "hold": hold}, wait_ready=False)
    assert await bot.wait_exit() == -9
    assert len(mid_stream.fired) == 1
    assert text_of(mid_stream.fired[0]).endswith(" …")  # a partial: the model was still writing

    # The last restart finishes the same report message.
    report = "deploy finished: Tool deploy was interrupted and may have partially run"
    bot = await bots.start(options)
    await fake.wait_for(lambda: report in [m.text for m in replies_of_bot(fake, ops)], 15)
    await fake.wait_for(lambda: "Approved by Carol" in str(fake.message(ops, request.ts).blocks), 10)

    # A late click is told who decided, and when.
    late = await fake.click(
        ops, request.ts, approve, user=people.boss, stale=True
    )  # a client not yet updated
    assert late.acked
    await fake.wait_for(lambda: any(e.user == people.boss.id for e in fake.ephemerals), 10)
    await bot.stop()

    [late_answer] = [e.text for e in fake.ephemerals if e.user == people.boss.id]
    assert late_answer.startswith("This request for `deploy` was already approved by Carol at <!date^")
    assert len(bots.ledger()) == 1  # deployed exactly once, across eight processes
    assert approval_messages(fake, ops) == [request]  # asked once
    assert not any(b.get("type") == "actions" for b in fake.message(ops, request.ts).blocks or [])
    answers = [m.text for m in replies_of_bot(fake, ops)]
    # The explanation streamed before the gated call stays above the answer; the report once, after the card.
    assert answers == ["Deploying api once approved.\n\nThe deploy of api waits for approval.", report]
    assert all(d.acked for d in post.deliveries)
    assert not [e for e in fake.ephemerals if e.user == people.carol.id]


async def test_sigkill_mid_stream_in_a_thread_finishes_the_same_message(
    fake: FakeSlack, people: People, bots: Bots
) -> None:
    general = fake.add_channel("general")
    options: dict[str, Any] = {"reply_in_thread": True, "slack": {"edit_interval": 0.2}}
    bot = await bots.start({**options, "hold": {"when": "story", "after_chunks": [2, 30]}})
    post = await fake.user_posts(general, people.alice, f"<@{fake.bot_user_id}> tell me a story")
    await bot.wait_event("held")
    start = await fake.wait_for_call("chat.startStream", timeout=10)
    assert start.args["thread_ts"] == post.ts
    assert start.args["recipient_user_id"] == people.alice.id
    append = fake.kill_on("chat.appendStream", bot.pid, after_effect=True)
    await bot.release()  # the model writes on and stops again; the stream grows: the append is the kill
    assert await bot.wait_exit() == -9
    assert len(append.fired) == 1
    stream_ts = str(start.response["ts"]) if start.response else ""
    assert fake.message(general, stream_ts).streaming

    bot = await bots.start(options)
    await fake.wait_for(lambda: fake.message(general, stream_ts).text == STORY, 15)
    await bot.stop()
    [answer] = replies_of_bot(fake, general, post.ts)
    assert answer.ts == stream_ts and answer.text == STORY
    assert not answer.streaming  # the restarted bot stopped the stream it found open
    assert answer.event_payload is not None and str(answer.event_payload["key"]).startswith("reply:")
    assert len(fake.calls_to("chat.startStream")) == 1
    assert not fake.calls_to("chat.postMessage")


async def test_sigkill_after_stream_start_before_its_id_was_recorded_adopts_the_orphan(
    fake: FakeSlack, people: People, bots: Bots
) -> None:
    """`chat.startStream` carries no metadata: a crash right after it leaves a keyless message the bridge
    never recorded. The restart must find it (and stamp it) instead of starting a second one."""
    general = fake.add_channel("general")
    options: dict[str, Any] = {"reply_in_thread": True, "chunk_size": 16}
    started = fake.kill_on("chat.startStream", newest_pid(bots), after_effect=True)
    bot = await bots.start({**options, "hold": {"when": "story", "after_chunks": 1}})  # still writing
    post = await fake.user_posts(general, people.alice, f"<@{fake.bot_user_id}> tell me a story")
    assert await bot.wait_exit() == -9
    assert len(started.fired) == 1
    [orphan] = replies_of_bot(fake, general, post.ts)
    assert orphan.metadata is None and orphan.streaming

    bot = await bots.start(options)
    await fake.wait_for(lambda: fake.message(general, orphan.ts).text == STORY, 15)
    await bot.stop()
    [answer] = replies_of_bot(fake, general, post.ts)
    assert answer.ts == orphan.ts and answer.text == STORY and not answer.streaming
    assert answer.event_payload is not None and str(answer.event_payload["key"]).startswith("reply:")
    assert len(fake.calls_to("chat.startStream")) == 1
    assert not fake.calls_to("chat.postMessage")
    assert "adopting" in bot.log()


async def test_sigkill_after_post_before_the_outbox_record_is_reconciled_not_reposted(
    fake: FakeSlack, people: People, bots: Bots
) -> None:
    general = fake.add_channel("general")
    posted = fake.kill_on("chat.postMessage", newest_pid(bots), after_effect=True)
    bot = await bots.start()
    post = await fake.user_posts(general, people.bob, f"<@{fake.bot_user_id}> what changed today?")
    assert await bot.wait_exit() == -9
    assert len(posted.fired) == 1
    [stored] = replies_of_bot(fake, general)  # on Slack, but the bridge never learned its ts

    bot = await bots.start()
    final = f"answer to Bob: &lt;@{fake.bot_user_id}&gt; what changed today?"  # quoted, never a mention
    await fake.wait_for(lambda: fake.message(general, stored.ts).text.startswith(final), 10)
    await bot.stop()
    assert [m.ts for m in replies_of_bot(fake, general)] == [stored.ts]
    assert len(fake.calls_to("chat.postMessage")) == 1
    history_reads = fake.calls_to("conversations.history")
    assert any(c.args.get("include_all_metadata") in (True, "true", "1") for c in history_reads)
    assert post.message_delivery is not None


async def test_sigkill_at_the_delete_of_a_leftover_part_is_finished_after_restart(
    fake: FakeSlack, people: People, bots: Bots
) -> None:
    # ~3,000 characters stream into several 1,000-character messages, a tool runs, and the final answer is
    # short: the extra messages are deleted. The process dies when Slack applied the first chat.delete.
    general = fake.add_channel("general")
    options: dict[str, Any] = {
        "chunk_size": 100,
        "delay_ms": 40,
        "slack": {"edit_interval": 0.05, "max_chars": 1000},
    }
    bot = await bots.start({**options, "hold": {"when": "tool_result", "after_chunks": 1}})
    await fake.user_posts(general, people.alice, f"<@{fake.bot_user_id}> look it up")
    await bot.wait_event("held")
    # The short answer is in the first message; what the long partial left in the others must go.
    await fake.wait_for(
        lambda: replies_of_bot(fake, general)[0].text.startswith("Short final answer."),
        15,
        description="held",
    )
    first, *extra = replies_of_bot(fake, general)
    delete = fake.kill_on("chat.delete", bot.pid, after_effect=True)
    await bot.release()
    assert await bot.wait_exit() == -9
    assert len(delete.fired) == 1

    bot = await bots.start(options)
    await fake.wait_for(
        lambda: [m.text for m in replies_of_bot(fake, general)] == ["Short final answer."], 15
    )
    await bot.stop()
    assert [m.ts for m in replies_of_bot(fake, general)] == [first.ts]
    assert all(fake.message(general, m.ts).deleted for m in extra)
    deleted = [c.args.get("ts") for c in fake.calls_to("chat.delete")]
    assert len(extra) >= 2 and set(deleted) == {m.ts for m in extra}
    assert len(deleted) == len(extra) + 1  # the one deleted before the kill was asked again: not an error
