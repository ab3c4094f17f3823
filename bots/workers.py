"""The worker runtime: `durable-bots run` over a PostgreSQL store split into partitions (DESIGN.md §9).

Every process started with the same config and database is a worker. Workers share the partitions out among
themselves (`harness_core.storage._postgres_balance`: rendezvous hashing with an exact balance over the live
workers, no coordinator). For each partition it owns, a worker runs exactly the single-store stack: the partition's
`PostgresStorage` handle (its own lease with fencing), a `Harness` over it (recovery as usual on gain), a
`Bridge` over that harness whose platform writes check that partition's lease. A `Router` sits in front of the
adapters: a message or click for a partition owned here goes to its bridge, any other is committed as an
ingress record its owner takes in.

- A worker that owns no partition is a **standby**: it connects to no platform until it owns one.
- `[workers] intake = "separate"`: the worker's Slack events are taken in by a child process of its own
  (`bots.intake_process`), so acknowledgements never wait behind this process's turns.
- Rate limits hold per process: the router gives every partition bridge the same governor per platform.
- Memory: each partition's harness gets a share of the context cache budget (`partition_stack.cache_share`),
  so 64 harnesses do not hold 64 full caches.
- Losing one partition's lease (paused past the ttl, cut off from the database) closes that partition only;
  its harness writes nothing more, since every commit is fenced and every platform write checks the lease.
- SIGTERM drains: partitions are handed over (released at once, the others take them on the notification),
  then the adapters stop, then the worker leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from adapters.base import Adapter
from adapters.bridge import Router
from adapters.health import health_of
from adapters.redact import install_log_redaction, redact_url
from bots.admin import AdminError, AdminServer
from bots.config import BotConfig
from bots.cpu_priority import lower_priority
from bots.intake_process import IntakeChild
from bots.metrics import BotMetrics
from bots.partition_stack import Desks, PartitionHost
from bots.reload import Reloads
from bots.runtime import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_STORAGE,
    BotError,
    Console,
    adapter_url,
    agent_change,
    build_models,
    check_tools,
    enabled_tools,
    freeze_startup_heap,
    known_tools,
)
from bots.shards import ShardHost, shard_plan
from bots.store_pruner import StorePruner
from harness_core import (
    StorageError,
    WatchdogSettings,
)
from harness_core.storage import Balancer, PostgresStorage, PostgresStore, Resources

log = logging.getLogger("bots.workers")

MIN_CACHE_BYTES = 512 * 1024
MIN_CACHE_CONVERSATIONS = 8
STEP_TIMEOUT = 15.0
QUIET_WATCHDOG = WatchdogSettings(enabled=False, interval_ms=60_000)


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
    host: PartitionHost,
    adapters: Sequence[Adapter],
    phase: Sequence[str],
    intake: Sequence[IntakeChild] = (),
) -> Callable[[], Awaitable[dict[str, str]]]:
    """`/readyz` of a worker: not ready while starting or stopping, while it owns no partition (a standby),
    while a partition's storage cannot serve, while an adapter is not connected, or while its separate intake
    process is not running."""

    async def check() -> dict[str, str]:
        problems: dict[str, str] = {}
        if not host.parts and phase[0] != "stopping":
            problems["bot"] = f"standby: owns none of the {host.router.partitions} partitions"
        elif phase[0]:
            problems["bot"] = phase[0]
        for part in list(host.parts.values()):
            reason = "closed" if part.harness.closed.done() else part.storage.not_ready()
            if reason:
                problems["storage"] = f"partition {part.number}: {reason}"
                break
        for adapter in adapters:
            if getattr(adapter, "shard_ids", None) == []:
                continue  # runs no Discord shard here: the other workers hold the gateway sessions
            if getattr(adapter, "listening", True) is False:
                continue  # its events come in through the separate intake process (below)
            health = health_of(adapter)
            if health is not None and not health.connected:
                problems[adapter.name] = f"not connected to {health.platform}"
        for child in intake:
            problem = child.problem()
            if problem:
                problems["intake"] = problem
        return problems

    return check


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
    intake_argv: Sequence[str] | None = None,
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

    reloads: list[Reloads] = []  # set once the partitions' host exists
    early: list[bool] = []

    def on_reload() -> None:
        if reloads:
            reloads[0].request()
        else:
            early.append(True)
            say("durable-bots: reload requested before the worker runs; applying it once it does")

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
        reloads.append(Reloads(host, say))
        if early:
            reloads[0].request()
        started: list[Adapter] = []
        phase = ["starting"]
        # `[workers] intake = "separate"`: a child takes the events in (started with the adapters)
        intake = [IntakeChild(intake_argv, env, say)] if intake_argv else []
        metrics.bind_parts(host.running, router.governors, started)
        if config.admin.address:
            try:
                admin = AdminServer(
                    config.admin.address, metrics, worker_readiness(host, started, phase, intake), env
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
        return await _serve(
            config, adapters, store, router, host, started, phase, say, stop, received, ttl, intake
        )
    finally:
        for reload in reloads:
            await reload.stop()
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
    intake: Sequence[IntakeChild] = (),
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
    desks = Desks(host, store)
    pruner = StorePruner(store)
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
        pruner.start()
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
            if shown is not None and getattr(adapter, "listening", True) is not False:
                say(f"{adapter.name}: {redact_url(shown)}")
        for child in intake:
            await child.begin(stop)
            if config.workers.worker_nice and not stop.is_set():
                say(lower_priority(config.workers.worker_nice, keep={child.spawner.thread_id}).describe())
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
        freeze_startup_heap()  # full collections no longer walk what startup loaded
        say(f"durable-bots: ready ({', '.join(a.name for a in started)}); stop with Ctrl-C or SIGTERM")
        await stop.wait()
        why = received[0] if received else "stop requested"
        say(f"durable-bots: stopping ({why}): handing this worker's partitions over, then intake stops")
    finally:
        phase[0] = "stopping"
        await desks.stop()
        await pruner.stop()
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
        for child in intake:  # it stops taking events and acknowledges those in hand, like an adapter
            await child.end()
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
