"""Which messages the bridge answers and which it only keeps as context, per `BridgeConfig` (DESIGN.md §5, §6):
the default policy, per-channel overrides, `answer="all" | "mentions" | "none"`, `record_unaddressed`,
`answer_dms`. A message kept as context is a user entry of the conversation: the model sees it on the next
answered turn."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from adapters.bridge import BridgeConfig, ChannelPolicy, Place

from .support import CHANNEL, Bot, user_texts

BotFactory = Callable[..., Awaitable[Bot]]

ALL = Place("memory", "T1", "CALL")
NONE = Place("memory", "T1", "CNONE")
QUIET = Place("memory", "T1", "CQUIET")  # answers mentions, keeps nothing else
DM = Place("memory", "T1", "D1")

OVERRIDES = BridgeConfig(
    default=ChannelPolicy(answer="mentions"),
    channels={
        "CALL": ChannelPolicy(answer="all"),
        "CNONE": ChannelPolicy(answer="none"),
        "CQUIET": ChannelPolicy(answer="mentions", record_unaddressed=False),
    },
)


@pytest.mark.parametrize(
    ("place", "mention", "outcome"),
    [
        (CHANNEL, False, "recorded"),  # no override: the default, mentions
        (CHANNEL, True, "answering"),
        (ALL, False, "answering"),
        (ALL, True, "answering"),
        (NONE, False, "recorded"),
        (NONE, True, "recorded"),  # not even a mention
        (QUIET, False, "ignored"),
        (QUIET, True, "answering"),
    ],
    ids=[
        "default-plain",
        "default-mention",
        "all-plain",
        "all-mention",
        "none-plain",
        "none-mention",
        "quiet-plain",
        "quiet-mention",
    ],
)
async def test_each_channel_follows_its_own_policy(
    bots: BotFactory, place: Place, mention: bool, outcome: str
) -> None:
    bot = await bots(config=OVERRIDES)
    result = await bot.say("100.1", "the build is red", place=place, mention=mention)
    await bot.settle()
    assert result.outcome == outcome
    answered = outcome == "answering"
    assert bot.platform.texts(place) == (["answer to alice: the build is red"] if answered else [])
    assert len(bot.faux.requests) == (1 if answered else 0)
    kept = outcome != "ignored"
    assert await bot.user_entries(place) == (["alice: the build is red"] if kept else [])


async def test_all_answers_every_message_and_each_turn_sees_the_earlier_ones(bots: BotFactory) -> None:
    bot = await bots(config=OVERRIDES)
    for index, (user, name) in enumerate([("U1", "alice"), ("U2", "bob"), ("U1", "alice")]):
        assert (
            await bot.say(f"100.{index}", f"m{index}", user=user, name=name, place=ALL, mention=False)
        ).outcome == "answering"
    await bot.settle()
    assert bot.platform.texts(ALL) == ["answer to alice: m0", "answer to bob: m1", "answer to alice: m2"]
    assert user_texts(bot.faux.requests[-1]) == ["alice: m0", "bob: m1", "alice: m2"]


async def test_unrecorded_channel_forgets_what_it_does_not_answer(bots: BotFactory) -> None:
    bot = await bots(config=OVERRIDES)
    assert (await bot.say("100.1", "secret chatter", place=QUIET, mention=False)).outcome == "ignored"
    await bot.say("100.2", "<@BOT> what did I miss?", place=QUIET)
    await bot.settle()
    assert bot.platform.texts(QUIET) == ["answer to alice: <@BOT> what did I miss?"]
    assert user_texts(bot.faux.requests[-1]) == ["alice: <@BOT> what did I miss?"]
    assert await bot.user_entries(QUIET) == ["alice: <@BOT> what did I miss?"]


async def test_none_records_everything_and_answers_nothing_until_the_channel_is_switched_on(
    bots: BotFactory,
) -> None:
    bot = await bots(config=OVERRIDES)
    await bot.say("100.1", "deploy moved to 5pm", place=NONE, mention=False)
    await bot.say("100.2", "<@BOT> are you there?", name="bob", user="U2", place=NONE)
    await bot.settle()
    assert bot.platform.texts(NONE) == []
    assert bot.faux.requests == []
    assert await bot.user_entries(NONE) == ["alice: deploy moved to 5pm", "bob: <@BOT> are you there?"]
    # The operator turns the bot on in that channel: the first answered turn sees what was recorded.
    bot.bridge.config = BridgeConfig(channels={"CNONE": ChannelPolicy(answer="mentions")})
    assert (await bot.say("100.3", "<@BOT> when is the deploy?", place=NONE)).outcome == "answering"
    await bot.settle()
    assert bot.platform.texts(NONE) == ["answer to alice: <@BOT> when is the deploy?"]
    assert user_texts(bot.faux.requests[-1]) == [
        "alice: deploy moved to 5pm",
        "bob: <@BOT> are you there?",
        "alice: <@BOT> when is the deploy?",
    ]


async def test_dms_off_records_direct_messages_without_answering_and_leaves_channels_alone(
    bots: BotFactory,
) -> None:
    bot = await bots(config=BridgeConfig(answer_dms=False))
    assert (await bot.say("200.1", "psst", place=DM, mention=False, dm=True)).outcome == "recorded"
    assert (await bot.say("200.2", "<@BOT> hello?", place=DM, dm=True)).outcome == "recorded"
    assert (await bot.say("100.1", "<@BOT> status?")).outcome == "answering"  # channels still answered
    await bot.settle()
    assert bot.platform.texts(DM) == []
    assert bot.platform.texts(CHANNEL) == ["answer to alice: <@BOT> status?"]
    assert [user_texts(r) for r in bot.faux.requests] == [["alice: <@BOT> status?"]]
    assert await bot.user_entries(DM) == ["alice: psst", "alice: <@BOT> hello?"]
    # DMs switched on: answered without a mention, with the earlier DMs as context.
    bot.bridge.config = BridgeConfig(answer_dms=True)
    assert (await bot.say("200.3", "anyone?", place=DM, mention=False, dm=True)).outcome == "answering"
    await bot.settle()
    assert bot.platform.texts(DM) == ["answer to alice: anyone?"]
    assert user_texts(bot.faux.requests[-1]) == ["alice: psst", "alice: <@BOT> hello?", "alice: anyone?"]


async def test_dms_are_answered_even_where_channels_answer_nothing(bots: BotFactory) -> None:
    bot = await bots(config=BridgeConfig(default=ChannelPolicy(answer="none"), answer_dms=True))
    assert (await bot.say("200.1", "hi", place=DM, mention=False, dm=True)).outcome == "answering"
    assert (await bot.say("100.1", "<@BOT> hi")).outcome == "recorded"
    await bot.settle()
    assert bot.platform.texts(DM) == ["answer to alice: hi"]
    assert bot.platform.texts(CHANNEL) == []


async def test_mentions_mode_thread_is_answered_once_the_bot_takes_part(bots: BotFactory) -> None:
    bot = await bots()
    await bot.say("100.1", "the api is slow", mention=False)
    thread = CHANNEL.in_thread("100.1")  # hangs off a human message the bot did not answer
    assert (await bot.say("100.2", "since the deploy", place=thread, mention=False)).outcome == "recorded"
    await bot.settle()
    assert bot.faux.requests == []
    assert (
        await bot.say("100.3", "<@BOT> any idea?", place=thread, name="bob", user="U2")
    ).outcome == "answering"
    await bot.settle()
    assert user_texts(bot.faux.requests[-1]) == [
        "alice: the api is slow",
        "alice: since the deploy",
        "bob: <@BOT> any idea?",
    ]
    # The bot answered in this thread: it now answers there without a mention.
    assert (await bot.say("100.4", "and now?", place=thread, mention=False)).outcome == "answering"
    await bot.settle()
    assert bot.platform.texts(thread) == ["answer to bob: <@BOT> any idea?", "answer to alice: and now?"]
    assert bot.platform.texts(CHANNEL) == []


async def test_none_is_silent_even_in_threads_the_bot_took_part_in(bots: BotFactory) -> None:
    """A channel switched to "none" (an operator silencing the bot there) stays silent: the exemption of threads
    the bot is in belongs to "mentions"."""
    bot = await bots(config=BridgeConfig(default=ChannelPolicy(answer="all")))
    await bot.say("100.1", "first")
    await bot.say("100.2", "second")
    await bot.settle()
    first, second = bot.platform.in_place(CHANNEL)
    engaged = CHANNEL.in_thread(first.id)
    await bot.say("100.3", "more on first", place=engaged)
    await bot.settle()
    assert bot.platform.texts(engaged) == ["answer to alice: more on first"]
    requests = len(bot.faux.requests)

    bot.bridge.config = BridgeConfig(default=ChannelPolicy(answer="none"))
    under_answer = CHANNEL.in_thread(second.id)
    outcomes = [
        (await bot.say("100.4", "still there?", place=engaged, mention=False)).outcome,
        (await bot.say("100.5", "<@BOT> still there?", place=engaged)).outcome,
        (await bot.say("100.6", "about second", place=under_answer, mention=False)).outcome,
    ]
    await bot.settle()
    assert outcomes == ["recorded", "recorded", "recorded"]
    assert len(bot.faux.requests) == requests
    assert bot.platform.texts(engaged) == ["answer to alice: more on first"]
    assert bot.platform.texts(under_answer) == []

    # Back to mentions: the engaged thread answers without a mention and sees what was recorded meanwhile.
    bot.bridge.config = BridgeConfig(default=ChannelPolicy(answer="mentions"))
    assert (await bot.say("100.7", "and now?", place=engaged, mention=False)).outcome == "answering"
    await bot.settle()
    assert user_texts(bot.faux.requests[-1])[-4:] == [
        "alice: more on first",
        "alice: still there?",
        "alice: <@BOT> still there?",
        "alice: and now?",
    ]
