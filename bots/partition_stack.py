"""What a worker runs for each partition it owns (bots.workers): the partition's `PostgresStorage` handle,
a `Harness` over it and a `Bridge` over that, registered with the router; and the operator desks that carry
out requests queued for those partitions.

Opening is the single-store start (recovery as usual); closing is the single-store stop (bridge, then harness,
whose handle writes its meta and releases the lease), except after a lost lease, when nothing more is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from adapters.bridge import ApprovalPolicy, Bridge, BridgeConfig, Router
from bots.background import OwnedLoop
from bots.config import BotConfig
from bots.metrics import BotMetrics
from bots.operator_requests import OperatorDesk
from bots.ops import OpsContext, history_extension, ops_extension
from bots.runtime import approval_policies, bridge_config, load_plugin, sync_conversations
from harness_core import AgentChange, Harness, HarnessSettings, Models, Registry, WatchdogSettings
from harness_core.storage import PostgresStorage, PostgresStore

log = logging.getLogger("bots.workers")

DESK_POLL = 0.5  # seconds between two looks for operator requests in the owned partitions (one query for all)
MIN_CACHE_BYTES = 128 * 1024
MIN_CACHE_CONVERSATIONS = 8
STEP_TIMEOUT = 15.0
QUIET_WATCHDOG = WatchdogSettings(enabled=False, interval_ms=60_000)


def cache_share(settings: HarnessSettings, partitions: int) -> HarnessSettings:
    """A partition harness's share of the context cache: the budget divided by the partition count (a worker
    owning all of them holds about one budget), never below a useful floor."""
    return dataclasses.replace(
        settings,
        context_cache_bytes=max(settings.context_cache_bytes // partitions, MIN_CACHE_BYTES),
        context_cache_conversations=max(
            settings.context_cache_conversations // partitions, MIN_CACHE_CONVERSATIONS
        ),
    )


@dataclass
class Partition:
    """What runs for one owned partition."""

    number: int
    storage: PostgresStorage
    harness: Harness
    bridge: Bridge
    desk: OperatorDesk
    gone: asyncio.Future[str]  # the lease was lost or the harness closed: this partition must stop
    unsubscribe: Callable[[], None]
    ops: OpsContext  # what its tools read: the store-wide reader, so history searches see every partition


class PartitionHost:
    """Opens and closes the stack of each partition the balancer gives this worker (`gain` / `lose`)."""

    def __init__(
        self,
        config: BotConfig,
        env: Mapping[str, str],
        *,
        router: Router,
        models: Models,
        metrics: BotMetrics,
        agent: AgentChange,
        say: Callable[[str], None],
    ) -> None:
        self.config = config
        self.say = say
        self.env = env
        self.router = router
        self.models = models
        self.metrics = metrics
        self.agent = agent
        self.settings = cache_share(config.harness_settings(), router.partitions)
        # What SIGHUP may change (bots.reload): every partition's bridge, now and opened later.
        self.bridge_settings = bridge_config(config)
        self.policies = approval_policies(config)
        self.parts: dict[int, Partition] = {}
        self._gone: dict[int, asyncio.Future[str]] = {}
        self._watchdog: int | None = None  # the partition whose harness runs the event-loop lag watchdog

    def gone_of(self, handle: Any) -> asyncio.Future[str]:
        """The future that resolves when the partition `handle` is bound to must stop (for the balancer)."""
        return self._gone[int(handle.partition)]

    def running(self) -> list[tuple[Harness, Bridge]]:
        return [(p.harness, p.bridge) for p in self.parts.values()]

    async def gain(self, number: int, handle: Any) -> None:
        assert isinstance(handle, PostgresStorage)
        gone: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._gone[number] = gone
        try:
            part = await self._open(number, handle, gone)
        except BaseException:
            self._gone.pop(number, None)
            with contextlib.suppress(Exception):
                await handle.close()  # releases the lease: this or another worker tries again
            raise
        self.parts[number] = part

    def _bridge(self, harness: Harness, guard: Callable[[], None]) -> Bridge:
        return Bridge(
            harness,
            config=self.bridge_settings,
            agent=self.agent,
            approvals=list(self.policies),
            write_guard=guard,
        )

    async def apply_reload(
        self, settings: BridgeConfig, policies: list[ApprovalPolicy], agent: AgentChange
    ) -> int:
        """A reloaded config (SIGHUP, `bots.reload`): every partition's bridge takes it, every channel and
        thread conversation gets the agent; returns how many conversations changed."""
        self.bridge_settings, self.policies, self.agent = settings, policies, agent
        updated = 0
        for part in list(self.parts.values()):
            part.bridge.config = settings
            part.bridge.approvals.policies = list(policies)
            part.bridge.agent = agent
            if not part.harness.closed.done():
                updated += await sync_conversations(part.harness, agent)
        return updated

    async def _open(self, number: int, handle: PostgresStorage, gone: asyncio.Future[str]) -> Partition:
        registry = Registry()
        # One event-loop lag watchdog per process is enough (it watches the loop, not the partition): the
        # first partition's harness runs it; the others get one that never reports and wakes once a minute.
        watching = self._watchdog is None or self._watchdog not in self.parts
        settings = self.settings if watching else dataclasses.replace(self.settings, watchdog=QUIET_WATCHDOG)
        harness = await Harness.open(
            self.metrics.storage(handle),
            models=self.models,
            registry=registry,
            settings=settings,
            on_report=_report,
        )
        bridge: Bridge | None = None
        unsubscribe: Callable[[], None] | None = None
        try:
            # The same tools in every partition: a conversation's tools do not depend on who runs it.
            bridge = self._bridge(harness, handle.check_owner)
            # Tools read other partitions (search_history over every channel) through the store-wide reader.
            ctx = OpsContext(config=self.config, env=self.env, storage=handle.store.reader())
            registry.install(ops_extension(ctx))
            registry.install(history_extension(ctx))
            registry.install(bridge.extension())
            for module_name in self.config.tools.modules:
                registry.install(load_plugin(module_name, ctx))
            await bridge.start()
            await sync_conversations(harness, self.agent)
            harness.resume()
            if watching:
                self._watchdog = number
            unsubscribe = harness.add_publication_listener(self.metrics.on_publication)
            parked = (await harness.inspect()).parked()
            if parked:
                ids = ", ".join(str(t.record.id) for t in parked)
                self.say(f"durable-bots: {len(parked)} parked task(s) ({ids}): see `durable-bots inspect`")
            # Last: once the router feeds it, the partition is open (a failure before leaves no trace there,
            # so the balancer's next try can open it again).
            await self.router.add_partition(number, bridge)
        except BaseException:
            if unsubscribe is not None:
                unsubscribe()
            with contextlib.suppress(Exception):
                if bridge is not None:
                    await asyncio.wait_for(bridge.stop(), STEP_TIMEOUT)
            with contextlib.suppress(Exception):
                await harness.close()
            raise

        def stop_with(reason: str) -> None:
            if not gone.done():
                gone.set_result(reason)

        lease = handle.lease
        if lease is not None:
            lease.lost.add_done_callback(
                lambda lost: stop_with(lost.result() if not lost.cancelled() else "lease lost")
            )
        harness.closed.add_done_callback(lambda _closed: stop_with("its storage closed"))
        desk = OperatorDesk(handle, harness, bridge)
        return Partition(number, handle, harness, bridge, desk, gone, unsubscribe, ctx)

    async def lose(self, number: int, handle: Any) -> None:
        """Close the partition: the router stops feeding it, its bridge stops (no more deliveries), its harness
        closes (running work is signalled and joined; the handle writes its meta and releases the lease, or,
        when the lease was lost, writes nothing more)."""
        part = self.parts.pop(number, None)
        self._gone.pop(number, None)
        if part is None:
            with contextlib.suppress(Exception):
                await handle.close()
            return
        lost = part.gone.result() if part.gone.done() else None  # closing it below resolves `gone` too
        self.metrics.leaving(part.bridge)  # in the same step as leaving `parts`: no scrape misses its counts
        try:
            if number in self.router.owned():
                await self.router.remove_partition(number)
            part.unsubscribe()
            try:
                await asyncio.wait_for(part.bridge.stop(), STEP_TIMEOUT)
            except Exception as exc:
                log.warning("partition %d: stopping its bridge: %r", number, exc)
        finally:
            self.metrics.retire(part.bridge)
        try:
            await asyncio.wait_for(part.harness.close(), STEP_TIMEOUT * 2)
        except Exception as exc:
            log.warning("partition %d: closing its harness: %r", number, exc)
        if lost is not None:
            log.warning("partition %d stopped on this worker: %s", number, lost)


def _report(error: BaseException) -> None:
    log.warning("%s", error)


class Desks(OwnedLoop):
    """Operator requests (`retry`, `cancel`, `approvals decide`) are queued in the partition of their target;
    this polls the owned partitions and lets each partition's desk carry its requests out. Owns its task."""

    task_name = "operator-desks"

    def __init__(self, host: PartitionHost, store: PostgresStore) -> None:
        self.host = host
        self.store = store

    async def _run(self) -> None:
        while True:
            try:  # one look for every owned partition; each partition with something is asked itself
                waiting = await self.store.partitions_with_operator_requests(list(self.host.parts))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database unreachable for a moment: look again next time
                log.warning("operator requests: %s", exc)
                waiting = set()
            for number in sorted(waiting):
                part = self.host.parts.get(number)
                if part is None or part.harness.closed.done() or part.gone.done():
                    continue  # being closed: its requests stay pending for its next owner
                try:
                    for request in await part.storage.pending_operator_requests():
                        await part.desk.handle(request)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a storage hiccup in one partition must not end the others
                    if part.number in self.host.parts:
                        log.warning("operator requests of partition %d: %s", part.number, exc)
            await asyncio.sleep(DESK_POLL)
