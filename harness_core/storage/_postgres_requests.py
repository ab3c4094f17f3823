"""Operator requests on PostgreSQL (`harness_core.storage.OperatorRequests`): the `operator_requests` table.

Each call is one short autocommit statement on a pooled connection, outside the lease fence and the commit
line: a read-only handle (an operator command beside the running bot) queues, reads and withdraws requests
without the lease, and the leader polls and finishes them. Statements that change a request's status touch
only a `pending` row (`WHERE status = 'pending'`): PostgreSQL re-checks that condition after waiting for a
concurrent update of the row, so of a withdrawal and a finish racing for one request exactly one wins.

Times are the server's clock (ms since the epoch), so `finished_at - created_at` is measured by one clock even
when the command and the bot run on different machines. Arguments and outcomes are JSON text (ASCII-escaped,
so a U+0000 in them is stored as its escape, which PostgreSQL text accepts).
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from harness_core.storage._operator import OperatorRequest

_NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
_COLUMNS = "id, kind, args, status, outcome, created_at, finished_at"

PUT = (
    "INSERT INTO operator_requests (partition, kind, args, status, created_at) "
    f"VALUES ($1, $2, $3, 'pending', {_NOW_MS}) RETURNING id"
)
GET = f"SELECT {_COLUMNS} FROM operator_requests WHERE id = $1"
PENDING = (
    f"SELECT {_COLUMNS} FROM operator_requests WHERE partition = $1 AND status IN ('pending', 'taken') "
    "ORDER BY id LIMIT $2"
)
SETTLE = (  # withdraw: only a request nobody took
    f"UPDATE operator_requests SET status = $2, outcome = $3, finished_at = {_NOW_MS} "
    "WHERE id = $1 AND status = 'pending'"
)
CLAIM = "UPDATE operator_requests SET status = 'taken' WHERE id = $1 AND status = 'pending'"
FINISH = (
    f"UPDATE operator_requests SET status = $2, outcome = $3, finished_at = {_NOW_MS} "
    "WHERE id = $1 AND status IN ('pending', 'taken')"
)


def request_of(row: asyncpg.Record) -> OperatorRequest:
    return OperatorRequest(
        id=row[0],
        kind=row[1],
        args=json.loads(row[2]),
        status=row[3],
        outcome=json.loads(row[4]) if row[4] is not None else None,
        created_at=row[5],
        finished_at=row[6],
    )


def to_text(value: dict[str, Any]) -> str:
    return json.dumps(value)


def changed(status: str) -> bool:
    """Did an UPDATE's command tag (`UPDATE n`) change a row?"""
    return status.split()[-1] != "0"
