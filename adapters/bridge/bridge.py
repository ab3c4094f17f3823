"""`Bridge`: the platform-neutral layer between chat platforms and the harness (DESIGN.md §5).

One bridge serves every adapter of a process over one harness: intake (exactly once), delivery (reconciled
before any re-post), streaming with a rate governor per platform, approval gates and scheduled inputs. Every
background worker it starts is owned here and cancelled and awaited in `stop()`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any

from adapters.bridge.approvals import Action, ApprovalPolicy, Approvals, ClickOrigin, Decision
from adapters.bridge.bounded import Bounded
from adapters.bridge.delivery import Delivery, load_active
from adapters.bridge.docs import ApprovalDoc, PlaceDoc, ReplyDoc, WatchDoc
from adapters.bridge.governor import RateGovernor
from adapters.bridge.intake import IntakeResult, intake, last_seen
from adapters.bridge.model import BridgeConfig, IncomingMessage, Place
from adapters.bridge.outside import valid_text
from adapters.bridge.schedule import ScheduledTask, schedule_tool
from adapters.bridge.stats import BridgeStats
from adapters.bridge.transport import Transport
from harness_core import AgentChange, Extension, Harness, Publication, Tx, log_context

log = logging.getLogger("adapters.bridge")

SHOWN_CAPACITY = 1024


class Bridge:
    def __init__(
        self,
        harness: Harness,
        *,
        config: BridgeConfig | None = None,
        agent: AgentChange | None = None,
        approvals: Sequence[ApprovalPolicy] = (),
        write_guard: Callable[[], None] | None = None,
    ) -> None:
        """`write_guard` runs right before every platform write (posts, edits, approval cards) and may raise
        to refuse it: the runtime passes the storage's owner check, so a process that lost its PostgreSQL
        lease (paused past its ttl, cut off) never writes to the platform again."""
        self.harness = harness
        self.write_guard = write_guard
        self.config = config or BridgeConfig()
        self.agent = agent  # the agent of conversations the bridge creates for new channels
        self.transports: dict[str, Transport] = {}
        # Message id -> text this process last showed there, so an unchanged partial is not edited again. Kept
        # for messages still being edited (dropped when their reply is final) and at most SHOWN_CAPACITY of
        # them: a message that fell out gets one edit with the text it already shows, nothing worse.
        self.shown: Bounded[str, str] = Bounded(SHOWN_CAPACITY)
        self.delivery = Delivery(self)
        self.approvals = Approvals(self, approvals)
        self._governors: dict[str, RateGovernor] = {}
        # Set by a Router: the governors shared by every partition bridge of the process (one budget per
        # platform and channel, whichever partition writes); each write still checks this bridge's guard.
        self._shared_governor: Callable[[str], RateGovernor] | None = None
        self._dispose: Any = None
        self.started = False
        self.stats = BridgeStats()

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

    def governors(self) -> dict[str, RateGovernor]:
        """The rate governor of every platform written to so far (metrics read their counters)."""
        return dict(self._governors)

    def share_governors(self, source: Callable[[str], RateGovernor]) -> None:
        """Take every platform's governor from `source` (a Router's) instead of keeping its own."""
        self._shared_governor = source

    def governor(self, platform: str) -> RateGovernor:
        if self._shared_governor is not None:
            return self._shared_governor(platform)
        governor = self._governors.get(platform)
        if governor is None:
            governor = self._governors[platform] = RateGovernor(guard=self.write_guard)
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

    async def intake(self, message: IncomingMessage, *, ingress_record: int | None = None) -> IntakeResult:
        """Commit a human message (exactly once per message identity). Acknowledge the platform after this.
        `ingress_record`: the ingress record it came from, finished by the same commit (storage permitting:
        `finishes_in_commit`)."""
        with log_context(place=message.place.key, platform_message=message.message_id):
            result = await intake(self, message, ingress_record)
            counter = self.stats.duplicates if result.outcome == "duplicate" else self.stats.taken_in
            counter[message.place.platform] += 1
            with log_context(conversation=result.conversation_id, submission=result.submission_id):
                log.info("message %s taken in: %s", message.message_id, result.outcome)
        return result

    @property
    def finishes_in_commit(self) -> bool:
        """Whether this bridge's storage finishes an ingress record in the commit that takes it in."""
        return self.harness.session.finishes_ingress

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
        """The one entry point for deciding a gate: `action` is approve | deny | withdraw; a platform click
        passes the message it was made on as `origin` (it must be the gate's own message) and its `platform`
        (the adapter's platform name; approver entries like `slack:U0LEAD` match only there); an operator
        passes `operator=True` and no origin. The decision is committed when this returns: acknowledge the
        platform only then."""
        decision = await self.approvals.decide(
            gate_id,
            user_id=valid_text(user_id),
            user_name=valid_text(user_name),
            action=action,
            user_groups=None if user_groups is None else [valid_text(g) for g in user_groups],
            origin=origin,
            platform=platform,
            operator=operator,
        )
        if decision.accepted:
            self.stats.approvals_decided[decision.status] += 1
        return decision

    async def recorded_message_ids(self) -> set[str]:
        """Platform message ids already recorded for answers still being delivered (reconciliation: a message
        found without a key is not someone else's)."""
        recorded: set[str] = set()
        for reply in (await self.harness.family(ReplyDoc)).values():
            for part in reply.get("parts") or []:
                if part.get("message_id"):
                    recorded.add(str(part["message_id"]))
        return recorded

    async def place_doc(self, place: Place) -> dict[str, Any] | None:
        """What the bridge records about `place` (its conversation, last message seen), None if unseen."""
        doc: dict[str, Any] | None = await self.harness.snapshot(PlaceDoc, key=place.key)
        return doc

    async def gate_doc(self, gate_id: int) -> dict[str, Any] | None:
        """The approval request `gate_id` as recorded (tool, approvers, status), None if unknown."""
        doc: dict[str, Any] | None = await self.harness.snapshot(ApprovalDoc, key=str(gate_id))
        return doc

    async def known_places(self, platform: str) -> list[Place]:
        places = await self.harness.family(PlaceDoc)
        return [
            Place.from_json(v["place"])
            for v in places.values()
            if v.get("place", {}).get("platform") == platform
        ]

    async def watching_since(self, platform: str, workspace: str) -> int:
        """When (Unix ms) this bot first watched `workspace` of `platform`; recorded on the first call."""

        async def commit(tx: Tx) -> int:
            doc = await tx.doc(WatchDoc, key=f"{platform}:{workspace}", seed={"since_ms": tx.now})
            return int(doc.value.get("since_ms", tx.now))

        since: int = await self.harness.commit(commit)
        return since

    async def catch_up(
        self, transport: Transport, places: Sequence[Place] | None = None, *, first_after: str | None = None
    ) -> int:
        """Feed messages posted while the bot was down through the same exactly-once intake. A place the
        bridge has seen is read from its newest message seen; one it has never seen (a channel the bot is in
        but nobody talked to it there yet) from `first_after`, the adapter's look-back bound (None: the
        transport decides, e.g. nothing)."""
        count = 0
        for place in places if places is not None else await self.known_places(transport.platform):
            try:
                after = await last_seen(self, place)
                messages = await transport.history(place, first_after if after is None else after)
            except Exception as exc:  # one unreadable channel must not stop the others
                log.warning("catch-up of %s failed: %s", place.key, exc)
                continue
            for message in messages:
                if (await self.intake(message)).outcome not in ("duplicate", "conflict", "refused"):
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
        for task in publication.tasks:
            # A parked task a reply shows as on hold was retried (or ended): its replies show what happens now.
            if task.id in self.delivery.on_hold and (not task.parked or not task.live):
                self.delivery.kick_conversation(self.delivery.on_hold.pop(task.id))
