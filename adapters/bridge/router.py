"""`Router`: the bridge adapters talk to in a worker that owns only some partitions of a shared store
(DESIGN.md §9, issue 16).

Each owned partition has its own `Bridge` (over its own harness and lease). The router sends every adapter call
to the partition that owns it: a message by its channel's place key (`partition_of_place`; threads follow their
channel), a click by its gate id (`gate_id % partitions`).

A message is committed as an ingress record (kind `message`, keyed by the message's identity) for its
partition's owner, whichever worker that is, and the adapter acknowledges the platform once that commit
returned: nothing acknowledged is lost, and a message delivered twice (to two workers, or as Slack's `message`
and `app_mention`) is one record. Every message of a channel takes the same path whichever worker the platform
handed it to, so a channel's messages are taken in in the order they were committed (a direct intake at the
owner would overtake one still on its way from another worker); two committed at the same moment by two workers
may be taken in either way round, as the platform may have sent them. `direct_intake=True` takes a message for a
partition owned here straight in instead (one commit less; order across workers then only as good as the
paths' latencies). A click for a gate owned here is decided directly (the clicker is answered at once); any
other is committed as a `click` record for the gate's owner.

For every owned partition the router runs one consumer task: it takes the partition's unfinished ingress
records in id order as one batch (so a channel's messages keep their order), feeds them through that
partition's bridge and finishes the batch in one statement once the bridge committed them. A run of messages in
a batch is handed to the bridge all at once: the harness's commit line keeps the order they were handed in and
groups them into shared transactions (one per group, not one per message). A consumer is woken by
`Ingress.on_ingress` and by the router's one poller, which every `poll_interval` seconds asks the store for the
pending records of every owned partition in one query (not one per partition) and wakes the partitions that have
some, so a lost notification only delays. A record that cannot be read (a poison record) is logged with its id
and finished as refused; the consumer goes on with the next. A record whose intake raised (the harness failed)
stays unfinished and is taken in again later (its duplicate check makes that harmless).

Every task the router starts (consumers, per-partition catch-ups, the poller) is owned here:
`remove_partition` cancels and awaits that partition's tasks before handing its bridge back (its unfinished
records stay for the next owner), `stop` does so for all and the poller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Sequence
from typing import Any

from adapters.bridge.approvals import STATUS_OF, Action, ClickOrigin, Decision, refusal
from adapters.bridge.bridge import Bridge
from adapters.bridge.docs import WatchDoc
from adapters.bridge.governor import RateGovernor
from adapters.bridge.ingress import (
    CLICK,
    MESSAGE,
    Click,
    Ingress,
    IngressPayloadError,
    IngressRecordLike,
    click_from_payload,
    click_payload,
    message_from_payload,
    message_payload,
)
from adapters.bridge.intake import IntakeResult
from adapters.bridge.model import IncomingMessage, Place
from adapters.bridge.outside import valid_text
from adapters.bridge.partitions import partition_of_gate, partition_of_key, partition_of_place
from adapters.bridge.transport import Transport

log = logging.getLogger("adapters.bridge.router")

POLL_INTERVAL = 1.0
BATCH = 100


class Router:
    def __init__(
        self,
        ingress: Ingress,
        partitions: int,
        *,
        poll_interval: float = POLL_INTERVAL,
        batch: int = BATCH,
        direct_intake: bool = False,
        consume: bool = True,
    ) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be at least 1, got {partitions}")
        self.ingress = ingress
        self.partitions = partitions
        self.poll_interval = poll_interval
        self.batch = batch
        self.direct_intake = direct_intake
        self.transports: dict[str, Transport] = {}
        self._bridges: dict[int, Bridge] = {}
        self._tasks: dict[int, list[asyncio.Task[None]]] = {}
        self._wake: dict[int, asyncio.Event] = {}
        self._governors: dict[str, RateGovernor] = {}
        # The latest catch-up an adapter asked for, per platform: a partition gained later catches up its part
        # of it (places the bridge has never seen, back to the adapter's look-back bound).
        self._catch_up_requests: dict[str, tuple[list[Place], str | None]] = {}
        # A router that will never own a partition (a worker's separate intake process) does not listen.
        self._unsubscribe = ingress.on_ingress(self._notified) if consume else _nothing
        self._poller: asyncio.Task[None] | None = None
        # Counters (metrics, tests): ingress records committed here, records taken in, records refused.
        self.forwarded = 0
        self.consumed = 0
        self.refused = 0

    # --- partitions ------------------------------------------------------------------------------------------

    def owned(self) -> frozenset[int]:
        return frozenset(self._bridges)

    def bridge_of(self, partition: int) -> Bridge | None:
        return self._bridges.get(partition)

    def partition_of(self, place: Place) -> int:
        return partition_of_place(place, self.partitions)

    async def add_partition(self, partition: int, bridge: Bridge) -> None:
        """Serve `partition` through `bridge` (started or not): attach every transport, share the governors,
        start its ingress consumer and catch up its places through the transports attached."""
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition {partition} is outside 0..{self.partitions - 1}")
        if partition in self._bridges:
            raise ValueError(f"partition {partition} is already served here")
        bridge.share_governors(self.governor)
        for transport in self.transports.values():
            bridge.attach(transport)
        self._bridges[partition] = bridge
        self._wake[partition] = wake = asyncio.Event()
        wake.set()  # records left by a previous owner are taken at once
        loop = asyncio.get_running_loop()
        if self._poller is None:
            self._poller = loop.create_task(self._poll(), name="ingress-poll")
        self._tasks[partition] = [
            loop.create_task(self._consume(partition, bridge), name=f"ingress-{partition}"),
            loop.create_task(self._catch_up_partition(partition, bridge), name=f"catch-up-{partition}"),
        ]

    async def remove_partition(self, partition: int) -> Bridge:
        """Stop serving `partition`: its consumer and catch-up are cancelled and awaited (records not finished
        stay for the next owner). Returns its bridge, for the caller to stop."""
        bridge = self._bridges.pop(partition)
        self._wake.pop(partition, None)
        tasks = self._tasks.pop(partition, [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return bridge

    async def stop(self) -> dict[int, Bridge]:
        """Stop every consumer and listening; returns the bridges that were served (the caller stops them)."""
        self._unsubscribe()
        self._unsubscribe = _nothing
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
        bridges: dict[int, Bridge] = {}
        for partition in list(self._bridges):
            bridges[partition] = await self.remove_partition(partition)
        return bridges

    # --- the adapter-facing surface (BridgeLike) ---------------------------------------------------------------

    def attach(self, transport: Transport) -> None:
        self.transports[transport.platform] = transport
        for bridge in self._bridges.values():
            bridge.attach(transport)

    def governor(self, platform: str) -> RateGovernor:
        """One governor per platform for every partition bridge of this worker: the per-channel spacing and a
        platform's Retry-After hold whichever partition writes (each write checks its own partition's lease)."""
        governor = self._governors.get(platform)
        if governor is None:
            governor = self._governors[platform] = RateGovernor()
        return governor

    def governors(self) -> dict[str, RateGovernor]:
        return dict(self._governors)

    async def intake(self, message: IncomingMessage) -> IntakeResult:
        partition = self.partition_of(message.place)
        bridge = self._bridges.get(partition)
        if bridge is not None and self.direct_intake:
            try:
                return await bridge.intake(message)
            except Exception:
                if self._bridges.get(partition) is bridge:
                    raise
                # Handed over while taking it in: its new owner takes it from ingress instead.
        new = await self.ingress.put_ingress(partition, MESSAGE, message.request_id, message_payload(message))
        self.forwarded += 1
        self._notified(partition)  # owned here: no need to wait for the store's notification
        log.debug(
            "message %s committed for partition %d%s",
            message.request_id,
            partition,
            "" if new else " (already there)",
        )
        return IntakeResult(None, None, "forwarded")

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
        partition = partition_of_gate(gate_id, self.partitions)
        bridge = self._bridges.get(partition)
        if bridge is not None:
            return await bridge.decide(
                gate_id,
                user_id=user_id,
                user_name=user_name,
                action=action,
                user_groups=user_groups,
                origin=origin,
                platform=platform,
                operator=operator,
            )
        click = Click(
            gate_id,
            valid_text(user_id),
            valid_text(user_name),
            action,
            None if user_groups is None else tuple(valid_text(g) for g in user_groups),
            origin,
            platform,
            operator,
        )
        # A click the owner would refuse as the gate reads now is answered here, at once (the clicker learns
        # why); the owner checks again in its commit, first writer wins.
        gate = await self.gate_doc(gate_id)
        if gate is not None:
            refused = await refusal(
                gate_id,
                gate,
                user_id=click.user_id,
                action=action,
                user_groups=click.user_groups,
                origin=origin,
                platform=platform,
                operator=operator,
                transports=self.transports,
            )
            if refused is not None:
                return refused
        new = await self.ingress.put_ingress(partition, CLICK, click.key, click_payload(click))
        self.forwarded += 1
        log.info(
            "click %s on gate %d forwarded to partition %d%s",
            action,
            gate_id,
            partition,
            "" if new else " (already forwarded)",
        )
        return Decision(True, STATUS_OF[action], click.user_name, forwarded=True)

    async def recorded_message_ids(self) -> set[str]:
        recorded: set[str] = set()
        for bridge in list(self._bridges.values()):
            recorded |= await bridge.recorded_message_ids()
        return recorded

    async def known_places(self, platform: str) -> list[Place]:
        places: list[Place] = []
        for bridge in list(self._bridges.values()):
            places += await bridge.known_places(platform)
        return places

    async def watching_since(self, platform: str, workspace: str) -> int:
        """Recorded by the partition of `platform:workspace` when owned here; otherwise read (cross-partition
        reads are plain reads); not recorded yet and not owned here: now (nothing older is taken for new)."""
        key = f"{platform}:{workspace}"
        bridge = self._bridges.get(partition_of_key(key, self.partitions))
        if bridge is not None:
            return await bridge.watching_since(platform, workspace)
        reader = self._reader()
        doc = None if reader is None else await reader.harness.snapshot(WatchDoc, key=key)
        if doc is not None and doc.get("since_ms") is not None:
            return int(doc["since_ms"])
        return int(time.time() * 1000)

    async def catch_up(
        self, transport: Transport, places: Sequence[Place] | None = None, *, first_after: str | None = None
    ) -> int:
        """Catch up the places owned here; the rest is caught up by their owners. The request is remembered,
        so a partition gained later catches up its share of it too."""
        if places is not None:
            self._catch_up_requests[transport.platform] = (list(places), first_after)
        count = 0
        for partition, bridge in list(self._bridges.items()):
            mine = None if places is None else [p for p in places if self.partition_of(p) == partition]
            if mine == []:
                continue
            count += await bridge.catch_up(transport, mine, first_after=first_after)
        return count

    async def place_doc(self, place: Place) -> dict[str, Any] | None:
        bridge = self._bridges.get(self.partition_of(place)) or self._reader()
        return None if bridge is None else await bridge.place_doc(place)

    async def gate_doc(self, gate_id: int) -> dict[str, Any] | None:
        bridge = self._bridges.get(partition_of_gate(gate_id, self.partitions)) or self._reader()
        return None if bridge is None else await bridge.gate_doc(gate_id)

    def _reader(self) -> Bridge | None:
        """Any partition's bridge, for a read of another partition (reads by id see the whole store)."""
        return next(iter(self._bridges.values()), None)

    # --- ingress consumer ------------------------------------------------------------------------------------

    def _notified(self, partition: int) -> None:
        wake = self._wake.get(partition)
        if wake is not None:
            wake.set()

    async def _poll(self) -> None:
        """The fallback for lost notifications: one query for every owned partition, then wake those with
        records. (The query's limit can hide a partition behind another's backlog: that only delays it to a
        later poll, once the backlog is being taken.)"""
        while True:
            await asyncio.sleep(self.poll_interval)
            owned = list(self._wake)
            if not owned:
                continue
            try:
                records = await self.ingress.pending_ingress(owned, self.batch)
            except Exception as exc:  # the store is down: the consumers' own retries report it
                log.debug("polling ingress failed: %s", exc)
                continue
            for partition in {record.partition for record in records}:
                self._notified(partition)

    async def _consume(self, partition: int, bridge: Bridge) -> None:
        wake = self._wake[partition]
        while True:
            await wake.wait()
            wake.clear()  # before reading: a notification from now on runs the loop again
            try:
                records = await self.ingress.pending_ingress([partition], self.batch)
                if records:
                    await self._take_batch(partition, bridge, records)
            except Exception as exc:  # the store or the bridge failed: the records stay; try again
                log.warning("partition %d: taking in ingress failed, will retry: %s", partition, exc)
                await asyncio.sleep(self.poll_interval)
                wake.set()
                continue
            if len(records) >= self.batch:
                wake.set()  # more waiting

    async def _take_batch(self, partition: int, bridge: Bridge, records: Sequence[IngressRecordLike]) -> None:
        """Take `records` in, in order, and finish those taken (or refused): a message's record in the commit
        that takes it in where the storage can, the rest in one statement. Messages are
        handed to the bridge as a run (their commits queue in this order and share transactions); a click is
        decided on its own, after the messages before it."""
        done: list[int] = []  # finished below, in one statement
        dropped: list[int] = []  # refused clicks: deleted below, so their clickers may click again
        run: list[tuple[int, IncomingMessage]] = []
        failure: BaseException | None = None
        # Where the storage can, a message's record is finished by the commit that takes it in (one write
        # less per message, and no moment where one is stored and the other not); clicks as before.
        in_commit = bridge.finishes_in_commit

        async def take_run() -> None:
            nonlocal failure
            # gather starts the intakes in list order, and each queues its commit before its first pause.
            results = await asyncio.gather(
                *(bridge.intake(m, ingress_record=r if in_commit else None) for r, m in run),
                return_exceptions=True,
            )
            for (record_id, _), result in zip(run, results, strict=True):
                if isinstance(result, BaseException):
                    failure = failure or result
                    continue
                log.debug("ingress record %d: %s", record_id, result.outcome)
                if not in_commit or result.outcome == "refused":
                    # A refused message's commit was rolled back, its finish with it: finished here instead,
                    # or it would be taken in (and refused) again forever, and 100 of them stop the partition.
                    done.append(record_id)
                self.consumed += 1
            run.clear()

        try:
            for record in records:
                try:
                    item = self._read(partition, record)
                except Exception as exc:  # a poison record must not stop the ones behind it
                    self.refused += 1
                    log.error(
                        "ingress record %d (%s %s) cannot be taken in and is refused: %s",
                        record.id,
                        record.kind,
                        record.key,
                        exc,
                    )
                    done.append(record.id)
                    continue
                if isinstance(item, IncomingMessage):
                    run.append((record.id, item))
                    continue
                if run:
                    await take_run()
                if failure is not None:
                    break
                (done if await self._decide(bridge, item) else dropped).append(record.id)
                self.consumed += 1
            if run and failure is None:
                await take_run()
        finally:
            if done:
                await self.ingress.finish_ingresses(done)
            if dropped:
                await self.ingress.drop_ingresses(dropped)
        if failure is not None:
            raise failure

    async def _decide(self, bridge: Bridge, item: Click) -> bool:
        """Decide a forwarded click here, at its gate's owner; whether it was accepted."""
        decision = await bridge.decide(
            item.gate_id,
            user_id=item.user_id,
            user_name=item.user_name,
            action=item.action,
            user_groups=item.user_groups,
            origin=item.origin,
            platform=item.platform,
            operator=item.operator,
        )
        log.info(
            "forwarded click %s by %s on gate %d: %s",
            item.action,
            item.user_id,
            item.gate_id,
            "accepted" if decision.accepted else decision.reason,
        )
        return decision.accepted

    def _read(self, partition: int, record: IngressRecordLike) -> IncomingMessage | Click:
        if record.kind == MESSAGE:
            message = message_from_payload(record.payload)
            if self.partition_of(message.place) != partition:
                raise IngressPayloadError(f"{message.place.key} does not belong to partition {partition}")
            return message
        if record.kind == CLICK:
            click = click_from_payload(record.payload)
            if partition_of_gate(click.gate_id, self.partitions) != partition:
                raise IngressPayloadError(f"gate {click.gate_id} does not belong to partition {partition}")
            return click
        raise IngressPayloadError(f"unknown ingress kind {record.kind!r}")

    # --- catch-up of a partition gained later ---------------------------------------------------------------

    async def _catch_up_partition(self, partition: int, bridge: Bridge) -> None:
        for platform, transport in list(self.transports.items()):
            request = self._catch_up_requests.get(platform)
            if request is None:
                continue  # the adapter has not caught up yet: its own catch-up covers this partition
            asked, first_after = request
            try:
                places = await bridge.known_places(platform)
                seen = set(places)
                places += [p for p in asked if p not in seen and self.partition_of(p) == partition]
                count = await bridge.catch_up(transport, places, first_after=first_after)
            except Exception as exc:
                log.warning("partition %d: catch-up on %s failed: %s", partition, platform, exc)
                continue
            log.info("partition %d: caught up %d %s message(s)", partition, count, platform)


def _nothing() -> None:
    """An unsubscribe already done."""
