"""The Slack adapter end to end: a real bot process (harness on SQLite, bridge, `adapters.slack`) against the
loopback fake Slack, over Socket Mode. Waits are event-driven (bot output, fake state); no timing asserts."""

from __future__ import annotations

import asyncio
import itertools

from slack_e2e import STORY, Bots, People, approval_messages, button, replies_of_bot

from adapters.slack.safe_text import slack_text
from adapters.slack.testing import Channel, FakeSlack, RecordedCall, SocketConnection


async def test_one_post_delivered_eight_times_is_one_input_and_one_answer(
    fake: FakeSlack, people: People, general: Channel, bots: Bots
) -> None:
    """`message` + `app_mention` for one post, each delivered as original + retries 1..3."""
    bot = await bots.start()
    post = await fake.user_posts(general, people.alice, f"<@{fake.bot_user_id}> status of the api?")
    await post.wait_acked()
    answer = await fake.wait_for_message(general, contains="answer to Alice", timeout=10)
    for delivery in post.deliveries:
        for retry in (1, 2, 3):
            attempt = await fake.deliver(delivery, retry_num=retry)
            assert await attempt.wait_settled(10) == "acked"
    await bot.wait_event("intake", count=8)
    assert [e["outcome"] for e in bot.intakes()].count("answering") == 1
    assert len(bot.intakes("duplicate")) == 7
    assert [len(d.attempts) for d in post.deliveries] == [4, 4]
    assert {a.retry_num for d in post.deliveries for a in d.attempts} == {0, 1, 2, 3}
    await bot.stop()  # graceful: nothing in flight is left behind
    assert [m.text for m in replies_of_bot(fake, general)] == [answer.text]
    assert answer.text == slack_text(
        f"answer to Alice: <@{fake.bot_user_id}> status of the api? "
        f"[saw: Alice: <@{fake.bot_user_id}> status of the api?]"
    )
    assert answer.event_payload is not None and str(answer.event_payload["key"]).startswith("reply:")
    assert len(fake.calls_to("chat.postMessage")) == 1


async def test_dm_is_answered_without_a_mention_and_what_is_not_input_is_acked_and_ignored(
    fake: FakeSlack, people: People, general: Channel, bots: Bots
) -> None:
    bot = await bots.start()
    not_input: list[dict[str, object]] = [
        {"type": "message", "channel": general.id, "user": people.alice.id, "text": "no ts"},  # malformed
        {"type": "message", "subtype": "bot_message", "channel": general.id, "bot_id": "BOTHER", "ts": "1.1"},
        {"type": "message", "subtype": "message_deleted", "hidden": True, "channel": general.id, "ts": "1.2"},
        {
            "type": "message",
            "channel": general.id,
            "user": fake.bot_user_id,
            "bot_id": fake.bot_id,
            "ts": "1.3",
        },
        {"type": "team_join", "user": {"id": "UNEW"}},  # no listener: acked all the same
        {"type": "event_callback", "team_id": fake.team_id, "event": "not an object", "event_id": "EvBAD"},
    ]
    for item in not_input:
        attempt = await fake.deliver(item)
        assert await attempt.wait_settled(10) == "acked", item
    edited = await fake.user_posts(general, people.bob, "typo here")
    await edited.wait_acked()
    change = await fake.user_edits(general, edited.ts, "fixed typo")
    assert change is not None
    await change.wait_acked()
    chatter = await fake.user_posts(general, people.bob, "the deploy window is at 5pm")  # not addressed
    await chatter.wait_acked()
    dm = fake.open_dm(people.bob)
    post = await fake.user_posts(dm, people.bob, "hello there")
    await post.wait_acked()
    answer = await fake.wait_for_message(dm, contains="answer to Bob: hello there", timeout=10)
    question = await fake.user_posts(general, people.bob, f"<@{fake.bot_user_id}> when is the window?")
    await question.wait_acked()
    channel_answer = await fake.wait_for_message(general, contains="when is the window", timeout=10)
    new = [e for e in bot.intakes() if e["outcome"] != "duplicate"]  # the mention came as two events
    assert [(e["text"], e["outcome"], e["dm"]) for e in new] == [
        ("typo here", "recorded", False),  # its edit (message_changed) is not a new input
        ("the deploy window is at 5pm", "recorded", False),
        ("hello there", "answering", True),
        (f"<@{fake.bot_user_id}> when is the window?", "answering", False),
    ]
    assert "Bob: the deploy window is at 5pm" in channel_answer.text  # kept as context, not answered
    assert answer.thread_ts is None
    assert len(replies_of_bot(fake, general)) == 1
    await bot.stop()


async def test_thread_replies_run_in_forks_that_see_the_channel_up_to_their_parent(
    fake: FakeSlack, people: People, general: Channel, bots: Bots
) -> None:
    bot = await bots.start()
    mention = f"<@{fake.bot_user_id}>"
    first = await fake.user_posts(general, people.alice, f"{mention} first question")
    await first.wait_acked()
    answer = await fake.wait_for_message(general, contains="answer to Alice", timeout=10)
    later = await fake.user_posts(general, people.bob, "later channel message")
    await later.wait_acked()

    # A thread under the bot's answer needs no mention; its fork sees the channel up to that answer.
    more = await fake.user_posts(general, people.alice, "tell me more", thread_ts=answer.ts)
    await more.wait_acked()
    in_thread = await fake.wait_for_message(general, thread_ts=answer.ts, contains="tell me more", timeout=10)
    assert in_thread.text == slack_text(
        f"answer to Alice: tell me more [saw: Alice: {mention} first question | Alice: tell me more]"
    )

    # A second thread (under Bob's message) gets its own fork, which does see Bob's message.
    other = await fake.user_posts(general, people.bob, f"{mention} and this?", thread_ts=later.ts)
    await other.wait_acked()
    other_reply = await fake.wait_for_message(general, thread_ts=later.ts, contains="and this?", timeout=10)
    assert other_reply.text.endswith(
        slack_text(
            f"[saw: Alice: {mention} first question | Bob: later channel message | Bob: {mention} and this?]"
        )
    )

    # The first thread goes on with its own history only.
    again = await fake.user_posts(general, people.carol, "one more", thread_ts=answer.ts)
    await again.wait_acked()
    last = await fake.wait_for_message(general, thread_ts=answer.ts, contains="one more", timeout=10)
    assert last.text.endswith(
        slack_text(f"[saw: Alice: {mention} first question | Alice: tell me more | Carol: one more]")
    )
    await bot.stop()
    assert [m.text for m in replies_of_bot(fake, general)] == [answer.text]
    assert [m.ts for m in replies_of_bot(fake, general, answer.ts)] == [in_thread.ts, last.ts]
    assert [m.ts for m in replies_of_bot(fake, general, later.ts)] == [other_reply.ts]


async def test_three_users_posting_while_busy_are_answered_in_arrival_order_by_name(
    fake: FakeSlack, people: People, general: Channel, bots: Bots
) -> None:
    bot = await bots.start({"answer": "all", "hold": {"when": "q1", "after_chunks": 1}})
    first = await fake.user_posts(general, people.alice, "q1 from alice")
    await first.wait_acked()
    await bot.wait_event("held")  # the model is mid-answer: the conversation is busy
    for user, text in ((people.bob, "q2 from bob"), (people.carol, "q3 from carol")):
        post = await fake.user_posts(general, user, text)
        await post.wait_acked()
    assert [(e["user"], e["status"]) for e in bot.intakes()] == [
        ("Alice", "placed"),
        ("Bob", "queued"),
        ("Carol", "queued"),
    ]
    await bot.release()
    await fake.wait_for(lambda: any("q3 from carol [" in m.text for m in replies_of_bot(fake, general)), 10)
    await bot.stop()
    answers = [m.text for m in replies_of_bot(fake, general)]
    assert answers == [
        "answer to Alice: q1 from alice [saw: Alice: q1 from alice]",
        "answer to Bob: q2 from bob [saw: Alice: q1 from alice | Bob: q2 from bob]",
        "answer to Carol: q3 from carol [saw: Alice: q1 from alice | Bob: q2 from bob | Carol: q3 from carol]",
    ]


async def test_messages_posted_while_the_bot_was_down_are_caught_up_from_history(
    fake: FakeSlack, people: People, general: Channel, bots: Bots
) -> None:
    mention = f"<@{fake.bot_user_id}>"
    bot = await bots.start()
    first = await fake.user_posts(general, people.alice, f"{mention} first")
    await first.wait_acked()
    answer = await fake.wait_for_message(general, contains="answer to Alice", timeout=10)
    more = await fake.user_posts(general, people.bob, "more please", thread_ts=answer.ts)
    await more.wait_acked()
    await fake.wait_for_message(general, thread_ts=answer.ts, contains="more please", timeout=10)
    await bot.stop()

    # Nobody is connected: Slack cannot deliver (and gives up after its retries); history has the messages.
    away = await fake.user_posts(general, people.carol, f"{mention} while you were away")
    in_thread = await fake.user_posts(general, people.bob, "and in the thread?", thread_ts=answer.ts)
    assert [d.attempts[0].outcome for p in (away, in_thread) for d in p.deliveries] == ["no_connection"] * 3

    bot = await bots.start()
    await fake.wait_for_message(general, contains="while you were away", timeout=10)
    await fake.wait_for_message(general, thread_ts=answer.ts, contains="and in the thread?", timeout=10)
    await bot.stop()
    assert sorted(e["text"] for e in bot.intakes("answering")) == [
        f"{mention} while you were away",
        "and in the thread?",
    ]
    assert len(replies_of_bot(fake, general)) == 2
    assert len(replies_of_bot(fake, general, answer.ts)) == 2
    reads = fake.calls_to("conversations.history") + fake.calls_to("conversations.replies")
    assert any(c.args.get("oldest") for c in reads)


async def test_new_threads_opened_while_the_bot_was_down_are_caught_up_and_answered_in_forks(
    fake: FakeSlack, people: People, general: Channel, bots: Bots
) -> None:
    """Threads the bot never saw: only their parent in channel history (`reply_count`, `latest_reply`) shows them."""
    mention = f"<@{fake.bot_user_id}>"
    bot = await bots.start()
    plain = await fake.user_posts(general, people.bob, "the api is slow today")  # recorded, not answered
    await plain.wait_acked()
    first = await fake.user_posts(general, people.alice, f"{mention} first")
    await first.wait_acked()
    answer = await fake.wait_for_message(general, contains="answer to Alice", timeout=10)
    await bot.stop()

    # Nobody is connected. One thread opens under the bot's answer (newer than the last message the bot saw),
    # one under Bob's message (older than it: no `oldest` read of the channel returns that parent).
    under_answer = await fake.user_posts(
        general, people.carol, f"{mention} more on that?", thread_ts=answer.ts
    )
    under_plain = await fake.user_posts(general, people.alice, f"{mention} how slow?", thread_ts=plain.ts)
    assert {d.attempts[0].outcome for p in (under_answer, under_plain) for d in p.deliveries} == {
        "no_connection"
    }
    limited = fake.rate_limit(
        "conversations.replies", retry_after=1
    )  # a 429 on catch-up costs a wait, no thread

    bot = await bots.start()
    more = await fake.wait_for_message(general, thread_ts=answer.ts, contains="more on that?", timeout=10)
    slow = await fake.wait_for_message(general, thread_ts=plain.ts, contains="how slow?", timeout=10)
    await bot.stop()
    assert len(limited.hits) == 1
    assert sorted(e["text"] for e in bot.intakes("answering")) == [
        f"{mention} how slow?",
        f"{mention} more on that?",
    ]
    # Each thread is a fork of #general at its parent: the answer's thread sees the channel up to the answer,
    # Bob's thread only what came before Bob's message.
    assert more.text == slack_text(
        f"answer to Carol: {mention} more on that? "
        f"[saw: Bob: the api is slow today | Alice: {mention} first | Carol: {mention} more on that?]"
    )
    assert slow.text == slack_text(
        f"answer to Alice: {mention} how slow? [saw: Bob: the api is slow today | Alice: {mention} how slow?]"
    )

    bot = await bots.start()  # once more: nothing new, nothing answered again
    await bot.stop()
    assert [e for e in bot.intakes() if e["outcome"] != "duplicate"] == []
    assert [m.ts for m in replies_of_bot(fake, general)] == [answer.ts]
    assert [m.ts for m in replies_of_bot(fake, general, answer.ts)] == [more.ts]
    assert [m.ts for m in replies_of_bot(fake, general, plain.ts)] == [slow.ts]


async def test_socket_mode_disconnect_frames_reconnect_and_lose_or_repeat_nothing(
    fake: FakeSlack, people: People, general: Channel, bots: Bots
) -> None:
    """Slack rotates sockets with `disconnect` frames. An envelope still being handled when its connection goes
    is redelivered on the new one (it was never acked there); both copies go through the same dedupe."""
    mention = f"<@{fake.bot_user_id}>"
    bot = await bots.start({"slack": {"lookup_timeout": 30}})
    release = asyncio.Event()

    async def slow_lookup(call: RecordedCall) -> None:
        await release.wait()  # Carol's display name: her message is mid-intake, not committed, not acked

    held = fake.on_request(
        "users.info", slow_lookup, times=None, match=lambda c: c.args.get("user") == "UCAROL"
    )
    caught = await fake.user_posts(general, people.carol, f"{mention} caught in the refresh")
    await fake.wait_for(lambda: held.fired, 10)
    old = fake.open_connections[0]
    await fake.disconnect(reason="refresh_requested")
    new = await fake.wait_for(lambda: not old.open and only_open(fake), 10)
    assert new is not old and len(fake.calls_to("apps.connections.open")) == 2
    assert not any(d.acked for d in caught.deliveries)
    retries = [await fake.deliver(d) for d in caught.deliveries]  # Slack's retry goes to the live connection
    assert [a.connection_id for a in retries] == [new.id, new.id]
    release.set()
    assert [await a.wait_settled(10) for a in retries] == ["acked", "acked"]
    await fake.wait_for_message(general, contains="caught in the refresh", timeout=10)

    old = new
    await fake.disconnect(reason="link_disabled")
    await fake.wait_for(lambda: not old.open and only_open(fake), 10)
    after = await fake.user_posts(general, people.alice, f"{mention} after the reconnect")
    await after.wait_acked()
    await fake.wait_for_message(general, contains="after the reconnect", timeout=10)
    await bot.stop()

    by_text = {
        text: sorted(e["outcome"] for e in bot.intakes() if e["text"] == text)
        for text in (f"{mention} caught in the refresh", f"{mention} after the reconnect")
    }
    assert by_text == {
        f"{mention} caught in the refresh": ["answering", "duplicate", "duplicate", "duplicate"],
        f"{mention} after the reconnect": ["answering", "duplicate"],
    }
    assert [m.text.split(" [")[0] for m in replies_of_bot(fake, general)] == [
        slack_text(f"answer to Carol: {mention} caught in the refresh"),
        slack_text(f"answer to Alice: {mention} after the reconnect"),
    ]
    assert len(fake.calls_to("apps.connections.open")) == 3


async def test_a_deaf_socket_is_replaced_and_what_was_lost_on_it_is_redelivered_and_taken_in_once(
    fake: FakeSlack, people: People, general: Channel, bots: Bots
) -> None:
    """A half-open Socket Mode connection: the socket stays open, but Slack no longer answers pings and what
    it sends there never arrives. The bot's pings find it dead, it opens a new connection, and Slack's retries
    of the two envelopes (`message` + `app_mention`) lost on the deaf one become one input and one answer."""
    fake.ack_timeout, fake.auto_retry, fake.retry_delays = 1.0, True, (0.5,)
    mention = f"<@{fake.bot_user_id}>"
    bot = await bots.start({"slack": {"ping_interval": 0.2}})
    await fake.user_posts(general, people.bob, f"{mention} before")
    await fake.wait_for_message(general, contains="answer to Bob", timeout=10)

    deaf = fake.go_deaf()
    lost = await fake.user_posts(general, people.alice, f"{mention} are you there?")
    assert [d.attempts[0].connection_id for d in lost.deliveries] == [deaf.id, deaf.id]
    new = await fake.wait_for(lambda: not deaf.open and only_open(fake), 15)
    assert deaf.pings_unanswered >= 1 and deaf.envelopes_lost >= 2 and new is not deaf
    assert len(fake.calls_to("apps.connections.open")) == 2
    await lost.wait_acked(15)  # Slack's retries, acked on the new connection
    assert all(d.attempts[0].outcome == "timed_out" for d in lost.deliveries)
    assert {d.attempts[-1].connection_id for d in lost.deliveries} == {new.id}
    await fake.wait_for_message(general, contains="are you there?", timeout=10)

    after = await fake.user_posts(general, people.carol, f"{mention} after the reconnect")
    await after.wait_acked(10)
    await fake.wait_for_message(general, contains="after the reconnect", timeout=10)
    await bot.stop()

    by_text = {
        text: sorted(e["outcome"] for e in bot.intakes() if e["text"] == f"{mention} {text}")
        for text in ("are you there?", "after the reconnect")
    }
    assert by_text == {
        "are you there?": ["answering", "duplicate"],
        "after the reconnect": ["answering", "duplicate"],
    }
    assert [m.text.split(" [")[0] for m in replies_of_bot(fake, general)] == [
        slack_text(f"answer to Bob: {mention} before"),
        slack_text(f"answer to Alice: {mention} are you there?"),
        slack_text(f"answer to Carol: {mention} after the reconnect"),
    ]
    health = bot.event("stopped")["health"]
    assert health["connections_opened"] == 2 and health["reconnects"] == 1
    assert health["stale_detections"] == 1 and "no pong" in health["last_stale_reason"]
    warnings = [line for line in bot.log().splitlines() if "WARNING" in line and "went silent" in line]
    assert len(warnings) == 1 and "Slack" in warnings[0], bot.log()
    assert fake.app_token not in bot.log() and fake.bot_token not in bot.log()


async def test_when_apps_connections_open_keeps_failing_the_bot_backs_off_then_comes_back(
    fake: FakeSlack, people: People, general: Channel, bots: Bots
) -> None:
    """slack-sdk alone asks for a new socket URL every ping interval, forever; the adapter doubles the pause
    after each failure (lower bounds only: each pause at least ping_interval * 2^(n-1))."""
    mention = f"<@{fake.bot_user_id}>"
    bot = await bots.start({"slack": {"ping_interval": 0.2}})
    fake.fail("apps.connections.open", "internal_error", times=3)
    deaf = fake.go_deaf()
    new = await fake.wait_for(lambda: not deaf.open and only_open(fake), 20)
    opens = fake.calls_to("apps.connections.open")
    assert [c.ok for c in opens] == [True, False, False, False, True]
    pauses = [later.received_at - earlier.received_at for earlier, later in itertools.pairwise(opens[1:])]
    assert [pause >= 0.2 * 2**n for n, pause in enumerate(pauses)] == [True, True, True], pauses
    post = await fake.user_posts(general, people.alice, f"{mention} back?")
    await post.wait_acked(10)
    assert {d.attempts[0].connection_id for d in post.deliveries} == {new.id}
    await fake.wait_for_message(general, contains="back?", timeout=10)
    await bot.stop()
    health = bot.event("stopped")["health"]
    assert (health["connections_opened"], health["reconnects"], health["stale_detections"]) == (2, 1, 1)


def only_open(fake: FakeSlack) -> SocketConnection | None:
    conns = fake.open_connections
    return conns[0] if len(conns) == 1 else None


async def test_rate_limits_and_a_lost_response_cost_no_message_and_no_duplicate(
    fake: FakeSlack, people: People, general: Channel, bots: Bots
) -> None:
    mention = f"<@{fake.bot_user_id}>"
    too_many = fake.rate_limit("chat.postMessage", retry_after=1)  # HTTP 429 + Retry-After
    quietly_limited = fake.rate_limit("chat.update", retry_after=1, status=200)  # HTTP 200, ok: false
    bot = await bots.start({"hold": {"when": "one", "after_chunks": 1}})
    first = await fake.user_posts(general, people.alice, f"{mention} one")
    await first.wait_acked()
    await bot.wait_event("held")
    await fake.wait_for_call("chat.postMessage", predicate=lambda c: c.ok, timeout=10)  # the partial, late
    await bot.release()
    await fake.wait_for(
        lambda: any(m.text.startswith("answer to Alice") for m in replies_of_bot(fake, general)), 10
    )
    assert len(too_many.hits) == 1 and len(quietly_limited.hits) == 1

    # The post lands but its response never arrives: the bridge looks it up by its key instead of re-posting.
    lost = fake.drop_on("chat.postMessage")
    second = await fake.user_posts(general, people.bob, f"{mention} two")
    await second.wait_acked()
    await fake.wait_for(
        lambda: any(m.text.startswith("answer to Bob") for m in replies_of_bot(fake, general)), 10
    )
    await bot.stop()
    assert len(lost.fired) == 1
    assert [m.text.split(" [")[0] for m in replies_of_bot(fake, general)] == [
        slack_text(f"answer to Alice: {mention} one"),
        slack_text(f"answer to Bob: {mention} two"),
    ]
    assert len([c for c in fake.calls_to("chat.postMessage") if c.effect_applied]) == 2


async def test_a_long_streamed_answer_is_split_into_parts_each_within_the_limit(
    fake: FakeSlack, people: People, general: Channel, bots: Bots
) -> None:
    bot = await bots.start(
        {
            "reply_in_thread": True,
            "chunk_size": 24,
            "delay_ms": 5,
            "slack": {"max_chars": 200, "edit_interval": 0.1},
        }
    )
    post = await fake.user_posts(general, people.alice, f"<@{fake.bot_user_id}> a story please")
    await post.wait_acked()
    await fake.wait_for(
        lambda: (
            " ".join(m.text for m in replies_of_bot(fake, general, post.ts)).split() == STORY.split()
            and not any(m.streaming for m in replies_of_bot(fake, general, post.ts))
        ),
        15,
    )
    await bot.stop()
    parts = replies_of_bot(fake, general, post.ts)
    assert len(parts) >= 3
    assert all(len(m.text) <= 200 for m in parts)
    keys = [str((m.event_payload or {}).get("key")) for m in parts]
    assert [k.rsplit("#", 1)[1] for k in keys] == [str(i) for i in range(len(parts))]
    assert fake.calls_to("chat.startStream")  # it streamed while the text fit


async def test_a_click_counts_only_on_the_approval_requests_own_message(
    fake: FakeSlack, people: People, bots: Bots
) -> None:
    ops = fake.add_channel("ops")
    other = fake.add_channel("random")
    await bots.start({"approvers": [people.carol.id]})
    await fake.user_posts(ops, people.alice, f"<@{fake.bot_user_id}> please deploy api")
    [request] = await fake.wait_for(lambda: approval_messages(fake, ops) or None, 10)
    approve = button(request, "approve")
    # The same signed button, on a message in another channel that is not the request: refused privately.
    copy = fake.seed_message(other, "look at this", user=people.mallory, blocks=request.blocks)
    forged = await fake.click(other, copy.ts, approve, user=people.carol)
    assert forged.acked
    await fake.wait_for(lambda: fake.ephemerals or None, 10)
    assert [(e.user, e.text) for e in fake.ephemerals] == [
        (
            people.carol.id,
            "This button is not on the approval request it names, so your click was not counted.",
        )
    ]
    assert bots.ledger() == []
    assert any(
        b.get("type") == "actions" for b in fake.message(ops, request.ts).blocks or []
    )  # still pending

    # On the request itself, the same click counts: deployed once and reported after the card.
    counted = await fake.click(ops, request.ts, approve, user=people.carol)
    assert counted.acked
    await fake.wait_for(
        lambda: "deploy finished: deployed api" in [m.text for m in replies_of_bot(fake, ops)] or None, 15
    )
    assert len(bots.ledger()) == 1


async def test_parts_stay_within_the_limit_after_escaping(
    fake: FakeSlack, people: People, general: Channel, bots: Bots
) -> None:
    """`&`, `<`, `>` grow to 4-5 characters when escaped for Slack, so the split counts the escaped text: an answer
    full of them must not make a part longer than `max_chars` (Slack refuses a markdown_text over 12,000)."""
    bot = await bots.start(
        {
            "reply_in_thread": True,
            "chunk_size": 24,
            "delay_ms": 5,
            "slack": {"max_chars": 200, "edit_interval": 0.1},
        }
    )
    post = await fake.user_posts(general, people.alice, f"<@{fake.bot_user_id}> " + "a&b " * 40)
    await post.wait_acked()
    await fake.wait_for(
        lambda: (
            "[saw:" in " ".join(m.text for m in replies_of_bot(fake, general, post.ts))
            and not any(m.streaming for m in replies_of_bot(fake, general, post.ts))
        ),
        15,
    )
    await bot.stop()
    parts = replies_of_bot(fake, general, post.ts)
    assert all(len(m.text) <= 200 for m in parts), [len(m.text) for m in parts]
    assert len(parts) >= 2
    assert " ".join(m.text for m in parts).count("a&amp;b") >= 40  # all of the answer, escaped
