"""A pending approval gate never blocks its conversation (DESIGN.md §5): the gated call is answered at once
with "awaits approval", other people's messages in the same channel are answered while the gate waits, and the
decision (whenever it comes) runs the tool once and is reported as a turn of its own where the request was
made. Also: withdrawal by the requester only, a second click answered with who decided and when, and a click
that counts only on the gate's own message."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from adapters.bridge import ApprovalDoc, ApprovalPolicy, BridgeConfig, ChannelPolicy, ClickOrigin
from adapters.bridge.testing import PostedMessage
from harness_core import CORE_TOOL_RESULT, CORE_USER, ToolSpec, tool
from harness_core.messages import AssistantMessage, user_text

from .support import CHANNEL, Bot, deploy_flow, waiting_and_outcome

BotFactory = Callable[..., Awaitable[Bot]]
POLICY = ApprovalPolicy(tools=["deploy"], approvers=["UBOSS"])


def deploy_tool(runs: list[str]) -> ToolSpec:
    @tool
    def deploy(service: str) -> str:
        """Deploy a service."""
        runs.append(service)
        return f"deployed {service}"

    return deploy


async def gate_messages(bot: Bot, count: int = 1) -> list[PostedMessage]:
    for _ in range(500):
        gates = [m for m in bot.platform.messages if m.gate is not None]
        if len(gates) >= count:
            return gates
        await asyncio.sleep(0.01)
    raise AssertionError(f"fewer than {count} approval requests: {bot.platform.snapshot()}")


async def until(bot: Bot, predicate: Callable[[], bool], what: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within {seconds}s: {what}; posted: {bot.platform.snapshot()}")


def texts(bot: Bot) -> list[str]:
    return [m.text for m in bot.platform.messages if m.gate is None]


async def test_other_people_are_answered_while_a_gate_is_pending_and_approval_runs_it_once(
    bots: BotFactory,
) -> None:
    runs: list[str] = []
    bot = await bots(responder=deploy_flow, tools=[deploy_tool(runs)], approvals=[POLICY])
    await bot.say("100.1", "ship it", user="U1", name="alice")
    [card] = await gate_messages(bot)
    await until(bot, lambda: any(t.startswith("waiting: ") for t in texts(bot)), "the turn ends")
    await bot.say("100.2", "what is the weather?", user="U2", name="bob")
    await bot.say("100.3", "how many users today?", user="U3", name="carol")
    await until(
        bot,
        lambda: (
            {"answer to bob: what is the weather?", "answer to carol: how many users today?"}
            <= set(texts(bot))
        ),
        "both unrelated questions are answered while the gate is pending",
        seconds=5,
    )
    gate = await bot.harness.snapshot(ApprovalDoc, key=str(card.gate.gate_id))  # type: ignore[union-attr]
    assert gate["status"] == "pending" and runs == []

    decision = await bot.bridge.decide(
        card.gate.gate_id,  # type: ignore[union-attr]
        user_id="UBOSS",
        user_name="boss",
        action="approve",
    )
    assert decision.accepted
    await until(bot, lambda: any(t.startswith("deploy result: ") for t in texts(bot)), "the outcome")
    await bot.settle()
    await asyncio.sleep(0.1)
    assert runs == ["api"]
    waiting, outcome = waiting_and_outcome(texts(bot))
    assert "awaits approval" in waiting and f"request #{card.gate.gate_id}" in waiting  # type: ignore[union-attr]
    assert "`deploy service=api` was approved by boss and ran. Result: deployed api" in outcome
    channel = bot.platform.in_place(CHANNEL)
    assert [m.id for m in channel].index(card.id) < [m.text for m in channel].index(outcome)

    # The transcript: every tool call has exactly one result (the "awaits approval" note); the outcome is a
    # user entry of its own that started a new turn.
    entries = await bot.entries(CHANNEL)
    results = [e for e in entries if e.kind == CORE_TOOL_RESULT]
    calls = [
        c.id
        for e in entries
        for m in e.model or ()
        if isinstance(m, AssistantMessage)
        for c in m.tool_calls()
    ]
    assert len(calls) == 1 and len(results) == 1
    assert "awaits approval" in results[0].model[0].text()  # type: ignore[index, union-attr]
    reports = [e for e in entries if e.kind == CORE_USER and user_text(e.model[0]).startswith("(approval #")]  # type: ignore[index, arg-type]
    assert len(reports) == 1 and reports[0].id > results[0].id


async def test_the_outcome_is_reported_in_the_thread_where_the_request_was_made(bots: BotFactory) -> None:
    runs: list[str] = []
    config = BridgeConfig(default=ChannelPolicy(reply_in_thread=True))
    bot = await bots(responder=deploy_flow, tools=[deploy_tool(runs)], approvals=[POLICY], config=config)
    await bot.say("100.1", "ship it")
    [card] = await gate_messages(bot)
    thread = CHANNEL.in_thread("100.1")
    assert card.target == thread
    await bot.bridge.decide(card.gate.gate_id, user_id="UBOSS", user_name="boss", action="deny")  # type: ignore[union-attr]
    await until(bot, lambda: any(t.startswith("deploy result: ") for t in texts(bot)), "the outcome")
    [outcome] = [m for m in bot.platform.messages if m.text.startswith("deploy result: ")]
    assert outcome.target == thread and "was denied by boss; it did not run" in outcome.text
    assert runs == []


async def test_several_gates_pending_in_one_conversation_are_decided_independently(bots: BotFactory) -> None:
    runs: list[str] = []
    bot = await bots(responder=deploy_flow, tools=[deploy_tool(runs)], approvals=[POLICY])
    await bot.say("100.1", "ship it", user="U1", name="alice")
    await bot.say("100.2", "ship it too", user="U2", name="bob")
    first, second = await gate_messages(bot, 2)
    assert first.gate is not None and second.gate is not None
    assert (
        await bot.bridge.decide(second.gate.gate_id, user_id="U2", user_name="bob", action="withdraw")
    ).accepted
    assert (
        await bot.bridge.decide(first.gate.gate_id, user_id="UBOSS", user_name="boss", action="approve")
    ).accepted
    await until(bot, lambda: sum(t.startswith("deploy result: ") for t in texts(bot)) == 2, "two outcomes")
    reports = sorted(t for t in texts(bot) if t.startswith("deploy result: "))
    assert any("approved by boss and ran" in r for r in reports)
    assert any("was withdrawn by bob; it did not run" in r for r in reports)
    assert runs == ["api"]


async def test_only_the_requester_may_withdraw(bots: BotFactory) -> None:
    bot = await bots(responder=deploy_flow, tools=[deploy_tool([])], approvals=[POLICY])
    await bot.say("100.1", "ship it", user="U1", name="alice")
    [card] = await gate_messages(bot)
    gate_id = card.gate.gate_id  # type: ignore[union-attr]
    other = await bot.bridge.decide(gate_id, user_id="UBOSS", user_name="boss", action="withdraw")
    assert (other.accepted, other.reason, other.status) == (False, "not_the_requester", "pending")
    own = await bot.bridge.decide(gate_id, user_id="U1", user_name="alice", action="withdraw")
    assert (own.accepted, own.status) == (True, "withdrawn")
    await until(bot, lambda: "withdrawn" in bot.platform.by_id(card.id).text, "the card shows the withdrawal")


async def test_a_second_click_says_who_decided_and_when(bots: BotFactory) -> None:
    bot = await bots(responder=deploy_flow, tools=[deploy_tool([])], approvals=[POLICY])
    await bot.say("100.1", "ship it")
    [card] = await gate_messages(bot)
    gate_id = card.gate.gate_id  # type: ignore[union-attr]
    first = await bot.bridge.decide(gate_id, user_id="UBOSS", user_name="boss", action="approve")
    again = await bot.bridge.decide(gate_id, user_id="UBOSS", user_name="boss", action="deny")
    assert (again.accepted, again.reason, again.status, again.decided_by) == (
        False,
        "already_decided",
        "approved",
        "boss",
    )
    assert again.decided_at == first.decided_at and again.decided_at is not None


async def test_a_click_counts_only_on_the_gates_own_message(bots: BotFactory) -> None:
    runs: list[str] = []
    bot = await bots(responder=deploy_flow, tools=[deploy_tool(runs)], approvals=[POLICY])
    await bot.say("100.1", "ship it")
    [card] = await gate_messages(bot)
    gate_id = card.gate.gate_id  # type: ignore[union-attr]
    await until(
        bot,
        lambda: bool(bot.bridge.approvals.gates.get(str(gate_id), {}).get("message", {}).get("id")),
        "recorded",
    )
    for origin in (ClickOrigin("C2", card.id), ClickOrigin(CHANNEL.channel, "999.9")):
        refused = await bot.bridge.decide(
            gate_id, user_id="UBOSS", user_name="boss", action="approve", origin=origin
        )
        assert (refused.accepted, refused.reason) == (False, "wrong_message"), origin
    gate = await bot.harness.snapshot(ApprovalDoc, key=str(gate_id))
    assert gate["status"] == "pending"
    accepted = await bot.bridge.decide(
        gate_id,
        user_id="UBOSS",
        user_name="boss",
        action="approve",
        origin=ClickOrigin(CHANNEL.channel, card.id),
    )
    assert accepted.accepted
    await until(bot, lambda: runs == ["api"], "the tool ran")
