"""The Discord adapter end to end: real bot processes (harness on SQLite, bridge, discord.py) against the
loopback fake Discord, restarted and SIGKILLed at chosen moments.

No assertion depends on durations: tests wait for events (the fake's state, the bot's JSON lines) and assert
on what Discord holds, the order of requests, and the bot's ledger. This directory has no ``__init__.py``
(see test_fake_discord.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from bot_support import MESSAGE_ROUTE, MESSAGES_ROUTE, Bots

from adapters.discord.testing import FakeChannel, FakeDiscord, FakeGuild, FakeMessage, FakeRole, FakeUser

pytestmark = pytest.mark.timeout(90)


class World:
    def __init__(self, fake: FakeDiscord) -> None:
        self.fake = fake
        self.guild: FakeGuild = fake.add_guild("Ops")
        self.general: FakeChannel = fake.add_text_channel(self.guild, "general")
        self.approvers: FakeRole = fake.add_role(self.guild, "approvers")
        self.alice: FakeUser = fake.add_user("alice", global_name="Alice")
        self.bob: FakeUser = fake.add_user("bob")
        self.carol: FakeUser = fake.add_user("carol", global_name="Carol")
        fake.add_member(self.guild, self.alice)
        fake.add_member(self.guild, self.bob, nick="Bobby")
        fake.add_member(self.guild, self.carol, roles=[self.approvers])

    def answers(self, channel: FakeChannel | None = None) -> list[FakeMessage]:
        """The bot's visible messages in a channel or thread, oldest first."""
        return self.fake.bot_messages(channel or self.general)


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(heartbeat_interval=0.5) as fake:
        yield fake


@pytest.fixture
def world(fake: FakeDiscord) -> World:
    return World(fake)


@pytest.fixture
async def bots(fake: FakeDiscord, world: World, tmp_path: Path) -> AsyncIterator[Bots]:
    config = {
        "adapter": {"edit_interval": 0.05, "guild_ready_timeout": 0.05},
        "answer": "all",
        "groups": [str(world.approvers.id)],
    }
    bots = Bots(fake, tmp_path, config)
    yield bots
    await bots.close()
    print("\n".join(f"{r.seq} {r.method} {r.path} {r.status}" for r in fake.requests))
    for index, bot in enumerate(bots.started):
        print(f"--- bot process {index} (pid {bot.pid}) ---\n{bot.log()}")  # shown when a test fails
        assert fake.token not in "".join(bot.stderr), "the token was logged"


async def wait_text(fake: FakeDiscord, channel: FakeChannel, text: str, timeout: float = 20.0) -> FakeMessage:
    return await fake.wait_for_message(channel, predicate=lambda m: m.content == text, timeout=timeout)


async def wait_final(
    fake: FakeDiscord, channel: FakeChannel, prefix: str, timeout: float = 20.0
) -> FakeMessage:
    """The bot's message starting with `prefix` once it shows its final text (partials end with "…")."""
    return await fake.wait_for_message(
        channel,
        predicate=lambda m: m.content.startswith(prefix) and not m.content.endswith("…"),
        timeout=timeout,
    )


async def test_two_users_while_busy_are_answered_in_order_and_a_thread_on_an_answer_forks_there(
    fake: FakeDiscord, world: World, bots: Bots
) -> None:
    bot = await bots.start(chunk_size=10, delay_ms=15, padding=" (details follow)" * 20)
    first = await fake.user_sends(world.general, world.alice, "how is the deploy going?")
    # The bot starts streaming its answer; bob speaks while it is still writing.
    streaming = await fake.wait_for_message(world.general, timeout=20)
    second = await fake.user_sends(world.general, world.bob, "and the database migration?")
    await fake.user_sends(world.general, world.carol, "same question", reply_to=first)
    pad = " (details follow)" * 20
    answer_1 = await wait_text(fake, world.general, "re Alice: how is the deploy going?" + pad)
    answer_2 = await wait_text(fake, world.general, "re Bobby: and the database migration?" + pad)
    answer_3 = await wait_text(
        fake,
        world.general,
        're Carol: (replying to Alice: "how is the deploy going?") same question' + pad,
    )
    assert answer_1.id == streaming.id  # streamed into one message, then finished in place
    assert len(answer_1.edits) >= 2  # partials were shown
    # bob asked while the first answer was still being written: its final edit came after his message
    assert second.created_at < answer_1.edits[-1].replaced_at
    assert [m.id for m in world.answers()] == [answer_1.id, answer_2.id, answer_3.id]
    assert all(m.reply_to is None and m.nonce for m in world.answers())

    # A later channel message, then a thread on the first answer: the fork sees the channel up to that answer.
    await fake.user_sends(world.general, world.alice, "later channel message")
    await wait_text(fake, world.general, "re Alice: later channel message" + pad)
    await bot.wait_event("delivered", count=4)  # every answer recorded: the thread forks at answer_1
    thread = await fake.user_creates_thread(world.general, answer_1, "deploy", world.bob)
    # no mention needed in a thread under the bot's answer
    await fake.user_sends_in_thread(thread, world.bob, "what do you see?")
    seen = await wait_final(fake, thread, "seen:")
    assert seen.content == "seen: Alice: how is the deploy going? | Bobby: what do you see?"
    # the thread's starter message (type 21, "by" the bot) was not taken as input or answered
    assert [m.type.value for m in world.answers(thread)] == [21, 0]


def approval_message(world: World) -> FakeMessage | None:
    return next((m for m in world.answers() if m.custom_ids()), None)


@pytest.mark.usefixtures("crash_backend")  # on SQLite and on PostgreSQL
async def test_approval_click_after_a_restart_refuses_non_approvers_and_deploys_once(
    fake: FakeDiscord, world: World, bots: Bots
) -> None:
    fake.add_member(world.guild, world.alice, roles=[world.approvers])  # an approver, but she asks
    first = await bots.start()
    await fake.user_sends(world.general, world.alice, "please deploy the api")
    gate = await fake.wait_for(lambda: approval_message(world), timeout=20, what="the approval request")
    gate_id = int(gate.custom_ids()[0].rsplit(":", 1)[1])
    assert gate.custom_ids() == [
        f"durable-bots:approve:{gate_id}",
        f"durable-bots:deny:{gate_id}",
        f"durable-bots:withdraw:{gate_id}",
    ]
    await fake.wait_for_message(world.general, predicate=lambda m: "waiting for approval" in m.content)
    first.process.kill()  # the gate waits durably; nothing of it lives in the process
    assert await first.wait() == -9

    second = await bots.start()
    assert (await second.ready())["caught_up"] == 0  # the question was already taken in: not asked twice
    refused = await fake.click(gate, f"durable-bots:approve:{gate_id}", world.bob)
    assert refused.answered_in_time and refused.response_type == 6  # deferred within 3 s
    await fake.wait_for(lambda: refused.followups, what="bob's refusal")
    [note] = refused.followups
    assert note.ephemeral_for == world.bob.id and "not one of the approvers" in note.content
    own = await fake.click(gate, f"durable-bots:approve:{gate_id}", world.alice)  # her own request
    await fake.wait_for(lambda: own.followups, what="alice's refusal")
    assert "someone else has to approve" in own.followups[0].content
    assert bots.ledger() == []

    approved = await fake.click(gate, f"durable-bots:approve:{gate_id}", world.carol)  # has the role
    assert approved.answered_in_time and approved.response_type == 6
    result = await wait_final(fake, world.general, "deploy result:")
    assert result.content == "deploy result: deployed api"
    await fake.wait_for(lambda: not gate.components, what="the buttons to go")
    assert gate.content.startswith("✅ `deploy` **approved** by Carol")
    assert approved.followups == []  # the decision shows on the message, edited with the bot token
    edits = fake.calls("PATCH", MESSAGE_ROUTE)
    assert any(r.params["message_id"] == str(gate.id) for r in edits)
    assert not fake.calls("PATCH", "/webhooks/{application_id}/{interaction_token}/messages/{message_id}")
    assert len(bots.ledger()) == 1

    # Another restart: the decided gate is never asked again and deploy does not run twice.
    assert await second.terminate() == 0
    third = await bots.start()
    assert (await third.ready())["caught_up"] == 0
    assert await third.terminate() == 0
    assert len(bots.ledger()) == 1
    assert len([m for m in world.answers() if m.custom_ids() or m.content.startswith("✅")]) == 1


@pytest.mark.usefixtures("crash_backend")  # on SQLite and on PostgreSQL
async def test_sigkill_at_the_clicks_acknowledgement_keeps_the_decision_committed_before_it(
    fake: FakeDiscord, world: World, bots: Bots
) -> None:
    first = await bots.start()
    await fake.user_sends(world.general, world.alice, "please deploy the api")
    gate = await fake.wait_for(lambda: approval_message(world), timeout=20, what="the approval request")
    approve = gate.custom_ids()[0]
    fake.kill_on("POST", "/interactions/{interaction_id}/{interaction_token}/callback", first.pid)
    await fake.click(gate, approve, world.carol)  # committed, then the process dies at the acknowledgement
    assert await first.wait() == -9
    assert len(bots.ledger()) <= 1  # the woken gate task may already have run the deploy

    await bots.start()  # the decision stands: reported once, with no second click
    result = await wait_final(fake, world.general, "deploy result:")
    await fake.wait_for(lambda: not gate.components, what="the buttons to go")
    assert gate.content.startswith("✅ `deploy` **approved** by Carol")
    # The gate task may have committed the deploy's intent before the kill: then it is never run again and
    # the report says so; otherwise it runs once after the restart.
    if result.content == "deploy result: deployed api":
        assert len(bots.ledger()) == 1
    else:
        assert result.content == "deploy result: Tool deploy was interrupted and may have partially run"
        assert len(bots.ledger()) <= 1
    assert len([m for m in world.answers() if m.content.startswith("deploy result:")]) == 1


@pytest.mark.usefixtures("crash_backend")  # on SQLite and on PostgreSQL
async def test_sigkill_between_post_and_record_beyond_the_nonce_window_posts_once_and_loses_nothing(
    fake: FakeDiscord, world: World, bots: Bots
) -> None:
    first = await bots.launch()
    await first.ready()
    hook = fake.kill_on("POST", MESSAGES_ROUTE, first.pid)  # dies right after Discord stored its first post
    await fake.user_sends(world.general, world.alice, "status report please")
    assert await first.wait() == -9
    [orphan] = world.answers()  # posted, but the process never learned its id
    assert hook.calls == 1 and fake.calls("POST", MESSAGES_ROUTE)[0].killed_pid == first.pid
    await fake.user_sends(world.general, world.bob, "sent while the bot was dead")
    # Long enough that Discord no longer dedupes the nonce: only the footer marker can find the post.
    fake.clock.advance(fake.nonce_window + 60)

    second = await bots.start()
    assert (await second.ready())["caught_up"] == 1  # bob's message, read from history
    answer = await wait_text(fake, world.general, "re Alice: status report please")
    await wait_text(fake, world.general, "re Bobby: sent while the bot was dead")
    assert answer.id == orphan.id  # reconciled and finished in place, not posted again
    assert [m.content for m in world.answers()] == [
        "re Alice: status report please",
        "re Bobby: sent while the bot was dead",
    ]
    posts = [r for r in fake.calls("POST", MESSAGES_ROUTE) if r.effect]
    assert len(posts) == 2
    # The restarted process found the post by its footer marker (the nonce window was over) and never sent
    # that part again.
    assert [r.json.get("nonce") for r in fake.calls("POST", MESSAGES_ROUTE)].count(orphan.nonce) == 1


@pytest.mark.usefixtures("crash_backend")  # on SQLite and on PostgreSQL
async def test_sigkill_mid_stream_finishes_the_same_message_after_restart(
    fake: FakeDiscord, world: World, bots: Bots
) -> None:
    pad = " and more" * 30
    first = await bots.launch(chunk_size=10, delay_ms=10, padding=pad)
    await first.ready()
    fake.kill_on("PATCH", MESSAGE_ROUTE, first.pid)  # the first streamed edit is the last thing it does
    await fake.user_sends(world.general, world.alice, "tell me everything")
    assert await first.wait() == -9
    [partial] = world.answers()
    assert partial.content.endswith("…") and len(partial.edits) == 1
    await fake.user_sends(world.general, world.bob, "are you back?")

    await bots.start(chunk_size=10, delay_ms=10, padding=pad)
    answer = await wait_text(fake, world.general, "re Alice: tell me everything" + pad)
    await wait_text(fake, world.general, "re Bobby: are you back?" + pad)
    assert answer.id == partial.id
    assert [m.id for m in world.answers()] == [partial.id, world.answers()[1].id]
    assert len([r for r in fake.calls("POST", MESSAGES_ROUTE) if r.effect]) == 2


def unfence(part: str) -> list[str]:
    """The lines of a part without fence lines (a split re-opens and closes the code block)."""
    return [line for line in part.split("\n") if not line.startswith("```")]


async def test_long_answer_is_split_at_2000_with_code_fences_intact_through_429_and_500(
    fake: FakeDiscord, world: World, bots: Bots
) -> None:
    # The first post is rate limited (429 + retry_after), its retry is stored but answered 500: discord.py
    # retries it with the same nonce and Discord hands back the stored message.
    limited = fake.rate_limit("POST", MESSAGES_ROUTE, times=1, retry_after=0.05)
    failed = fake.fail("POST", MESSAGES_ROUTE, status=500, after_effect=True, times=1)
    edit_limited = fake.rate_limit("PATCH", MESSAGE_ROUTE, times=1, retry_after=0.05)
    await bots.start(chunk_size=400, delay_ms=5)
    await fake.user_sends(world.general, world.alice, "a long answer please")
    await fake.wait_for(
        lambda: len(world.answers()) == 3 and not world.answers()[-1].content.endswith("…"),
        timeout=30,
        what="three final parts",
    )
    parts = [m.content for m in world.answers()]
    assert all(len(p) <= 2000 for p in parts)
    assert all(p.count("```") % 2 == 0 for p in parts)  # every part closes what it opens
    assert parts[1].startswith("```python") and parts[1].rstrip().endswith("```")
    code = [f"    step_{i:03d} = run('stage {i}')  # keep going" for i in range(60)]
    lines = [line for part in parts for line in unfence(part)]
    assert [line for line in lines if line.startswith("    step_")] == code  # each code line once, in order
    assert lines[0].startswith("Paragraph 0:") and lines[-1].startswith("Note 2:")

    posts = fake.calls("POST", MESSAGES_ROUTE)
    assert [(p.status, p.effect, p.deduplicated) for p in posts[:3]] == [
        (429, False, False),
        (500, True, False),
        (200, False, True),
    ]
    assert posts[0].json["nonce"] == posts[1].json["nonce"] == posts[2].json["nonce"]
    assert posts[1].at - posts[0].at >= 0.05  # the retry waited retry_after after the 429
    assert limited.calls == failed.calls == edit_limited.calls == 1
    assert len([p for p in posts if p.effect]) == 3
    patches = fake.calls("PATCH", MESSAGE_ROUTE)
    assert patches[0].status == 429 and patches[1].status == 200
    assert patches[1].json == patches[0].json  # the rate-limited edit was sent again, not dropped
    assert patches[1].at - patches[0].at >= 0.05  # ... no sooner than retry_after


async def test_messages_sent_while_the_bot_is_down_are_answered_once_after_restart(
    fake: FakeDiscord, world: World, bots: Bots
) -> None:
    first = await bots.start()
    await fake.user_sends(world.general, world.alice, "hello")
    answer = await wait_text(fake, world.general, "re Alice: hello")
    await first.wait_event("delivered")  # shown and recorded: a thread on it forks at this answer
    assert await first.terminate() == 0
    assert first.events[-1]["event"] == "stopped"
    assert fake.connected_sessions == []

    # No gateway session: Discord stores these and will never replay them.
    await fake.user_sends(world.general, world.bob, "anyone there?")
    thread = await fake.user_creates_thread(world.general, answer, "follow-up", world.alice)
    await fake.user_sends_in_thread(thread, world.alice, "what do you see here?")

    second = await bots.start()
    assert (await second.ready())["caught_up"] == 2
    await wait_text(fake, world.general, "re Bobby: anyone there?")
    seen = await wait_final(fake, thread, "seen:")
    assert seen.content == "seen: Alice: hello | Alice: what do you see here?"  # forked at the answer
    assert await second.terminate() == 0

    third = await bots.start()
    assert (await third.ready())["caught_up"] == 0
    assert await third.terminate() == 0
    assert [m.content for m in world.answers()] == ["re Alice: hello", "re Bobby: anyone there?"]
    assert [m.content for m in world.answers(thread) if m.type.value == 0] == [seen.content]
    assert len(fake.sessions) == 3 and all(s.resumes == 0 for s in fake.sessions)


async def test_a_mention_in_a_channel_the_bot_never_talked_in_is_answered_after_a_restart(
    fake: FakeDiscord, world: World, bots: Bots
) -> None:
    incidents = fake.add_text_channel(world.guild, "incidents")
    await fake.user_sends(incidents, world.bob, "said before the bot ever ran")  # before its first watch
    first = await bots.start()
    assert (await first.ready())["caught_up"] == 0
    assert await first.terminate() == 0

    # While the bot is down: a first message in #incidents (no conversation there yet), and a thread there.
    await fake.user_sends(incidents, world.alice, "is the api down?")
    starter = await fake.user_sends(incidents, world.carol, "thread about the db")
    thread = await fake.user_creates_thread(incidents, starter, "db", world.carol)
    await fake.user_sends_in_thread(thread, world.carol, "what do you see here?")

    second = await bots.start()
    assert (await second.ready())["caught_up"] == 3  # two in #incidents, one in the new thread
    await wait_text(fake, incidents, "re Alice: is the api down?")
    await wait_final(fake, thread, "seen:")
    assert not [m for m in world.answers(incidents) if "before the bot ever ran" in m.content]
    assert "discord: caught up 3 message(s) in 2 channel(s)" in second.log()
    assert await second.terminate() == 0


async def test_leftover_parts_after_a_tool_call_are_deleted_even_across_a_sigkill_at_the_delete(
    fake: FakeDiscord, world: World, bots: Bots, tmp_path: Path
) -> None:
    # The model streams ~2,900 characters (two messages), calls a tool, then answers briefly: the second
    # message must go. The process dies when Discord applied that DELETE, before anything was recorded.
    first = await bots.launch(chunk_size=100, delay_ms=40)
    await first.ready()
    await fake.user_sends(world.general, world.alice, "look it up")
    await fake.wait_for(lambda: len(world.answers()) == 2, timeout=30, what="a partial in two messages")
    await fake.wait_for(
        lambda: "running `lookup`" in world.answers()[0].content, timeout=30, what="the tool running"
    )
    first_part, second_part = world.answers()
    fake.kill_on("DELETE", MESSAGE_ROUTE, first.pid)
    (tmp_path / "release").touch()
    assert await first.wait() == -9
    assert [m.id for m in world.answers()] == [first_part.id]  # the delete went through, unrecorded

    second = await bots.start(chunk_size=100, delay_ms=40)
    await wait_text(fake, world.general, "Short final answer.")
    await second.wait_event("delivered")
    assert [(m.id, m.content) for m in world.answers()] == [(first_part.id, "Short final answer.")]
    deletes = fake.calls("DELETE", MESSAGE_ROUTE)
    assert {d.path.rsplit("/", 1)[-1] for d in deletes} == {str(second_part.id)}
    assert [d.status for d in deletes][-1] == 404  # repeated after the restart: already gone, not an error
