"""`Bridge`: the platform-neutral layer between chat platforms and the harness (DESIGN.md §5).

One bridge serves every adapter of a process over one harness: intake (exactly once), delivery (reconciled
before any re-post), streaming with a rate governor per platform, approval gates and scheduled inputs. Every
background worker it starts is owned here and cancelled and awaited in `stop()`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

from adapters.bridge.approvals import Action, ApprovalPolicy, Approvals, ClickOrigin, Decision
from adapters.bridge.delivery import Delivery, load_active
from adapters.bridge.docs import ApprovalDoc, PlaceDoc, ReplyDoc
from adapters.bridge.governor import RateGovernor
from adapters.bridge.intake import IntakeResult, intake, last_seen
from adapters.bridge.model import BridgeConfig, IncomingMessage, Place
from adapters.bridge.schedule import ScheduledTask, schedule_tool
from adapters.bridge.transport import Transport
from harness_core import AgentChange, Extension, Harness, Publication

log = logging.getLogger("adapters.bridge")


class Bridge:
    def __init__(
        self,
        harness: Harness,
        *,
        config: BridgeConfig | None = None,
        agent: AgentChange | None = None,
        approvals: Sequence[ApprovalPolicy] = (),
    ) -> None:
        self.harness = harness
        self.config = config or BridgeConfig()
        self.agent = agent  # the agent of conversations the bridge creates for new channels
        self.transports: dict[str, Transport] = {}
        self.shown: dict[str, str] = {}  # message id -> text this process last showed there
        self.delivery = Delivery(self)
        self.approvals = Approvals(self, approvals)
        self._governors: dict[str, RateGovernor] = {}
        self._dispose: Any = None
        self.started = False

    def extension(self) -> Extension:
        """Install this in the harness registry: approval gates (hook and gate task), the `schedule` tool and
        its timer task."""
        gate = self.approvals.extension()
        return Extension(
            "bridge", tools=[schedule_tool(self)], hooks=list(gate.hooks), tasks=[ScheduledTask, *gate.tasks]
        )

    def attach(self, transport: Transport) -> None:
        self.transports[transport.platform] = transport
        if self.started:
            # Attached after start(): workers that found no transport for this platform gave up; pick their
            # replies and approval messages up again (each worker skips what another platform delivers).
            for key in list(self.delivery.active):
                self.delivery.kick(key)
            for key, value in list(self.approvals.gates.items()):
                self.approvals.track(key, value)

    def governor(self, platform: str) -> RateGovernor:
        governor = self._governors.get(platform)
        if governor is None:
            governor = self._governors[platform] = RateGovernor()
        return governor

    async def start(self) -> None:
        """Subscribe to commits, then pick up every reply and approval a previous process left unfinished."""
        if self.started:
            return
        self.started = True
        self._dispose = self.harness.add_publication_listener(self._on_publication)
        for key in await load_active(self):
            self.delivery.kick(key)

    async def stop(self) -> None:
        if self._dispose is not None:
            self._dispose()
            self._dispose = None
        await self.delivery.stop()
        await self.approvals.stop()

    async def intake(self, message: IncomingMessage) -> IntakeResult:
        """Commit a human message (exactly once per message identity). Acknowledge the platform after this."""
        return await intake(self, message)

    async def decide(
        self,
        gate_id: int,
        *,
        user_id: str,
        user_name: str,
        action: Action,
        user_groups: Collection[str] | None = None,
        origin: ClickOrigin | None = None,
    ) -> Decision:
        """The one entry point for deciding a gate: `action` is approve | deny | withdraw; a platform click
        passes the message it was made on as `origin` (it must be the gate's own message); an operator passes
        none. The decision is committed when this returns: acknowledge the platform only then."""
        return await self.approvals.decide(
            gate_id,
            user_id=user_id,
            user_name=user_name,
            action=action,
            user_groups=user_groups,
            origin=origin,
        )

    async def recorded_message_ids(self) -> set[str]:
        """Platform message ids already recorded for answers still being delivered (reconciliation: a message
        found without a key is not someone else's)."""
        recorded: set[str] = set()
        for reply in (await self.harness.family(ReplyDoc)).values():
            for part in reply.get("parts") or []:
                if part.get("message_id"):
                    recorded.add(str(part["message_id"]))
        return recorded

    async def known_places(self, platform: str) -> list[Place]:
        places = await self.harness.family(PlaceDoc)
        return [
            Place.from_json(v["place"])
            for v in places.values()
            if v.get("place", {}).get("platform") == platform
        ]

    async def catch_up(self, transport: Transport, places: Sequence[Place] | None = None) -> int:
        """Feed messages posted while the bot was down through the same exactly-once intake."""
        count = 0
        for place in places if places is not None else await self.known_places(transport.platform):
            try:
                messages = await transport.history(place, await last_seen(self, place))
            except Exception as exc:  # one unreadable channel must not stop the others
                log.warning("catch-up of %s failed: %s", place.key, exc)
                continue
            for message in messages:
                if (await self.intake(message)).outcome != "duplicate":
                    count += 1
        return count

    def _on_publication(self, publication: Publication) -> None:
        for doc in publication.docs:
            kind = doc.record.kind
            key = doc.record.key
            if kind == ReplyDoc.kind and key is not None:
                if doc.retired:
                    self.delivery.untrack(key)
                else:
                    conversation_id = (doc.value or {}).get("conversation_id")
                    self.delivery.track(key, int(conversation_id) if conversation_id is not None else None)
                    if doc.created:
                        self.delivery.kick(key)
            elif kind == ApprovalDoc.kind and key is not None and not doc.retired and doc.value is not None:
                self.approvals.track(key, doc.value)
                conversation_id = doc.value.get("conversation_id")
                if conversation_id is not None:
                    self.delivery.kick_conversation(int(conversation_id))
            elif kind == "core.live" and doc.record.scope_id is not None:
                # Only the reply of the run's first input shows progress; queued ones are kicked when their
                # submission settles or their run starts (then they are first).
                inputs = ((doc.value or {}).get("run") or {}).get("inputs") or []
                if inputs:
                    self.delivery.kick(str(inputs[0]))
        for submission in publication.submissions:
            if submission.status in ("done", "unanswered"):
                self.delivery.kick(str(submission.id))
