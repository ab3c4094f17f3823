"""Approval gates: a `before_tool` hook that detaches the gated call, a durable gate task, and authorization
checked server-side (DESIGN.md §5 "Approval gates", "A pending gate never blocks its conversation").

The first time a gated call reaches the hook, one commit records the approval request (`bridge.approval`, keyed
by the tool task id: that id is the gate id people see) and creates the gate task (`bridge.gate`, a background
task of the conversation). The hook then answers the call at once with `Detach`: the model gets a result saying
the call awaits approval (gate, approvers, expiry), the run's turn ends, and the conversation goes on taking and
answering messages; several gates may be pending in one conversation.

The gate task waits durably (no invocation, no memory) until a decision wakes it or the expiry passes. Approved,
it commits the call's intent and runs the tool once (`run_detached_tool`: after a crash inside the tool a
replay-unsafe tool is reported as "may have partially run", never run twice); denied, expired or withdrawn, it
runs nothing. Either way one commit records the outcome and submits it as an input of its own (request id
`gate:<id>`, so it is submitted once) whose answer is delivered where the request was made. The transcript stays
consistent: the call's one tool result is the "awaits approval" note; the outcome is a later entry.

A decision (`decide`, the single entry point for platform clicks and operators) is checked against the policy
stored with the request (user ids, user groups or roles; no self-approval unless allowed; withdrawal only by
the requester), must come from the gate's own message when it comes from a click, and is committed first-writer
wins before the platform is acknowledged.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from adapters.bridge.delivery import pacing_key
from adapters.bridge.docs import ApprovalDoc, PlaceOfDoc, ReplyDoc
from adapters.bridge.model import Place, RetryLater, TransportError
from adapters.bridge.transport import GateView, Transport
from harness_core import (
    Aborted,
    Checkpoint,
    Complete,
    Detach,
    Extension,
    Input,
    LiveDoc,
    Task,
    TaskRuntime,
    ToolCallInfo,
    ToolHookApi,
    ToolResult,
    Tx,
    Wait,
    define_task,
    detached_intent,
    hook,
    run_detached_tool,
)
from harness_core.messages import TextContent

if TYPE_CHECKING:
    from adapters.bridge.bridge import Bridge

log = logging.getLogger("adapters.bridge")

GATE_TASK = "bridge.gate"
Action = Literal["approve", "deny", "withdraw"]
STATUS_OF: dict[str, str] = {"approve": "approved", "deny": "denied", "withdraw": "withdrawn"}


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
    reason: str | None = None
    # unknown_gate | already_decided | expired | not_an_approver | self_approval | not_the_requester |
    # wrong_message
    decided_at: int | None = None  # ms, when the gate was decided (for "already approved by lead at 14:02")
    # The click reached a worker that does not own the gate: it was committed for the owner, who decides it
    # (acknowledge the platform; the card shows the outcome once the owner has decided).
    forwarded: bool = False


@dataclass(frozen=True)
class ClickOrigin:
    """The platform message a click was made on: a click counts only on the gate's own message."""

    channel: str
    message_id: str


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
        approvers=tuple(gate.get("approvers") or ()),
        groups=tuple(gate.get("groups") or ()),
    )


def _utc(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def call_text(tool: str, arguments: dict[str, Any]) -> str:
    """`deploy service=payments version=2.8.0`: what was asked for, as people and the model read it."""
    args = " ".join(
        f"{k}={v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items()
    )
    return f"{tool} {args}".strip()


def who_may_approve(gate: dict[str, Any]) -> str:
    names = [*(gate.get("approvers") or ()), *(f"group {g}" for g in gate.get("groups") or ())]
    return ", ".join(names) or "nobody"


def awaiting_text(gate_id: int, gate: dict[str, Any]) -> str:
    """The tool result the model gets for a detached call."""
    return (
        f"Not run yet: `{call_text(str(gate['tool']), dict(gate.get('arguments') or {}))}` awaits approval "
        f"(request #{gate_id}; may approve: {who_may_approve(gate)}; expires {_utc(int(gate['expires_at']))}). "
        "It runs only if approved; the decision and its result will arrive later as a separate message. "
        "Tell the requester it is waiting for approval; do not ask for it again."
    )


def outcome_text(gate_id: int, gate: dict[str, Any], result: ToolResult | None) -> str:
    """The input that reports a decided gate to the model (a turn of its own)."""
    call = call_text(str(gate["tool"]), dict(gate.get("arguments") or {}))
    status = gate.get("status")
    head = f"(approval #{gate_id}) `{call}`"
    if status == "approved":
        assert result is not None
        content = result.content
        if isinstance(content, str):
            text = content
        else:
            text = "\n".join(c.text for c in content or [] if isinstance(c, TextContent))
        verdict = "failed" if result.is_error else "ran"
        return (
            f"{head} was approved by {gate.get('decided_by')} and {verdict}. Result: {text or '(no output)'}"
        )
    if status == "expired":
        return f"{head} expired without a decision; it did not run."
    if status == "withdrawn":
        return f"{head} was withdrawn by {gate.get('decided_by')}; it did not run."
    return f"{head} was denied by {gate.get('decided_by')}; it did not run."


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
        self.task = define_task(
            GATE_TASK, phases={"wait": self._wait_phase, "execute": self._execute_phase}, abort=self._abort
        )

    def policy_for(self, tool: str) -> ApprovalPolicy | None:
        return next((p for p in self.policies if tool in p.tools), None)

    def extension(self) -> Extension:
        return Extension(
            "bridge-approvals", hooks=[hook("core.tool", before_tool=self.before_tool)], tasks=[self.task]
        )

    def pending_in(self, conversation_id: int) -> list[dict[str, Any]]:
        return [
            g
            for g in self.gates.values()
            if g.get("conversation_id") == conversation_id and g.get("status") == "pending"
        ]

    # --- the hook (runs inside the tool task, once per call; again after a crash) --------------------------

    async def before_tool(self, call: ToolCallInfo, api: ToolHookApi) -> Any:
        policy = self.policy_for(call.name)
        if policy is None:
            return None
        gate = await self._request(api, call, policy)
        return Detach(awaiting_text(api.task_id, gate), details={"gate": api.task_id})

    async def _request(self, api: ToolHookApi, call: ToolCallInfo, policy: ApprovalPolicy) -> dict[str, Any]:
        """Commit the request and its gate task once (a hook that runs again after a crash finds them)."""
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
        intent = detached_intent(call, task_id=api.task_id)

        async def commit(tx: Tx, task: Task) -> dict[str, Any]:
            doc = await tx.doc(ApprovalDoc, key=str(task.id), seed={})
            if not doc.value:
                doc.value.update(
                    {
                        "tool": call.name,
                        "arguments": call.arguments,
                        "intent": intent,
                        "conversation_id": conversation_id,
                        "target": target,
                        "requester": requester,
                        "approvers": list(policy.approvers),
                        "groups": list(policy.groups),
                        "allow_self_approval": policy.allow_self_approval,
                        "created_at": tx.now,
                        "expires_at": tx.now + policy.expires_after_ms,
                        "status": "pending",
                    }
                )
            if doc.value.get("task_id") is None:
                gate_task = await harness.create_task_in(
                    tx, GATE_TASK, {"gate": task.id}, conversation_id=conversation_id, background=True
                )
                doc.value["task_id"] = gate_task.id
                doc.value.setdefault("intent", intent)
            return dict(doc.value)

        gate: dict[str, Any] = await api.commit(commit)
        harness.resume()
        return gate

    # --- the gate task: wait for the decision, then run the call once (or not) and report ---------------------

    async def _wait_phase(self, task: Task, runtime: TaskRuntime) -> None:
        key = str(task.input["gate"])

        async def look(tx: Tx, _task: Task) -> Wait | Checkpoint | Complete:
            doc = await tx.doc(ApprovalDoc, key=key, seed={})
            gate = doc.value
            if gate.get("status") == "pending":
                if tx.now < int(gate.get("expires_at", 0)):
                    return Wait(checkpoint={"phase": "wait"}, deadline=int(gate["expires_at"]))
                gate["status"] = "expired"
                gate["decided_at"] = tx.now
            if gate.get("status") == "approved":
                # The intent is committed before the tool runs: a crash from here on lands in `execute`.
                gate["outcome"] = "running"
                return Checkpoint({"phase": "execute", "intent": gate["intent"]})
            return await self._report(tx, runtime, key, gate, None)

        after = await runtime.commit(look)
        if after.state.status == "running" and (after.state.checkpoint or {}).get("phase") == "execute":
            await self._run(task, runtime, recovering=False)

    async def _abort(self, task: Task, runtime: TaskRuntime) -> None:
        """The gate task was cancelled (`durable-bots cancel`, a reset of its conversation): a request still
        pending can never be decided any more, so its card must not keep working buttons. It is closed as
        withdrawn (not run); a call already approved and running keeps its recorded status."""
        key = str(task.input["gate"])

        async def close(tx: Tx, _task: Task) -> Aborted:
            doc = await tx.doc(ApprovalDoc, key=key, seed={})
            if doc.value.get("status") == "pending":
                doc.value["status"] = "withdrawn"
                doc.value["decided_by"] = "the bot (its task was cancelled)"
                doc.value["decided_at"] = tx.now
                doc.value["outcome"] = "not_run"
            return Aborted(reason=task.abort_reason)

        await runtime.commit(close)

    async def _execute_phase(self, task: Task, runtime: TaskRuntime) -> None:
        """Reached only by recovery: the process died while the approved call was running."""
        await self._run(task, runtime, recovering=True)

    async def _run(self, task: Task, runtime: TaskRuntime, *, recovering: bool) -> None:
        key = str(task.input["gate"])
        gate = await self.bridge.harness.snapshot(ApprovalDoc, key=key) or {}
        result = await run_detached_tool(runtime, dict(gate["intent"]), recovering=recovering)

        async def report(tx: Tx, _task: Task) -> Complete:
            doc = await tx.doc(ApprovalDoc, key=key, seed={})
            return await self._report(tx, runtime, key, doc.value, result)

        await runtime.commit(report)

    async def _report(
        self, tx: Tx, runtime: TaskRuntime, key: str, gate: dict[str, Any], result: ToolResult | None
    ) -> Complete:
        """In the gate task's last commit: the outcome as an input (answered where the request was made)."""
        harness = self.bridge.harness
        conversation_id = int(gate["conversation_id"])
        text = outcome_text(int(key), gate, result)
        if result is None:
            gate["outcome"] = "not_run"
        else:
            gate["outcome"] = "failed" if result.is_error else "ran"
        submission = await harness.submit_in(
            tx, conversation_id, Input(text, request_id=f"gate:{key}", when_busy="followUp")
        )
        if gate.get("target") is not None and await tx.snapshot(ReplyDoc, key=str(submission.id)) is None:
            await tx.create_doc(
                ReplyDoc,
                key=str(submission.id),
                seed={
                    "conversation_id": conversation_id,
                    "target": gate["target"],
                    "requester": gate.get("requester"),
                    "parts": [],
                },
            )
        return Complete({"submission_id": submission.id, "status": gate.get("status")})

    # --- decisions ---------------------------------------------------------------------------------------

    async def decide(
        self,
        gate_id: int,
        *,
        user_id: str,
        user_name: str,
        action: Action,
        user_groups: Collection[str] | None = None,
        origin: ClickOrigin | None = None,
        platform: str | None = None,
        operator: bool = False,
    ) -> Decision:
        """Record a decision. `action`: approve | deny (approvers) | withdraw (the requester). A click passes
        its `origin` (the message it was made on), which must be the gate's own message, and the `platform` it
        came from (approver entries like `slack:U0LEAD` match only there). Checked against the policy stored
        with the request; the first decision wins; committed before this returns (acknowledge the platform only
        after it).

        `operator=True`: an operator's override from the command line (`durable-bots approvals decide`): the
        approver policy is not checked, the decision is recorded with `operator_override: true`, and this
        call schedules nothing (a running bot's harness is already scheduling; a CLI process must not)."""
        harness = self.bridge.harness
        gate = await harness.snapshot(ApprovalDoc, key=str(gate_id))
        if gate is None:
            return Decision(False, "unknown", reason="unknown_gate")
        refused = await refusal(
            gate_id,
            gate,
            user_id=user_id,
            action=action,
            user_groups=user_groups,
            origin=origin,
            platform=platform,
            operator=operator,
            transports=self.bridge.transports,
        )
        if refused is not None:
            return refused

        async def commit(tx: Tx) -> Decision:
            doc = await tx.doc(ApprovalDoc, key=str(gate_id), seed={})
            if doc.value.get("status") != "pending":
                return _already(doc.value)
            task_id = doc.value.get("task_id")
            if tx.now >= int(doc.value.get("expires_at", tx.now + 1)):
                # Past its expiry the gate task may not have run yet (the bot was down, or it is about to
                # wake): the click is still too late. Mark it expired now; the task reports it.
                doc.value["status"] = "expired"
                doc.value["decided_at"] = tx.now
                await harness.wake_task(tx, int(task_id) if task_id is not None else gate_id)
                return Decision(False, "expired", reason="expired", decided_at=tx.now)
            doc.value["status"] = STATUS_OF[action]
            doc.value["decided_by"] = user_name
            doc.value["decided_by_id"] = user_id
            doc.value["decided_at"] = tx.now
            if operator:
                doc.value["operator_override"] = True
            # A gate asked by an earlier version has no gate task yet: its tool task still waits in the hook,
            # which creates the gate task when woken.
            await harness.wake_task(tx, int(task_id) if task_id is not None else gate_id)
            return Decision(True, str(doc.value["status"]), user_name, decided_at=tx.now)

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
            pacing_key(target), interval=transport.edit_interval, guard=self.bridge.write_guard
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


async def refusal(
    gate_id: int,
    gate: dict[str, Any],
    *,
    user_id: str,
    action: Action,
    user_groups: Collection[str] | None,
    origin: ClickOrigin | None,
    platform: str | None,
    operator: bool,
    transports: Mapping[str, Transport],
) -> Decision | None:
    """Why a decision on `gate` (as read now) is refused, or None when it may be committed. Read-only: the
    decision itself is still checked again in its commit (first writer wins); a router also runs this before
    forwarding a click to the gate's owner, so a refused click is answered at once by the worker it reached."""
    if origin is not None and not await on_own_message(gate_id, gate, origin, transports):
        return Decision(False, str(gate.get("status")), reason="wrong_message")
    if gate.get("status") != "pending":
        return _already(gate)
    requester = (gate.get("requester") or {}).get("user_id")
    if action == "withdraw":
        if requester is None or requester != user_id:
            return Decision(False, "pending", reason="not_the_requester")
    elif not operator:
        if not is_approver(gate, platform, user_id, user_groups, platforms=len(transports)):
            return Decision(False, "pending", reason="not_an_approver")
        if requester == user_id and not gate.get("allow_self_approval"):
            return Decision(False, "pending", reason="self_approval")
    return None


async def on_own_message(
    gate_id: int, gate: dict[str, Any], origin: ClickOrigin, transports: Mapping[str, Transport]
) -> bool:
    """Whether a click was made on the gate's own message (its channel and message id). A card that was
    posted but whose id is not recorded yet (a click right after the post, or after a crash between post
    and record) is looked up on the platform by its key, as the renderer's reconciliation does."""
    target = gate.get("target") or {}
    if str(target.get("channel")) != origin.channel:
        return False
    message_id = (gate.get("message") or {}).get("id")
    if message_id is None:
        transport = transports.get(str(target.get("platform")))
        if transport is None:
            return False
        try:
            message_id = await transport.find(Place.from_json(target), f"approval:{gate_id}")
        except TransportError as exc:
            log.warning("gate %s: could not look up its message for a click: %s", gate_id, exc)
            return False
    return message_id is not None and str(message_id) == origin.message_id


def _already(gate: dict[str, Any]) -> Decision:
    return Decision(
        False, str(gate.get("status")), gate.get("decided_by"), "already_decided", gate.get("decided_at")
    )
