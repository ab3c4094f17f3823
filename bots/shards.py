"""Discord shards spread over the workers (bots.workers), like partitions: a lease per shard (lease id
`-1 - shard`), assigned among the workers that own a partition, one each as far as they go."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bots.config import BotConfig
from harness_core.storage import LeaseHolder, PostgresStore, Resources


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
