"""Approval gates: a `before_tool` hook plus a memo, a durable wait, and authorization checked server-side.

The first time a gated call reaches the hook, an approval request is committed (`bridge.approval`, keyed by
the tool task id) and the tool task waits durably (`Defer`) until it is woken or the request expires; it
holds no invocation while a human decides, so a restart costs nothing. A click is checked against the
request's approvers (user ids, user groups or roles; no self-approval unless allowed), committed first-writer
wins, and wakes the task; the hook then memoizes the decision, so a decided call is never asked again, even
after a crash. Expiry denies.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapters.bridge.delivery import pacing_key
from adapters.bridge.docs import ApprovalDoc, PlaceOfDoc, ReplyDoc
from adapters.bridge.model import Place, RetryLater, TransportError
from adapters.bridge.transport import GateView, Transport
from harness_core import Block, Defer, Extension, LiveDoc, Task, ToolCallInfo, ToolHookApi, Tx, hook

if TYPE_CHECKING:
    from adapters.bridge.bridge import Bridge

log = logging.getLogger("adapters.bridge")


@dataclass(frozen=True)
class ApprovalPolicy:
    tools: Sequence[str]
    approvers: Sequence[str] = ()  # user ids, `platform:id` (bare ids only when one platform runs)
    groups: Sequence[str] = ()  # Slack user group ids / Discord role ids, `platform:id` or bare likewise
    allow_self_approval: bool = False
    expires_after_ms: int = 3_600_000


def split_entry(entry: str) -> tuple[str | None, str]:
    """(platform, id) of an approver or group entry: `slack:U0LEAD` -> ("slack", "U0LEAD"); a bare `U0LEAD`
    -> (None, "U0LEAD")."""
    platform, colon, rest = entry.partition(":")
    if colon and rest and platform.isidentifier() and platform.islower():
        return platform, rest
    return None, entry


def entry_matches(entry: str, platform: str | None, value: str, *, platforms: int) -> bool:
    """Whether `entry` names `value` on `platform`. A namespaced entry (`devchat:lead`) matches only on its
    platform. A bare entry is unambiguous only while the bridge serves one platform (`platforms` <= 1): a
    devchat user who types the name `U0LEADSLACK` must never count as the Slack user U0LEADSLACK."""
    entry_platform, entry_id = split_entry(entry)
    if entry_id != value:
        return False
    if entry_platform is not None:
        return entry_platform == platform
    return platforms <= 1


def is_approver(
    gate: dict[str, Any],
    platform: str | None,
    user_id: str,
    user_groups: Collection[str] | None,
    *,
    platforms: int,
) -> bool:
    """Who counts as an approver of `gate`: a listed user, or a member of a listed group (Slack user group,
    Discord role), on the platform the click came from."""
    if any(entry_matches(e, platform, user_id, platforms=platforms) for e in gate.get("approvers", [])):
        return True
    groups = set(user_groups or ())
    return any(
        entry_matches(e, platform, group, platforms=platforms)
        for e in gate.get("groups", [])
        for group in groups
    )


@dataclass(frozen=True)
class Decision:
    accepted: bool
    status: str  # the gate's status after the click
    decided_by: str | None = None
    reason: str | None = None  # unknown_gate | already_decided | expired | not_an_approver | self_approval


def gate_view(gate_id: int, gate: dict[str, Any]) -> GateView:
    requester = gate.get("requester") or {}
    return GateView(
        gate_id=gate_id,
        tool=str(gate.get("tool")),
        arguments=dict(gate.get("arguments") or {}),
        requester_id=requester.get("user_id"),
        requester_name=requester.get("user_name"),
        status=str(gate.get("status")),
        decided_by=gate.get("decided_by"),
        decided_at=gate.get("decided_at"),
        expires_at=int(gate.get("expires_at", 0)),
    )


@dataclass
class _Renderer:
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class Approvals:
    def __init__(self, bridge: Bridge, policies: Sequence[ApprovalPolicy]) -> None:
        self.bridge = bridge
        self.policies = list(policies)
        self.gates: dict[str, dict[str, Any]] = {}  # gate id -> latest committed value
        self.renderers: dict[str, _Renderer] = {}
        self.stopping = False

    def policy_for(self, tool: str) -> ApprovalPolicy | None:
        return next((p for p in self.policies if tool in p.tools), None)

    def extension(self) -> Extension:
        return Extension("bridge-approvals", hooks=[hook("core.tool", before_tool=self.before_tool)])

    def pending_in(self, conversation_id: int) -> list[dict[str, Any]]:
        return [
            g
            for g in self.gates.values()
            if g.get("conversation_id") == conversation_id and g.get("status") == "pending"
        ]

    # --- the hook (runs inside the tool task) --------------------------------------------------------------

    async def before_tool(self, call: ToolCallInfo, api: ToolHookApi) -> Any:
        policy = self.policy_for(call.name)
        if policy is None:
            return None
        memo_key = f"approval:{call.call_id}"
        decided = await api.memo(memo_key)
        if decided is None:
            harness = self.bridge.harness
            gate = await harness.snapshot(ApprovalDoc, key=str(api.task_id))
            if gate is None:
                expires_at = api.now() + policy.expires_after_ms
                await self._request(api, call, policy, expires_at)
                return Defer(until=expires_at)
            if gate.get("status") == "pending":
                if api.now() < int(gate["expires_at"]):
                    return Defer(until=int(gate["expires_at"]))
                gate = await self._expire(api)
            decided = await api.memo(memo_key, {"status": gate["status"], "by": gate.get("decided_by")})
        if decided["status"] == "approved":
            return None
        if decided["status"] == "expired":
            return Block(f"{call.name} was not approved in time (the request expired)")
        return Block(f"{call.name} was denied by {decided.get('by') or 'an approver'}")

    async def _request(
        self, api: ToolHookApi, call: ToolCallInfo, policy: ApprovalPolicy, expires_at: int
    ) -> None:
        harness = self.bridge.harness
        conversation_id = api.conversation_id
        live = await harness.snapshot(LiveDoc, conversation_id) or {}
        inputs = (live.get("run") or {}).get("inputs") or []
        reply = await harness.snapshot(ReplyDoc, key=str(inputs[0])) if inputs else None
        if reply is not None:
            target = reply["target"]
            requester = reply.get("requester")
        else:
            place_of = await harness.snapshot(PlaceOfDoc, conversation_id) or {}
            target = place_of.get("place")
            requester = None

        async def commit(tx: Tx, task: Task) -> None:
            await tx.doc(
                ApprovalDoc,
                key=str(task.id),
                seed={
                    "tool": call.name,
                    "arguments": call.arguments,
                    "conversation_id": conversation_id,
                    "target": target,
                    "requester": requester,
                    "approvers": list(policy.approvers),
                    "groups": list(policy.groups),
                    "allow_self_approval": policy.allow_self_approval,
                    "created_at": api.now(),
                    "expires_at": expires_at,
                    "status": "pending",
                },
            )

        await api.commit(commit)

    async def _expire(self, api: ToolHookApi) -> dict[str, Any]:
        async def commit(tx: Tx, task: Task) -> dict[str, Any]:
            doc = await tx.doc(ApprovalDoc, key=str(task.id), seed={})
            if doc.value.get("status") == "pending":
                doc.value["status"] = "expired"
                doc.value["decided_at"] = tx.now
            return dict(doc.value)

        value: dict[str, Any] = await api.commit(commit)
        return value

    # --- clicks ------------------------------------------------------------------------------------------

    async def decide(
        self,
        gate_id: int,
        *,
        user_id: str,
        user_name: str,
        approve: bool,
        user_groups: Collection[str] | None = None,
        operator: bool = False,
        platform: str | None = None,
    ) -> Decision:
        """Record a click from `platform`. Checks the approver policy stored with the request; first decision
        wins.

        `operator=True`: an operator's override from the command line (`durable-bots approvals decide`): the
        approver policy is not checked, the decision is recorded with `operator_override: true`, and this
        call schedules nothing (a running bot's harness is already scheduling; a CLI process must not)."""
        harness = self.bridge.harness
        gate = await harness.snapshot(ApprovalDoc, key=str(gate_id))
        if gate is None:
            return Decision(False, "unknown", reason="unknown_gate")
        if gate.get("status") != "pending":
            return Decision(False, str(gate["status"]), gate.get("decided_by"), "already_decided")
        platforms = len(self.bridge.transports)
        allowed = is_approver(gate, platform, user_id, user_groups, platforms=platforms)
        if not allowed and not operator:
            return Decision(False, "pending", reason="not_an_approver")
        requester = (gate.get("requester") or {}).get("user_id")
        if requester == user_id and not gate.get("allow_self_approval") and not operator:
            return Decision(False, "pending", reason="self_approval")

        async def commit(tx: Tx) -> Decision:
            doc = await tx.doc(ApprovalDoc, key=str(gate_id), seed={})
            if doc.value.get("status") != "pending":
                return Decision(
                    False, str(doc.value["status"]), doc.value.get("decided_by"), "already_decided"
                )
            if tx.now >= int(doc.value.get("expires_at", tx.now + 1)):
                # Past its expiry the gate's task may not have run yet (the bot was down, or it is about to
                # wake): the click is still too late. Mark it expired now so the task blocks the tool.
                doc.value["status"] = "expired"
                doc.value["decided_at"] = tx.now
                await harness.wake_task(tx, gate_id)
                return Decision(False, "expired", reason="expired")
            doc.value["status"] = "approved" if approve else "denied"
            doc.value["decided_by"] = user_name
            doc.value["decided_by_id"] = user_id
            doc.value["decided_at"] = tx.now
            if operator:
                doc.value["operator_override"] = True
            await harness.wake_task(tx, gate_id)
            return Decision(True, str(doc.value["status"]), user_name)

        decision = await harness.commit(commit)
        if not operator:
            harness.resume()
        return decision

    # --- rendering approval messages -----------------------------------------------------------------------

    def track(self, key: str, value: dict[str, Any]) -> None:
        self.gates[key] = value
        if value.get("message_rendered") != value.get("status") or not (value.get("message") or {}).get("id"):
            self.kick(key)

    def kick(self, key: str) -> None:
        if self.stopping:
            return
        renderer = self.renderers.get(key)
        if renderer is None:
            renderer = self.renderers[key] = _Renderer()
        renderer.changed.set()
        if renderer.task is None or renderer.task.done():
            renderer.task = asyncio.get_running_loop().create_task(
                self._render_loop(key, renderer), name=f"bridge-approval-{key}"
            )

    async def _render_loop(self, key: str, renderer: _Renderer) -> None:
        while not self.stopping:
            await renderer.changed.wait()
            renderer.changed.clear()
            try:
                if await self._render(key):
                    return
            except RetryLater as exc:
                await asyncio.sleep(exc.seconds)
                renderer.changed.set()
            except TransportError as exc:
                log.warning("approval %s: platform error, retrying: %s", key, exc)
                await asyncio.sleep(1.0)
                renderer.changed.set()

    async def _render(self, key: str) -> bool:
        """Post the request once, then show its decision once. True when nothing is left to do."""
        harness = self.bridge.harness
        gate = await harness.snapshot(ApprovalDoc, key=key)
        if gate is None or gate.get("target") is None:
            return True
        target = Place.from_json(gate["target"])
        transport = self.bridge.transports.get(target.platform)
        if transport is None:
            return True
        message = gate.get("message") or {}
        message_key = f"approval:{key}"
        view = gate_view(int(key), gate)
        message_id = message.get("id")
        if message_id is None:
            if message.get("key") is not None:
                message_id = await transport.find(target, message_key)
            else:
                await self._set_message(key, {"key": message_key, "id": None})
            if message_id is None:
                # A write into the channel like a reply's: it takes its turn in the channel's budget.
                async with self._pace(transport, target):
                    message_id = await transport.post_approval(target, view, message_key)
            await self._set_message(key, {"key": message_key, "id": message_id})
            if view.status == "pending":
                return False
        if view.status != "pending" and gate.get("message_rendered") != view.status:
            async with self._pace(transport, target):
                await transport.update_approval(target, message_id, view)

            async def rendered(tx: Tx) -> None:
                doc = await tx.doc(ApprovalDoc, key=key, seed={})
                doc.value["message_rendered"] = view.status

            await harness.commit(rendered)
            return True
        return view.status != "pending"

    def _pace(self, transport: Transport, target: Place) -> AbstractAsyncContextManager[None]:
        """The slot for one write into `target`'s channel, shared with every reply worker writing there."""
        return self.bridge.governor(target.platform).slot(
            pacing_key(target), interval=transport.edit_interval
        )

    async def _set_message(self, key: str, message: dict[str, Any]) -> None:
        async def commit(tx: Tx) -> None:
            doc = await tx.doc(ApprovalDoc, key=key, seed={})
            doc.value["message"] = message

        await self.bridge.harness.commit(commit)

    async def stop(self) -> None:
        self.stopping = True
        tasks = [r.task for r in self.renderers.values() if r.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
