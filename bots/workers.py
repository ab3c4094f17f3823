"""The worker runtime: `durable-bots run` over a PostgreSQL store split into partitions (DESIGN.md §9).

Every process started with the same config and database is a worker. Workers share the partitions out among
themselves (`harness_core.storage._postgres_balance`: rendezvous hashing over the live workers, no
coordinator). For each partition it owns, a worker runs exactly the single-store stack: the partition's
`PostgresStorage` handle (its own lease with fencing), a `Harness` over it (recovery as usual on gain), a
`Bridge` over that harness whose platform writes check that partition's lease. A `Router` sits in front of the
adapters: a message or click for a partition owned here goes to its bridge, any other is committed as an
ingress record its owner takes in.

- A worker that owns no partition is a **standby**: it connects to no platform until it owns one.
- Rate limits hold per process: the router gives every partition bridge the same governor per platform.
- Memory: each partition's harness gets a share of the context cache budget (`cache_share`), so 64
  harnesses do not hold 64 full caches.
- Losing one partition's lease (paused past the ttl, cut off from the database) closes that partition only;
  its harness writes nothing more, since every commit is fenced and every platform write checks the lease.
- SIGTERM drains: partitions are handed over (released at once, the others take them on the notification),
  then the adapters stop, then the worker leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from adapters.base import Adapter
from adapters.bridge import Bridge, Router
from adapters.health import health_of
from adapters.redact import install_log_redaction, redact_url
from bots.admin import AdminError, AdminServer
from bots.config import BotConfig
from bots.metrics import BotMetrics
from bots.operator_requests import OperatorDesk
from bots.ops import OpsContext, history_extension, ops_extension
from bots.runtime import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_STORAGE,
    BotError,
    Console,
    adapter_url,
    agent_change,
    approval_policies,
    bridge_config,
    build_models,
    check_tools,
    enabled_tools,
    known_tools,
    load_plugin,
    sync_conversations,
)
from harness_core import (
    AgentChange,
    Harness,
    HarnessSettings,
    Models,
    Registry,
    StorageError,
    WatchdogSettings,
)
from harness_core.storage import Balancer, LeaseHolder, PostgresStorage, PostgresStore, Resources

log = logging.getLogger("bots.workers")

DESK_POLL = 0.5  # seconds between two looks for operator requests in the owned partitions (one query each)
MIN_CACHE_BYTES = 512 * 1024
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


def rescue_grace(ttl: float) -> float:
    """How long a free partition waits for its assignee before any worker takes it: past the ttl, so a dead
    worker's partitions are simply reassigned when its row expires, and only a live but stuck worker's are
    rescued."""
    return ttl * 1.5 + 1.0


def owned_line(owned: int, partitions: int, *, connected: bool = False) -> str:
    """What the console says about a worker's share (`connected`: its adapters already run)."""
    if owned == 0 and connected:
        return (
            f"durable-bots: worker owns none of the {partitions} partitions; events it receives go to their "
            "owners"
        )
    if owned == 0:
        return (
            f"durable-bots: standby: this worker owns none of the {partitions} partitions; it connects to no "
            "platform until it owns one"
        )
    return f"durable-bots: worker owns {owned} of {partitions} partitions"


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
            config=bridge_config(self.config),
            agent=self.agent,
            approvals=approval_policies(self.config),
            write_guard=guard,
        )

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
        try:
            # The same tools in every partition: a conversation's tools do not depend on who runs it.
            bridge = self._bridge(harness, handle.check_owner)
            ctx = OpsContext(config=self.config, env=self.env, storage=handle)
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
            await self.router.add_partition(number, bridge)
            parked = (await harness.inspect()).parked()
            if parked:
                ids = ", ".join(str(t.record.id) for t in parked)
                self.say(f"durable-bots: {len(parked)} parked task(s) ({ids}): see `durable-bots inspect`")
        except BaseException:
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
        return Partition(number, handle, harness, bridge, desk, gone, unsubscribe)

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
        if number in self.router.owned():
            await self.router.remove_partition(number)
        part.unsubscribe()
        try:
            await asyncio.wait_for(part.bridge.stop(), STEP_TIMEOUT)
        except Exception as exc:
            log.warning("partition %d: stopping its bridge: %r", number, exc)
        try:
            await asyncio.wait_for(part.harness.close(), STEP_TIMEOUT * 2)
        except Exception as exc:
            log.warning("partition %d: closing its harness: %r", number, exc)
        if lost is not None:
            log.warning("partition %d stopped on this worker: %s", number, lost)


def _report(error: BaseException) -> None:
    log.warning("%s", error)


class Desks:
    """Operator requests (`retry`, `cancel`, `approvals decide`) are queued in the partition of their target;
    this polls the owned partitions and lets each partition's desk carry its requests out. Owns its task."""

    def __init__(self, host: PartitionHost) -> None:
        self.host = host
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="operator-desks")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            for part in list(self.host.parts.values()):
                if part.harness.closed.done() or part.gone.done():
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


class OwnershipReport:
    """Says "worker owns N of M partitions" when the number changed, at most twice a second (a join moves
    partitions a few at a time)."""

    def __init__(self, say: Callable[[str], None], partitions: int) -> None:
        self.say = say
        self.partitions = partitions
        self.owned = 0
        self.said: int | None = None
        self._pending: asyncio.TimerHandle | None = None
        self.first = asyncio.Event()
        self.connected = False  # the adapters run (a worker that owned a partition once stays connected)

    def changed(self, owned: int) -> None:
        self.owned = owned
        if owned:
            self.first.set()
        if self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(0.5, self.flush)

    def flush(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self.said != self.owned:
            self.said = self.owned
            self.say(owned_line(self.owned, self.partitions, connected=self.connected))


def worker_readiness(
    host: PartitionHost, adapters: Sequence[Adapter], phase: Sequence[str]
) -> Callable[[], Awaitable[dict[str, str]]]:
    """`/readyz` of a worker: not ready while starting or stopping, while it owns no partition (a standby),
    while a partition's storage cannot serve, or while an adapter is not connected."""

    async def check() -> dict[str, str]:
        problems: dict[str, str] = {}
        if phase[0]:
            problems["bot"] = phase[0]
        elif not host.parts:
            problems["bot"] = f"standby: owns none of the {host.router.partitions} partitions"
        for part in list(host.parts.values()):
            reason = "closed" if part.harness.closed.done() else part.storage.not_ready()
            if reason:
                problems["storage"] = f"partition {part.number}: {reason}"
                break
        for adapter in adapters:
            health = health_of(adapter)
            if health is not None and not health.connected:
                problems[adapter.name] = f"not connected to {health.platform}"
        return problems

    return check


class ShardHost:
    """Discord shards spread over the workers like partitions (lease ids `-1 - shard`): the adapter starts
    with no shard and runs the ones this worker holds leases for (`set_shards`). Only a worker that owns a
    partition runs shards: a standby connects to no platform."""

    def __init__(
        self, adapter: Any, store: PostgresStore, ids: Sequence[int], count: int, say: Callable[[str], None]
    ) -> None:
        self.adapter = adapter
        self.store = store
        self.say = say
        self.ids = list(ids)
        self.count = count
        self.running: dict[int, Any] = {}  # shard -> its lease

    def family(self) -> Resources:
        return Resources(
            ids=tuple(-1 - shard for shard in self.ids),
            take=self.store.take_resource,
            is_claim=lambda claim: not isinstance(claim, LeaseHolder),
            lost_of=lambda lease: lease.lost,
            needs_partition=True,
            bounded=True,  # two shards over two workers: one each
        )

    async def gain(self, resource: int, lease: Any) -> None:
        self.running[-1 - resource] = lease
        try:
            await self._apply()
        except BaseException:
            self.running.pop(-1 - resource, None)
            await lease.release()
            raise

    async def lose(self, resource: int, lease: Any) -> None:
        self.running.pop(-1 - resource, None)
        try:
            await self._apply()
        finally:
            await lease.release()

    async def _apply(self) -> None:
        shards = sorted(self.running)
        await self.adapter.set_shards(shards, self.count)
        listed = ", ".join(str(shard) for shard in shards) if shards else "none"
        self.say(f"{self.adapter.name}: this worker runs shard(s) {listed} of {self.count}")


def refuse_devchat(config: BotConfig, names: Sequence[str]) -> None:
    """devchat serves one page from one process: it cannot run as one of several workers."""
    if "devchat" in names:
        raise BotError(
            f"devchat cannot run over a store split into {config.storage.partitions} partitions: it serves one "
            "page from one process. Run devchat on SQLite ([storage] path), or on a PostgreSQL store created "
            "with [storage] partitions = 1; Slack and Discord run as many workers"
        )


async def run_workers(
    config: BotConfig,
    adapters: Sequence[tuple[Adapter, dict[str, Any]]],
    env: Mapping[str, str],
    url: str,
    *,
    console: Console,
    stop: asyncio.Event | None = None,
) -> int:
    """`run` as one worker: until SIGTERM/SIGINT (or `stop`), then drain (partitions handed over at once),
    stop the adapters, leave. Raises `BotError` for what must be fixed before anything runs (the database is
    unreachable, the store's partition count differs)."""
    install_log_redaction()
    say = console.say
    problems = check_tools(config)
    if problems:
        raise BotError("\n".join(str(p) for p in problems))
    known, _ = known_tools(config)
    agent = agent_change(config, enabled_tools(config, known))
    partitions = config.storage.partitions
    ttl = config.storage.lease_ttl
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    received: list[str] = []

    def on_signal(signum: int) -> None:
        if received:
            say("durable-bots: second signal, exiting now (work resumes on the other workers)")
            os._exit(EXIT_ERROR)
        received.append(signal.Signals(signum).name)
        stop.set()

    def on_reload() -> None:
        say(
            "durable-bots: reload (SIGHUP) is not supported by a worker of several partitions yet; restart the "
            "workers one by one to apply a changed config (nothing is lost)"
        )

    installed: list[int] = []
    for signum in (int(signal.SIGTERM), int(signal.SIGINT)):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
    with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
        loop.add_signal_handler(signal.SIGHUP, on_reload)
        installed.append(int(signal.SIGHUP))

    models = build_models(config.bot.model_ref, env)
    metrics = BotMetrics()
    for provider in models.providers():
        models.set_provider(metrics.provider(provider))
    store: PostgresStore | None = None
    admin: AdminServer | None = None
    try:
        try:
            store = await PostgresStore.open(url, partitions=partitions, lease_ttl=ttl)
        except StorageError as exc:  # unreachable, bad credentials, another partition count: one line
            raise BotError(str(exc), EXIT_STORAGE) from None
        router = Router(store, partitions)
        host = PartitionHost(config, env, router=router, models=models, metrics=metrics, agent=agent, say=say)
        started: list[Adapter] = []
        phase = ["starting"]
        metrics.bind_parts(host.running, router.governors, started)
        if config.admin.address:
            try:
                admin = AdminServer(
                    config.admin.address, metrics, worker_readiness(host, started, phase), env
                )
                await admin.start()
            except AdminError as exc:
                admin = None
                raise BotError(str(exc)) from None
            say(f"admin: {admin.url} (healthz, readyz, metrics)")
        say(
            f"durable-bots: {config.bot.name} starting (pid {os.getpid()}, model {config.bot.model}, storage "
            f"{store.description}) as a worker: {partitions} partitions shared with the other workers"
        )
        return await _serve(config, adapters, store, router, host, started, phase, say, stop, received, ttl)
    finally:
        if admin is not None:
            await admin.stop()
        if store is not None:
            with contextlib.suppress(Exception):
                await store.close()
        await models.aclose()
        for signum in installed:
            loop.remove_signal_handler(signum)


async def _serve(
    config: BotConfig,
    adapters: Sequence[tuple[Adapter, dict[str, Any]]],
    store: PostgresStore,
    router: Router,
    host: PartitionHost,
    started: list[Adapter],
    phase: list[str],
    say: Callable[[str], None],
    stop: asyncio.Event,
    received: Sequence[str],
    ttl: float,
) -> int:
    partitions = router.partitions
    report = OwnershipReport(say, partitions)
    family = Resources(
        ids=tuple(range(partitions)),
        take=store.open_partition,
        is_claim=lambda claim: isinstance(claim, PostgresStorage),
        lost_of=host.gone_of,
    )
    balancer = Balancer(
        store,
        [family],
        on_gain=host.gain,
        on_lose=host.lose,
        tick=min(1.0, ttl / 3),
        grace=rescue_grace(ttl),
        on_owned_changed=report.changed,
    )
    desks = Desks(host)
    shard_balancers: list[Balancer] = []
    code = EXIT_OK
    try:
        await balancer.start()
        report.flush()
        if not host.parts:  # a standby: no platform connection until a partition is ours
            owning = asyncio.ensure_future(report.first.wait())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({owning, stopping}, return_when=asyncio.FIRST_COMPLETED)
            owning.cancel()
            stopping.cancel()
            report.flush()
        if stop.is_set():
            say("durable-bots: stopped while on standby")
            return EXIT_OK
        desks.start()
        report.connected = True
        for adapter, options in adapters:
            try:
                await adapter.start(router)
            except Exception as exc:
                log.exception("adapter %s failed to start", adapter.name)
                raise BotError(f"adapter {adapter.name!r} failed to start: {exc}") from None
            started.append(adapter)
            summary = getattr(adapter, "catch_up_summary", None)
            if isinstance(summary, str) and summary:
                say(f"{adapter.name}: {summary}")
            shown = adapter_url(adapter, options)
            if shown is not None:
                say(f"{adapter.name}: {redact_url(shown)}")
        for adapter in started:
            if callable(getattr(adapter, "set_shards", None)):
                shards = ShardHost(
                    adapter,
                    store,
                    shard_plan(config, adapter),
                    int(getattr(adapter, "shard_count", None) or 1),
                    say,
                )
                shard_balancer = Balancer(
                    store,
                    [shards.family()],
                    on_gain=shards.gain,
                    on_lose=shards.lose,
                    tick=min(1.0, ttl / 3),
                    grace=rescue_grace(ttl),
                    membership=False,
                    holds_partition=lambda: bool(host.parts),
                )
                shard_balancers.append(shard_balancer)
                await shard_balancer.start()
                balancer.on_owned_changed = _both(report.changed, lambda _owned: wake_all(shard_balancers))
        phase[0] = ""
        say(f"durable-bots: ready ({', '.join(a.name for a in started)}); stop with Ctrl-C or SIGTERM")
        await stop.wait()
        why = received[0] if received else "stop requested"
        say(f"durable-bots: stopping ({why}): handing this worker's partitions over, then intake stops")
    finally:
        phase[0] = "stopping"
        await desks.stop()
        for shard_balancer in shard_balancers:  # shards first: they need a partition owner behind them
            try:
                await shard_balancer.stop()
            except Exception as exc:
                log.warning("handing shards over: %r", exc)
        try:
            await balancer.stop()  # drain: every partition closed and released, the worker row deleted
        except Exception as exc:
            log.warning("handing partitions over: %r", exc)
            code = EXIT_ERROR
        report.flush()
        for adapter in reversed(started):
            try:
                await asyncio.wait_for(adapter.stop(), STEP_TIMEOUT)
            except Exception as exc:
                log.warning("adapter %s did not stop cleanly: %r", adapter.name, exc)
            health = health_of(adapter)
            if health is not None and health.connections_opened:
                say(f"{adapter.name}: {health.summary()}")
        await router.stop()
    if code == EXIT_OK:
        say("durable-bots: stopped cleanly")
    return code


def _both(first: Callable[[int], None], second: Callable[[int], None]) -> Callable[[int], None]:
    def call(owned: int) -> None:
        first(owned)
        second(owned)

    return call


def wake_all(balancers: Sequence[Balancer]) -> None:
    for balancer in balancers:
        balancer.wake()


def shard_plan(config: BotConfig, adapter: Any) -> list[int]:
    """The shards to spread: the ones `[adapters.discord] shard_ids` names, else every shard of the count."""
    planned = config.adapter_options(adapter.name).get("shard_ids")
    if isinstance(planned, list) and planned:
        return [int(shard) for shard in planned]
    return list(range(int(getattr(adapter, "shard_count", None) or 1)))


def worker_adapter_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """A worker starts the Discord adapter with no shard: it runs the ones it holds leases for."""
    if name == "discord":
        return {**options, "shard_ids": []}
    return options
