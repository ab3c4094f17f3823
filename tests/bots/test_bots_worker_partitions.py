"""The worker runtime's partition stacks in one process over a real PostgreSQL store: a partition whose lease
is lost closes alone and writes nothing more; the others carry on; a reload reaches every partition; a graceful
stop releases the rest."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from bots_cli_support import bot_env, cli, shipped_config_in, toml_value

from adapters.bridge import IncomingMessage, Place, Router, partition_of_place
from bots.config import BotConfig, load_config
from bots.metrics import BotMetrics
from bots.ops import search_conversations
from bots.partition_stack import PartitionHost, cache_share
from bots.reload import reload_config
from bots.runtime import agent_change, build_models, enabled_tools, known_tools
from bots.store_pruner import StorePruner
from bots.workers import owned_line, rescue_grace
from harness_core import CORE_USER, Harness, HarnessSettings, Models, StorageError
from harness_core.messages import UserMessage
from harness_core.storage import Balancer, PostgresStorage, PostgresStore, Resources

PARTITIONS = 4
TTL = 1.5


@dataclass
class InProcessWorker:
    """What `durable-bots run` builds for a partitioned store, in this process: store, router, partition host,
    balancer (not started)."""

    config: BotConfig
    store: PostgresStore
    router: Router
    host: PartitionHost
    balancer: Balancer
    models: Models
    said: list[str]

    async def close(self) -> None:
        await self.balancer.stop()
        await self.router.stop()
        await self.store.close()
        await self.models.aclose()


async def in_process_worker(tmp_path: Path, pg_url: str) -> InProcessWorker:
    config = load_config(
        shipped_config_in(
            tmp_path,
            replace={
                'path = "var/ops.sqlite"': f"url = {toml_value(pg_url)}\nlease_ttl = {TTL}\npartitions = {PARTITIONS}"
            },
        )
    )
    env: dict[str, str] = {}
    known, _ = known_tools(config)
    said: list[str] = []
    store = await PostgresStore.open(pg_url, partitions=PARTITIONS, lease_ttl=TTL)
    router = Router(store, PARTITIONS, poll_interval=0.2)
    models = build_models(config.bot.model_ref, env)
    host = PartitionHost(
        config,
        env,
        router=router,
        models=models,
        metrics=BotMetrics(),
        agent=agent_change(config, enabled_tools(config, known)),
        say=said.append,
    )
    host.metrics.bind_parts(host.running, router.governors, [])  # as bots/workers.py does
    balancer = Balancer(
        store,
        [
            Resources(
                ids=tuple(range(PARTITIONS)),
                take=store.open_partition,
                is_claim=lambda claim: isinstance(claim, PostgresStorage),
                lost_of=host.gone_of,
            )
        ],
        on_gain=host.gain,
        on_lose=host.lose,
        tick=0.2,
        grace=rescue_grace(TTL),
    )
    return InProcessWorker(config, store, router, host, balancer, models, said)


async def test_a_lost_lease_closes_only_its_partition_and_writes_nothing_more(
    tmp_path: Path, pg_url: str
) -> None:
    worker = await in_process_worker(tmp_path, pg_url)
    config, router, host, balancer = worker.config, worker.router, worker.host, worker.balancer
    said = worker.said
    conn = await asyncpg.connect(pg_url)
    try:
        await balancer.start()
        assert sorted(host.parts) == list(range(PARTITIONS))
        assert sorted(router.owned()) == list(range(PARTITIONS))
        lost = host.parts[2]
        lost.bridge.stats.taken_in["slack"] += 5  # what it took in while this worker owned it
        assert (await host.metrics.sample()).taken_in["slack"] == 5
        # Another process takes partition 2 over (as after a pause past the ttl): a new holder, a new epoch.
        await conn.execute(
            "UPDATE leases SET holder = 'thief', epoch = epoch + 1, expires_at = now() + interval '1 minute' "
            "WHERE partition = 2"
        )
        meta_before = await conn.fetchrow("SELECT next_id, last_seq FROM meta WHERE partition = 2")
        await asyncio.wait_for(asyncio.shield(lost.gone), TTL * 4)  # the renewal found the new holder
        for _ in range(100):  # then the balancer's next tick closes the partition
            if 2 not in host.parts:
                break
            await asyncio.sleep(0.05)
        assert sorted(host.parts) == [0, 1, 3] and sorted(router.owned()) == [0, 1, 3]
        assert (await host.metrics.sample()).taken_in["slack"] == 5  # a counter never goes back
        assert lost.harness.closed.done() and 2 not in balancer.owned
        assert all(not part.harness.closed.done() for part in host.parts.values())
        # Nothing more was written for it: its meta and its lease row are as the new holder left them.
        assert await conn.fetchrow("SELECT next_id, last_seq FROM meta WHERE partition = 2") == meta_before
        assert await conn.fetchval("SELECT holder FROM leases WHERE partition = 2") == "thief"
        # The others still commit.
        for number in (0, 1, 3):
            assert await host.parts[number].bridge.watching_since("test", f"w{number}") > 0
        # A history search run by partition 1's tools finds what partition 3 recorded (a read, no lease).
        three = host.parts[3].harness
        conversation = await three.create_conversation()
        await three.commit(
            lambda tx: tx.append_messages(
                conversation.id, CORE_USER, [UserMessage(content="the checkout canary rolled back")]
            )
        )
        one = host.parts[1]
        assert one.ops.storage.partition is None and one.ops.storage.read_only
        hits = await search_conversations(one.harness, one.ops.storage, "canary")
        assert [hit["text"] for hit in hits] == ["the checkout canary rolled back"]
        # SIGHUP: a reloaded [answer] reaches every partition's bridge (and those opened later).
        source = Path(config.source)
        edited = source.read_text().replace('mode = "all"', 'mode = "mentions"', 1)  # noqa: ASYNC240 (tiny file)
        source.write_text(edited)  # noqa: ASYNC240
        assert await reload_config(host, said.append) is not None
        assert {part.bridge.config.default.answer for part in host.parts.values()} == {"mentions"}
        assert host.bridge_settings.default.answer == "mentions"
        assert any(line.startswith(f"durable-bots: reloaded {source}") for line in said), said
        await balancer.stop()
        assert host.parts == {} and router.owned() == frozenset()
        holders = dict(await conn.fetch("SELECT partition, holder FROM leases WHERE partition >= 0"))
        assert holders == {0: None, 1: None, 2: "thief", 3: None}  # released at once, except the lost one
    finally:
        await conn.close()
        await worker.close()


async def test_a_partition_whose_opening_failed_is_opened_again_and_takes_its_messages_in(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A storage error late in opening a partition (here: the read of its parked tasks) leaves nothing behind:
    the next try opens it and its messages are taken in. Before, the router kept serving the failed open's
    closed harness and refused every later open ("already served here") until the worker restarted."""
    inspect = Harness.inspect
    failures: list[int] = []

    async def failing_once(harness: Harness) -> Any:
        if not failures:
            failures.append(1)
            raise StorageError("storage postgresql://…: scan submissions failed: connection was closed")
        return await inspect(harness)

    monkeypatch.setattr(Harness, "inspect", failing_once)
    worker = await in_process_worker(tmp_path, pg_url)
    sender_store = await PostgresStore.open(pg_url, partitions=PARTITIONS, lease_ttl=TTL)
    sender = Router(sender_store, PARTITIONS, consume=False)
    conn = await asyncpg.connect(pg_url)
    try:
        await worker.balancer.start()
        assert failures == [1]
        for _ in range(200):
            if sorted(worker.host.parts) == list(range(PARTITIONS)):
                break
            await asyncio.sleep(0.05)
        assert sorted(worker.host.parts) == sorted(worker.router.owned()) == list(range(PARTITIONS))
        channels = [Place("slack", "T1", f"C{n}") for n in range(200)]
        places = [  # two channels of every partition
            place
            for number in range(PARTITIONS)
            for place in [c for c in channels if partition_of_place(c, PARTITIONS) == number][:2]
        ]
        assert len(places) == 2 * PARTITIONS
        for n, place in enumerate(places):
            await sender.intake(IncomingMessage(place, f"1.{n}", "U1", "alice", "hello"))
        for _ in range(200):
            if await conn.fetchval("SELECT count(*) FROM ingress WHERE finished_at IS NULL") == 0:
                break
            await asyncio.sleep(0.05)
        assert await conn.fetchval("SELECT count(*) FROM ingress WHERE finished_at IS NOT NULL") == len(
            places
        )
    finally:
        await conn.close()
        await sender.stop()
        await sender_store.close()
        await worker.close()


def test_each_partition_harness_gets_a_share_of_the_cache_and_the_console_speaks_plainly() -> None:
    settings = HarnessSettings()
    share = cache_share(settings, 64)
    assert share.context_cache_bytes * 64 <= settings.context_cache_bytes  # all 64 together: one budget
    assert share.context_cache_conversations >= 8
    assert cache_share(settings, 1).context_cache_bytes == settings.context_cache_bytes
    assert owned_line(21, 64) == "durable-bots: worker owns 21 of 64 partitions"
    assert "connects to no platform" in owned_line(0, 64)


async def test_finished_ingress_records_and_operator_requests_are_pruned_after_they_are_kept(
    pg_url: str,
) -> None:
    store = await PostgresStore.open(pg_url, partitions=PARTITIONS, lease_ttl=TTL)
    pruner = StorePruner(store, keep=0.0, requests_keep=0.0, every=0.05)
    reader = store.reader()
    try:
        done = await reader.put_operator_request("retry", {"task": 5})
        waiting = await reader.put_operator_request("retry", {"task": 9})
        await store.pool.execute(
            "UPDATE operator_requests SET status = 'done', outcome = '{}', finished_at = 1 WHERE id = $1",
            done,
        )
        assert await store.put_ingress(1, "message", "slack:T1:C1:1.0", {"text": "hi"})
        assert await store.put_ingress(1, "message", "slack:T1:C1:2.0", {"text": "later"})
        first, second = await store.pending_ingress([1])
        await store.finish_ingress(first.id)
        pruner.start()
        for _ in range(100):
            # a round in the millisecond the record finished keeps it (finished 0 ms ago is not more than
            # 0 ms ago): a later round prunes it
            if pruner.pruned and pruner.pruned_requests:
                break
            await asyncio.sleep(0.05)
        assert pruner.pruned == 1 and pruner.pruned_requests == 1
        assert [r.key for r in await store.pending_ingress([1])] == [second.key]  # unfinished ones stay
        assert await reader.operator_request(done) is None
        assert (await reader.operator_request(waiting)) is not None  # a pending request stays
        assert await store.put_ingress(
            1, "message", "slack:T1:C1:1.0", {"text": "hi"}
        )  # its key is free again
    finally:
        await pruner.stop()
        await store.close()


async def test_devchat_is_refused_over_a_partitioned_store(tmp_path: Path, pg_url: str) -> None:
    config = shipped_config_in(tmp_path, replace={'path = "var/ops.sqlite"': f"url = {toml_value(pg_url)}"})
    result = await cli(config, "run", "--adapter", "devchat", env=bot_env(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith(
        "durable-bots: devchat cannot run over a store split into 64 partitions: it serves one page from one "
        "process."
    ), result.stderr
    assert "[storage] partitions = 1" in result.stderr and "Traceback" not in result.stderr


async def test_a_worker_with_another_partition_count_than_the_store_exits_with_one_line(
    tmp_path: Path, pg_url: str
) -> None:
    store = await PostgresStore.open(pg_url, partitions=PARTITIONS, lease_ttl=TTL)
    await store.close()
    config = shipped_config_in(
        tmp_path,
        replace={'path = "var/ops.sqlite"': f"url = {toml_value(pg_url)}\npartitions = 8"},
        append='\n[adapters.slack]\nmode = "socket"\n',
    )
    env = bot_env(tmp_path, SLACK_BOT_TOKEN="xoxb-test", SLACK_APP_TOKEN="xapp-test")
    result = await cli(config, "run", "--adapter", "slack", env=env)
    assert result.returncode == 3, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"has {PARTITIONS} partitions" in line and "8" in line and "[storage] partitions" in line, line


async def test_counters_never_go_back_while_a_lost_partition_closes(tmp_path: Path, pg_url: str) -> None:
    worker = await in_process_worker(tmp_path, pg_url)
    conn = await asyncpg.connect(pg_url)
    try:
        await worker.balancer.start()
        lost = worker.host.parts[2]
        lost.bridge.stats.taken_in["slack"] += 5
        stop = lost.bridge.stop
        stopping = asyncio.Event()

        async def slow_stop() -> None:  # replies finishing their step on a slow platform
            stopping.set()
            await asyncio.sleep(0.5)
            await stop()

        lost.bridge.stop = slow_stop  # type: ignore[method-assign]
        await conn.execute(
            "UPDATE leases SET holder = 'thief', epoch = epoch + 1, expires_at = now() + interval '1 minute' "
            "WHERE partition = 2"
        )
        await asyncio.wait_for(stopping.wait(), TTL * 4)  # out of `parts`, its bridge still stopping
        seen = []
        while 2 in worker.host.parts or not lost.harness.closed.done():
            seen.append((await worker.host.metrics.sample()).taken_in.get("slack", 0))
            await asyncio.sleep(0.05)
        seen.append((await worker.host.metrics.sample()).taken_in.get("slack", 0))
        assert len(seen) > 3 and set(seen) == {5}, seen
    finally:
        await conn.close()
        await worker.close()
