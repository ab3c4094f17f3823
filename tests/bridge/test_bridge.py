"""The platform bridge on an in-memory platform: places, intake, delivery, streaming, approvals, schedule."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from adapters.bridge import (
    ApprovalPolicy,
    Bridge,
    BridgeConfig,
    ChannelPolicy,
    IncomingMessage,
    Place,
    ReplyDoc,
    RetryLater,
)
from adapters.bridge.testing import MemoryTransport
from harness_core import (
    AgentChange,
    Extension,
    Harness,
    HarnessSettings,
    ModelRef,
    Models,
    Registry,
    ToolSpec,
    tool,
)
from harness_core.messages import AssistantMessage, ToolResultMessage, UserMessage, user_text
from harness_core.models import ModelRequest
from harness_core.models.faux import FauxProvider, faux_assistant, faux_tool_call
from harness_core.storage import MemoryStorage

from .support import deploy_flow, waiting_and_outcome

CHANNEL = Place("memory", "T1", "C1")
MODEL = AgentChange(model=ModelRef(provider="faux", model_id="m"))


@dataclass
class World:
    harness: Harness
    bridge: Bridge
    platform: MemoryTransport
    faux: FauxProvider
    clock: list[int]

    async def say(
        self,
        message_id: str,
        text: str,
        *,
        user: str = "U1",
        name: str = "alice",
        place: Place = CHANNEL,
        mention: bool = True,
    ) -> Any:
        return await self.bridge.intake(
            IncomingMessage(place, message_id, user, name, text, mentions_bot=mention)
        )

    async def settle(self) -> None:
        await self.harness.wait_for_idle()
        for _ in range(50):
            await self.bridge.delivery.idle()
            await asyncio.sleep(0)
            if not self.bridge.delivery.workers:
                break


def last_user_text(request: ModelRequest) -> str:
    return [user_text(m) for m in request.messages if isinstance(m, UserMessage)][-1]


@pytest.fixture
async def world_factory() -> AsyncIterator[Callable[..., Any]]:
    worlds: list[World] = []

    async def make(
        responder: Callable[[ModelRequest], AssistantMessage] | None = None,
        *,
        tools: list[ToolSpec] | None = None,
        approvals: list[ApprovalPolicy] | None = None,
        config: BridgeConfig | None = None,
        max_chars: int = 4000,
    ) -> World:
        clock = [1_700_000_000_000]
        faux = FauxProvider()
        faux.set_responder(responder or (lambda r: faux_assistant(f"answer to {last_user_text(r)}")))
        registry = Registry()
        harness = await Harness.open(
            await MemoryStorage.open(), models=Models(faux), registry=registry, settings=HarnessSettings()
        )
        bridge = Bridge(harness, config=config, agent=MODEL, approvals=approvals or [])
        registry.install(bridge.extension())
        if tools:
            registry.install(Extension("tools", tools=tools))
        platform = MemoryTransport(max_chars=max_chars)
        bridge.attach(platform)
        await bridge.start()
        world = World(harness, bridge, platform, faux, clock)
        worlds.append(world)
        return world

    yield make
    for world in worlds:
        await world.bridge.stop()
        await world.harness.close()


async def test_channel_message_is_answered_once_even_when_delivered_four_times(world_factory: Any) -> None:
    world = await world_factory()
    results = [await world.say("100.1", "<@BOT> status?") for _ in range(4)]
    assert [r.outcome for r in results] == ["answering", "duplicate", "duplicate", "duplicate"]
    await world.settle()
    assert world.platform.texts(CHANNEL) == ["answer to alice: <@BOT> status?"]
    assert len(world.faux.requests) == 1


async def test_unaddressed_messages_are_kept_as_context_but_not_answered(world_factory: Any) -> None:
    world = await world_factory()
    assert (await world.say("100.1", "the deploy is at 5", mention=False)).outcome == "recorded"
    await world.say("100.2", "<@BOT> when is the deploy?")
    await world.settle()
    assert world.platform.texts(CHANNEL) == ["answer to alice: <@BOT> when is the deploy?"]
    context = [user_text(m) for m in world.faux.requests[0].messages if isinstance(m, UserMessage)]
    assert context == ["alice: the deploy is at 5", "alice: <@BOT> when is the deploy?"]


async def test_busy_channel_answers_three_users_in_arrival_order(world_factory: Any) -> None:
    def respond(request: ModelRequest) -> AssistantMessage:
        return faux_assistant(f"re {last_user_text(request)}")

    world = await world_factory(respond)
    world.faux.delay_ms = 5
    for index, name in enumerate(["alice", "bob", "carol"]):
        await world.say(f"100.{index + 1}", f"question {index}", user=f"U{index}", name=name)
    await world.settle()
    assert world.platform.texts(CHANNEL) == [
        "re alice: question 0",
        "re bob: question 1",
        "re carol: question 2",
    ]


async def test_thread_under_bot_answer_forks_there(world_factory: Any) -> None:
    world = await world_factory()
    await world.say("100.1", "first question")
    await world.settle()
    [answer] = world.platform.in_place(CHANNEL)
    await world.say("100.3", "later channel message")
    await world.settle()
    thread = CHANNEL.in_thread(answer.id)
    await world.say(
        "100.4", "tell me more", place=thread, mention=False
    )  # a thread on the bot's answer needs no mention
    await world.settle()
    [thread_reply] = world.platform.in_place(thread)
    seen = [user_text(m) for m in world.faux.requests[-1].messages if isinstance(m, UserMessage)]
    assert seen == ["alice: first question", "alice: tell me more"]  # not the later channel message
    assert thread_reply.text == "answer to alice: tell me more"
    other = CHANNEL.in_thread("100.3")
    await world.say("100.5", "<@BOT> and this?", place=other)
    await world.settle()
    assert len(world.platform.in_place(other)) == 1


async def test_reply_in_thread_mode_answers_inside_the_thread_and_forks_at_the_answer(
    world_factory: Any,
) -> None:
    world = await world_factory(
        config=BridgeConfig(default=ChannelPolicy(answer="all", reply_in_thread=True))
    )
    await world.say("100.1", "deploy status?")
    await world.settle()
    thread = CHANNEL.in_thread("100.1")
    assert world.platform.texts(thread) == ["answer to alice: deploy status?"]
    await world.say("100.2", "and staging?", place=thread)
    await world.settle()
    history = world.faux.requests[-1].messages
    assert isinstance(history[1], AssistantMessage) and history[1].text() == "answer to alice: deploy status?"


async def test_crash_between_post_and_record_is_reconciled_not_reposted(world_factory: Any) -> None:
    world = await world_factory()
    world.platform.lose_next_create = True  # the post lands, the id never comes back
    await world.say("100.1", "hello")
    await world.settle()
    await asyncio.sleep(1.2)  # the worker retries after a platform error
    await world.settle()
    assert world.platform.texts(CHANNEL) == ["answer to alice: hello"]
    creates = [c for c in world.platform.calls if c[0] == "create"]
    assert len(creates) == 1
    # The retry looked the message up by its key before posting anything.
    assert ("find", creates[0][1]) in world.platform.calls


async def test_restart_finishes_pending_deliveries(world_factory: Any) -> None:
    world = await world_factory()
    await world.bridge.stop()  # delivery is down; intake still commits
    result = await world.say("100.1", "hello")
    await world.harness.wait_for_idle()
    assert world.platform.messages == []
    assert await world.harness.snapshot(ReplyDoc, key=str(result.submission_id)) is not None
    restarted = Bridge(world.harness, agent=MODEL)
    restarted.attach(world.platform)
    await restarted.start()
    await restarted.delivery.idle()
    assert world.platform.texts(CHANNEL) == ["answer to alice: hello"]
    assert await world.harness.snapshot(ReplyDoc, key=str(result.submission_id)) is None
    await restarted.stop()


async def test_streaming_edits_the_same_message_and_long_answers_are_split(world_factory: Any) -> None:
    long_answer = "\n\n".join(f"paragraph {i} " + "word " * 30 for i in range(8))
    world = await world_factory(lambda r: faux_assistant(long_answer), max_chars=400)
    world.faux.chunk_size = 40
    world.faux.delay_ms = 2
    await world.say("100.1", "write a lot")
    await world.settle()
    texts = world.platform.texts(CHANNEL)
    assert len(texts) >= 3
    assert all(len(t) <= 400 for t in texts)
    assert "\n\n".join(texts).replace("\n\n", " ").split() == long_answer.replace("\n\n", " ").split()
    assert any(m.edits for m in world.platform.messages)  # partials were shown and replaced


async def test_rate_limited_edit_is_retried(world_factory: Any) -> None:
    world = await world_factory()
    world.faux.chunk_size = 3
    world.faux.delay_ms = 3
    world.platform.fail_next("edit", RetryLater(0.05, "ratelimited"))
    await world.say("100.1", "hi")
    await world.settle()
    assert world.platform.texts(CHANNEL) == ["answer to alice: hi"]


async def replies_until(world: Any, predicate: Callable[[list[str]], bool]) -> list[str]:
    """The bot's answers in the channel once `predicate` holds (a gate's outcome is a turn of its own)."""
    replies: list[str] = []
    for _ in range(500):
        await world.settle()
        replies = [m.text for m in world.platform.in_place(CHANNEL) if m.gate is None]
        if predicate(replies):
            return replies
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {replies}")


async def test_approval_flow_refuses_non_approver_and_runs_once_after_approval(world_factory: Any) -> None:
    runs: list[str] = []

    @tool
    def deploy(service: str) -> str:
        """Deploy a service."""
        runs.append(service)
        return f"deployed {service}"

    policy = ApprovalPolicy(tools=["deploy"], approvers=["UBOSS"])
    world = await world_factory(deploy_flow, tools=[deploy], approvals=[policy])
    await world.say("100.1", "ship it")
    for _ in range(200):
        gates = [m for m in world.platform.messages if m.gate is not None]
        if gates:
            break
        await asyncio.sleep(0.01)
    [gate_message] = gates
    gate_id = gate_message.gate.gate_id  # type: ignore[union-attr]
    refused = await world.bridge.decide(gate_id, user_id="URANDOM", user_name="mallory", action="approve")
    assert not refused.accepted and refused.reason == "not_an_approver"
    requester = await world.bridge.decide(gate_id, user_id="U1", user_name="alice", action="approve")
    assert not requester.accepted and requester.reason == "not_an_approver"
    accepted = await world.bridge.decide(gate_id, user_id="UBOSS", user_name="boss", action="approve")
    assert accepted.accepted and accepted.status == "approved"
    again = await world.bridge.decide(gate_id, user_id="UBOSS", user_name="boss", action="deny")
    assert not again.accepted and again.reason == "already_decided" and again.decided_by == "boss"
    replies = await replies_until(world, lambda r: any("deploy result" in t for t in r))
    await world.bridge.approvals.stop()
    assert runs == ["api"]
    assert "approved by boss" in world.platform.by_id(gate_message.id).text
    waiting, outcome = waiting_and_outcome(replies)
    assert "awaits approval" in waiting and "may approve: UBOSS" in waiting
    assert outcome.endswith("was approved by boss and ran. Result: deployed api")
    # The outcome is posted after the card, not by editing a message above it.
    order = [m.id for m in world.platform.in_place(CHANNEL)]
    assert order.index(gate_message.id) < order.index(
        next(m.id for m in world.platform.in_place(CHANNEL) if m.text == outcome)
    )


async def test_approval_expiry_denies(world_factory: Any) -> None:
    runs: list[str] = []

    @tool
    def deploy(service: str) -> str:
        """Deploy a service."""
        runs.append(service)
        return "deployed"

    policy = ApprovalPolicy(tools=["deploy"], approvers=["UBOSS"], expires_after_ms=100)
    world = await world_factory(deploy_flow, tools=[deploy], approvals=[policy])
    await world.say("100.1", "ship it")
    replies = await replies_until(world, lambda r: any("deploy result" in t for t in r))
    assert runs == []
    assert "expired without a decision; it did not run" in waiting_and_outcome(replies)[1]


async def test_schedule_tool_fires_an_input_into_the_same_place(world_factory: Any) -> None:
    def respond(request: ModelRequest) -> AssistantMessage:
        last = request.messages[-1]
        text = last_user_text(request)
        if isinstance(last, ToolResultMessage):
            return faux_assistant(f"ok: {last.text()}")
        if text.startswith("(scheduled)"):
            return faux_assistant("time to check the deploy!")
        return faux_assistant(
            [faux_tool_call("schedule", {"message": "check the deploy", "delay_minutes": 0.002}, id="s1")]
        )

    world = await world_factory(respond)
    await world.say("100.1", "remind me")
    await world.settle()
    for _ in range(300):
        if "time to check the deploy!" in world.platform.texts(CHANNEL):
            break
        await asyncio.sleep(0.01)
        await world.settle()
    texts = world.platform.texts(CHANNEL)
    assert texts[0].startswith("ok: Scheduled in 1 second (at ")
    assert texts[-1] == "time to check the deploy!"


async def test_catch_up_feeds_missed_messages_through_the_same_dedupe(world_factory: Any) -> None:
    world = await world_factory()
    await world.say("100.1", "first")
    await world.settle()
    world.platform.human[CHANNEL.key] = [
        IncomingMessage(CHANNEL, "100.1", "U1", "alice", "first", mentions_bot=True),
        IncomingMessage(CHANNEL, "100.2", "U2", "bob", "missed while down", mentions_bot=True),
    ]
    assert await world.bridge.catch_up(world.platform) == 1
    await world.settle()
    assert world.platform.texts(CHANNEL) == ["answer to alice: first", "answer to bob: missed while down"]


async def test_requester_who_is_an_approver_cannot_approve_their_own_request(world_factory: Any) -> None:
    runs: list[str] = []

    @tool
    def deploy(service: str) -> str:
        """Deploy a service."""
        runs.append(service)
        return "deployed"

    world = await world_factory(
        deploy_flow, tools=[deploy], approvals=[ApprovalPolicy(tools=["deploy"], approvers=["U1", "UBOSS"])]
    )
    await world.say("100.1", "ship it")  # U1 asks
    for _ in range(200):
        gates = [m for m in world.platform.messages if m.gate is not None]
        if gates:
            break
        await asyncio.sleep(0.01)
    gate_id = gates[0].gate.gate_id  # type: ignore[union-attr]
    own = await world.bridge.decide(gate_id, user_id="U1", user_name="alice", action="approve")
    assert not own.accepted and own.reason == "self_approval"
    assert (await world.bridge.decide(gate_id, user_id="UBOSS", user_name="boss", action="approve")).accepted
    await replies_until(world, lambda r: any("deploy result" in t for t in r))
    assert runs == ["api"]


async def test_graceful_stop_lets_a_post_in_flight_record_its_id(world_factory: Any) -> None:
    world = await world_factory()
    entered = asyncio.Event()
    release = asyncio.Event()
    original = world.platform.create

    async def slow_create(target: Place, text: str, key: str, **context: Any) -> str:
        entered.set()
        await release.wait()
        return await original(target, text, key, **context)

    world.platform.create = slow_create  # type: ignore[method-assign]
    result = await world.say("100.1", "hello")
    await asyncio.wait_for(entered.wait(), 5)
    stopping = asyncio.ensure_future(world.bridge.stop())
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.wait_for(stopping, 5)
    reply = await world.harness.snapshot(ReplyDoc, key=str(result.submission_id))
    posted = world.platform.in_place(CHANNEL)
    assert len(posted) == 1
    # The post that was under way got recorded (or the reply finished), so a restart edits it, never reposts.
    assert reply is None or reply["parts"][0]["message_id"] == posted[0].id


async def test_create_is_told_whether_the_text_is_final_and_who_asked(world_factory: Any) -> None:
    world = await world_factory()
    world.faux.chunk_size = 4
    world.faux.delay_ms = 5
    await world.say("100.1", "stream please", user="UALICE")
    await world.settle()
    assert world.platform.creates[0]["final"] is False  # the first partial starts a streaming reply
    assert world.platform.creates[0]["requester"] == "UALICE"
    await world.bridge.stop()
    world.platform.creates.clear()
    result = await world.say("100.2", "answer while delivery is down", user="UBOB", name="bob")
    await world.harness.wait_for_idle()
    restarted = Bridge(world.harness, agent=MODEL)
    restarted.attach(world.platform)
    await restarted.start()
    await restarted.delivery.idle()
    await restarted.stop()
    assert world.platform.creates == [
        {"key": f"reply:{result.submission_id}#0", "final": True, "requester": "UBOB"}
    ]
