"""Approval gates at the bridge, edge cases (DESIGN.md §5 "Approval gates"): self-approval when configured, a
click on an expired gate, and a gate whose expiry passes while the bot is down (real SQLite file, reopened with
the clock moved forward): expired after the restart, never asked again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from adapters.bridge import ApprovalDoc, ApprovalPolicy
from adapters.bridge.testing import MemoryTransport, PostedMessage
from harness_core import ToolSpec, tool

from .support import CHANNEL, Bot, Clock, deploy_flow, waiting_and_outcome

BotFactory = Callable[..., Awaitable[Bot]]
MINUTE = 60_000


def deploy_tool(runs: list[str]) -> ToolSpec:
    @tool
    def deploy(service: str) -> str:
        """Deploy a service."""
        runs.append(service)
        return f"deployed {service}"

    return deploy


async def gate_message(bot: Bot) -> PostedMessage:
    for _ in range(500):
        gates = [m for m in bot.platform.messages if m.gate is not None]
        if gates:
            [gate] = gates
            return gate
        await asyncio.sleep(0.01)
    raise AssertionError(f"no approval request was posted: {bot.platform.snapshot()}")


def gate_id(message: PostedMessage) -> int:
    assert message.gate is not None
    return message.gate.gate_id


def replies(platform: MemoryTransport) -> list[str]:
    return [m.text for m in platform.in_place(CHANNEL) if m.gate is None]


async def outcome(bot: Bot) -> str:
    """The report of the gate's outcome (a turn of its own, after the "waiting" answer)."""
    for _ in range(500):
        await bot.settle()
        if any(r.startswith("deploy result: ") for r in replies(bot.platform)):
            return waiting_and_outcome(replies(bot.platform))[1]
        await asyncio.sleep(0.01)
    raise AssertionError(f"no outcome was reported: {replies(bot.platform)}")


async def test_self_approval_when_allowed_lets_the_requester_approve(bots: BotFactory) -> None:
    runs: list[str] = []
    policy = ApprovalPolicy(tools=["deploy"], approvers=["U1"], allow_self_approval=True)
    bot = await bots(responder=deploy_flow, tools=[deploy_tool(runs)], approvals=[policy])
    await bot.say("100.1", "ship it", user="U1", name="alice")
    message = await gate_message(bot)
    assert message.gate is not None and message.gate.requester_id == "U1"
    decision = await bot.bridge.decide(gate_id(message), user_id="U1", user_name="alice", action="approve")
    assert (decision.accepted, decision.status, decision.decided_by) == (True, "approved", "alice")
    assert (await outcome(bot)).endswith("approved by alice and ran. Result: deployed api")
    await bot.bridge.approvals.stop()
    assert runs == ["api"]
    assert "approved by alice" in bot.platform.by_id(message.id).text


async def test_self_approval_does_not_make_the_requester_an_approver(bots: BotFactory) -> None:
    runs: list[str] = []
    policy = ApprovalPolicy(tools=["deploy"], approvers=["UBOSS"], allow_self_approval=True)
    bot = await bots(responder=deploy_flow, tools=[deploy_tool(runs)], approvals=[policy])
    await bot.say("100.1", "ship it", user="U1", name="alice")
    message = await gate_message(bot)
    decision = await bot.bridge.decide(gate_id(message), user_id="U1", user_name="alice", action="approve")
    assert (decision.accepted, decision.reason) == (False, "not_an_approver")
    assert runs == []


async def test_a_click_on_an_expired_gate_is_refused_and_says_it_expired(bots: BotFactory) -> None:
    runs: list[str] = []
    policy = ApprovalPolicy(tools=["deploy"], approvers=["UBOSS"], expires_after_ms=150)
    bot = await bots(responder=deploy_flow, tools=[deploy_tool(runs)], approvals=[policy])
    await bot.say("100.1", "ship it")
    message = await gate_message(bot)
    report = await outcome(bot)  # the gate expires, the tool does not run, the model reports it
    for _ in range(200):  # the approval message is updated to show the expiry
        if "expired" in message.text:
            break
        await asyncio.sleep(0.01)
    assert message.gate is not None and message.gate.status == "expired"
    decision = await bot.bridge.decide(gate_id(message), user_id="UBOSS", user_name="boss", action="approve")
    assert (decision.accepted, decision.status, decision.reason) == (False, "expired", "already_decided")
    gate = await bot.harness.snapshot(ApprovalDoc, key=str(gate_id(message)))
    assert gate["status"] == "expired" and gate.get("decided_by") is None
    await bot.settle()
    assert runs == []
    assert "expired without a decision; it did not run" in report
    assert len(replies(bot.platform)) == 2


async def _ask_then_close(
    bots: BotFactory, path: Path, clock: Clock, runs: list[str], platform: MemoryTransport
) -> tuple[Bot, int]:
    policy = ApprovalPolicy(tools=["deploy"], approvers=["UBOSS"], expires_after_ms=60 * MINUTE)
    bot = await bots(
        path,
        responder=deploy_flow,
        tools=[deploy_tool(runs)],
        approvals=[policy],
        platform=platform,
        clock=clock,
    )
    await bot.say("100.1", "ship it")
    gate = gate_id(await gate_message(bot))
    for _ in range(200):  # the request message is recorded before the bot goes down
        doc = await bot.harness.snapshot(ApprovalDoc, key=str(gate))
        if (doc.get("message") or {}).get("id"):
            break
        await asyncio.sleep(0.01)
    await bot.close()
    return bot, gate


async def _reopen(
    bots: BotFactory, path: Path, clock: Clock, runs: list[str], platform: MemoryTransport, offset_ms: int
) -> Bot:
    clock.offset_ms = offset_ms
    policy = ApprovalPolicy(tools=["deploy"], approvers=["UBOSS"], expires_after_ms=60 * MINUTE)
    return await bots(
        path,
        responder=deploy_flow,
        tools=[deploy_tool(runs)],
        approvals=[policy],
        platform=platform,
        clock=clock,
    )


async def test_a_gate_that_expires_while_the_bot_is_down_is_expired_after_restart_not_asked_again(
    tmp_path: Path, bots: BotFactory
) -> None:
    path, clock, runs, platform = tmp_path / "bot.sqlite", Clock(), [], MemoryTransport()
    _, gate = await _ask_then_close(bots, path, clock, runs, platform)
    bot = await _reopen(bots, path, clock, runs, platform, 61 * MINUTE)
    report = await outcome(bot)
    for _ in range(200):
        if ("update_approval", str(gate)) in platform.calls:
            break
        await asyncio.sleep(0.01)
    await bot.bridge.approvals.stop()
    doc = await bot.harness.snapshot(ApprovalDoc, key=str(gate))
    assert doc["status"] == "expired"
    assert runs == []
    assert [c for c in platform.calls if c[0] == "post_approval"] == [("post_approval", f"approval:{gate}")]
    assert list(await bot.harness.family(ApprovalDoc)) == [str(gate)]
    [message] = [m for m in platform.messages if m.gate is not None]
    assert message.gate is not None and message.gate.status == "expired"
    assert "expired without a decision" in report and len(replies(platform)) == 2
    refused = await bot.bridge.decide(gate, user_id="UBOSS", user_name="boss", action="approve")
    assert (refused.accepted, refused.status) == (False, "expired")


async def test_a_gate_still_pending_after_restart_is_decided_without_asking_again(
    tmp_path: Path, bots: BotFactory
) -> None:
    path, clock, runs, platform = tmp_path / "bot.sqlite", Clock(), [], MemoryTransport()
    _, gate = await _ask_then_close(bots, path, clock, runs, platform)
    bot = await _reopen(bots, path, clock, runs, platform, 30 * MINUTE)
    bot.harness.resume()
    await asyncio.sleep(0.2)
    assert runs == []
    decision = await bot.bridge.decide(gate, user_id="UBOSS", user_name="boss", action="approve")
    assert decision.accepted
    report = await outcome(bot)
    await bot.bridge.approvals.stop()
    assert runs == ["api"]
    assert [c for c in platform.calls if c[0] == "post_approval"] == [("post_approval", f"approval:{gate}")]
    assert report.endswith("approved by boss and ran. Result: deployed api")


async def test_a_click_after_the_expiry_is_refused_even_before_the_gate_is_marked_expired(
    tmp_path: Path, bots: BotFactory
) -> None:
    path, clock, runs, platform = tmp_path / "bot.sqlite", Clock(), [], MemoryTransport()
    _, gate = await _ask_then_close(bots, path, clock, runs, platform)
    bot = await _reopen(bots, path, clock, runs, platform, 61 * MINUTE)
    decision = await bot.bridge.decide(gate, user_id="UBOSS", user_name="boss", action="approve")
    report = await outcome(bot)
    await bot.bridge.approvals.stop()
    assert runs == []
    assert (decision.accepted, decision.status, decision.reason) == (False, "expired", "expired")
    doc = await bot.harness.snapshot(ApprovalDoc, key=str(gate))
    assert doc["status"] == "expired" and doc.get("decided_by") is None
    assert "expired without a decision" in report and len(replies(platform)) == 2
