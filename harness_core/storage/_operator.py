"""Operator requests: a small durable channel from operator commands to the process that owns a storage.

The owner holds the storage's writer (and its owner lock), so an operator command cannot use the harness while
the bot runs. Instead it writes a request (`put_operator_request`) with a short transaction of its own, outside
the owner's commit line; the owner polls for pending requests (`pending_operator_requests`), carries each out
through the ordinary harness API and writes the outcome back (`finish_operator_request`), which the operator
reads (`operator_request`). A request the owner has not picked up can be withdrawn
(`withdraw_operator_request`), so a command that gave up waiting leaves nothing to happen later.

It is an optional capability: a backend that offers it implements `OperatorRequests` (check with
`isinstance(storage, OperatorRequests)`); `SqliteStorage` and `PostgresStorage` do, both on the owner's handle
and on a handle from `open_read_only()` (which then writes only to the request table, never to the harness's
records; on PostgreSQL without the lease). A PostgreSQL leader whose lease is no longer safely valid takes
no request and finishes none (`LeaseLost`): they stay pending for its successor.

Contract for a backend:
- `put_operator_request` is durable when it returns and needs no owner lock; ids increase;
- requests are carried out in id order; a request stays `pending` until finished, so one whose owner died
  while carrying it out is carried out again by the next owner (every kind must tolerate that: retry, cancel
  and decide are idempotent);
- `finish_operator_request` and `withdraw_operator_request` change only a `pending` request (first wins) and
  say whether they did.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

# How long a finished request (its outcome) is kept: readable for a while after the command that asked.
# SQLite deletes older ones whenever a request is queued; on PostgreSQL the store pruner does (bots).
FINISHED_REQUESTS_KEPT = 7 * 86_400.0  # seconds

OperatorRequestStatus = Literal["pending", "taken", "done", "failed", "withdrawn"]


class OperatorRequest(BaseModel):
    id: int
    kind: str  # e.g. "retry", "cancel", "decide"
    args: dict[str, Any] = Field(default_factory=dict)
    status: OperatorRequestStatus = "pending"
    outcome: dict[str, Any] | None = None  # what the owner reports: {"message": ..., ...}
    created_at: int = 0  # ms since the epoch
    finished_at: int | None = None


# The columns of the `operator_requests` table of both SQL backends, in the order `request_from_row` reads.
REQUEST_COLUMNS = "id, kind, args, status, outcome, created_at, finished_at"


def request_from_row(row: Sequence[Any]) -> OperatorRequest:
    """A request from its row (`REQUEST_COLUMNS`; arguments and outcome as JSON text)."""
    return OperatorRequest(
        id=row[0],
        kind=row[1],
        args=json.loads(row[2]),
        status=row[3],
        outcome=json.loads(row[4]) if row[4] is not None else None,
        created_at=row[5],
        finished_at=row[6],
    )


@runtime_checkable
class OperatorRequests(Protocol):
    async def put_operator_request(self, kind: str, args: dict[str, Any]) -> int:
        """Queue a request for the owner; returns its id. Works without the owner lock."""
        ...

    async def operator_request(self, request_id: int) -> OperatorRequest | None:
        """The request as stored now (not as of a read-only snapshot)."""
        ...

    async def withdraw_operator_request(self, request_id: int) -> bool:
        """Mark a still pending request withdrawn; False if the owner finished it first."""
        ...

    async def pending_operator_requests(self, limit: int = 20) -> list[OperatorRequest]:
        """Owner side: pending requests (and ones a previous owner took and never finished), oldest first."""
        ...

    async def claim_operator_request(self, request_id: int) -> bool:
        """Owner side: take a pending request before carrying it out (status `taken`: it can no longer be
        withdrawn, so an asker that stops waiting never says "nothing was done" about work that ran); False
        if it was withdrawn first. A request left `taken` by an owner that died is offered again by
        `pending_operator_requests` (every kind is idempotent)."""
        ...

    async def finish_operator_request(
        self, request_id: int, status: Literal["done", "failed"], outcome: dict[str, Any]
    ) -> bool:
        """Owner side: record the outcome of a pending or taken request; False if it was withdrawn first."""
        ...
