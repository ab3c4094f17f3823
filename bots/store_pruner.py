"""What a PostgreSQL store keeps: finished ingress records for a day, finished operator requests for a week.

Any process that writes the store may prune it (each prune is one idempotent DELETE): every worker does, and a
single bot on PostgreSQL (`partitions = 1`, leader and standby) does while it leads.
"""

from __future__ import annotations

import asyncio
import logging

from bots.background import OwnedLoop
from harness_core.storage import FINISHED_REQUESTS_KEPT, PostgresStore

log = logging.getLogger("bots.store_pruner")

INGRESS_KEEP = 86_400.0  # seconds a finished ingress record (its platform key) is kept
PRUNE_EVERY = 3_600.0


class StorePruner(OwnedLoop):
    """Every `every` seconds, deletes ingress records finished more than `keep` seconds ago and operator
    requests finished more than `requests_keep` seconds ago (any worker may: each is one idempotent statement).
    Ingress records are kept a day by default: longer than any platform re-sends an event, so a late duplicate
    still finds its key. Operator requests a week: their outcomes stay readable for a while after the command
    that asked. Owns its task."""

    task_name = "store-pruner"

    def __init__(
        self,
        store: PostgresStore,
        *,
        keep: float = INGRESS_KEEP,
        requests_keep: float = FINISHED_REQUESTS_KEPT,
        every: float = PRUNE_EVERY,
    ) -> None:
        self.store = store
        self.keep = keep
        self.requests_keep = requests_keep
        self.every = every
        self.pruned = 0  # ingress records
        self.pruned_requests = 0

    async def _run(self) -> None:
        while True:
            try:
                self.pruned += await self.store.prune_ingress(finished_for=self.keep)
                self.pruned_requests += await self.store.prune_operator_requests(
                    finished_for=self.requests_keep
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is away for a moment: next time
                log.warning("pruning finished ingress records and operator requests: %s", exc)
            await asyncio.sleep(self.every)
