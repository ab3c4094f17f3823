"""Operator requests on PostgreSQL (`harness_core.storage.OperatorRequests`): the `operator_requests` table.

Each call is one short autocommit statement on a pooled connection, outside the lease fence and the commit
line: a read-only handle (an operator command beside the running bot) queues, reads and withdraws requests
without the lease, and the leader polls and finishes them. Statements that change a request's status touch
only a `pending` row (`WHERE status = 'pending'`): PostgreSQL re-checks that condition after waiting for a
concurrent update of the row, so of a withdrawal and a finish racing for one request exactly one wins.

Each request carries the partition of its target (`task`/`gate` id modulo the partition count: ids say their
partition), and a partition's owner takes only its partition's requests.

Times are the server's clock (ms since the epoch), so `finished_at - created_at` is measured by one clock even
when the command and the bot run on different machines. Arguments and outcomes are JSON text (ASCII-escaped,
so a U+0000 in them is stored as its escape, which PostgreSQL text accepts).
"""

from __future__ import annotations

import json
from typing import Any

from harness_core.storage._operator import REQUEST_COLUMNS
from harness_core.storage._postgres_ingress import NOW_MS as _NOW_MS

PUT = (
    "INSERT INTO operator_requests (partition, kind, args, status, created_at) "
    f"VALUES ($1, $2, $3, 'pending', {_NOW_MS}) RETURNING id"
)
GET = f"SELECT {REQUEST_COLUMNS} FROM operator_requests WHERE id = $1"
PENDING = (
    f"SELECT {REQUEST_COLUMNS} FROM operator_requests WHERE partition = $1 AND status IN ('pending', 'taken') "
    "ORDER BY id LIMIT $2"
)
WAITING = (  # which of these partitions have requests to carry out: one look for all a worker owns
    "SELECT DISTINCT partition FROM operator_requests WHERE partition = ANY($1::int[]) "
    "AND status IN ('pending', 'taken')"
)
SETTLE = (  # withdraw: only a request nobody took
    f"UPDATE operator_requests SET status = $2, outcome = $3, finished_at = {_NOW_MS} "
    "WHERE id = $1 AND status = 'pending'"
)
PRUNE = (  # finished requests older than $1 ms; pending and taken ones stay whatever their age
    f"DELETE FROM operator_requests WHERE finished_at IS NOT NULL AND finished_at < {_NOW_MS} - $1"
)
CLAIM = "UPDATE operator_requests SET status = 'taken' WHERE id = $1 AND status = 'pending'"
FINISH = (
    f"UPDATE operator_requests SET status = $2, outcome = $3, finished_at = {_NOW_MS} "
    "WHERE id = $1 AND status IN ('pending', 'taken')"
)


def to_text(value: dict[str, Any]) -> str:
    return json.dumps(value)


def changed(status: str) -> bool:
    """Did an UPDATE's command tag (`UPDATE n`) change a row?"""
    return status.split()[-1] != "0"
