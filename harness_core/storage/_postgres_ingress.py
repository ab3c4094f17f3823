"""Store-wide tables of many workers: `ingress` (events any worker took in, for a partition's owner) and
`workers` (who is alive, for balancing). Each call is one short autocommit statement on a pooled connection;
none is fenced (any worker writes ingress, each worker its own row).

Ingress is exactly once across workers: the key (a platform message id) is unique over the store, and a second
put of it from any worker does nothing and says so. A put commits the INSERT alone; the partition's channel is NOTIFYed after it,
coalesced with the other puts of a short window (`_postgres_wake`), so the owner takes it in at once; the owner
also polls (`pending_ingress`), so a lost or late notification only delays. Payloads are strict JSON (`clean_json`: text from outside is made valid, anything
that is not JSON is refused before any I/O), stored as ASCII-escaped JSON text, so they read back equal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from harness_core._json import clean_json
from harness_core.errors import StorageRequestError, StrictJsonError

INGRESS_CHANNEL = "durable_bots_ingress"  # payload: the partition
WORKERS_CHANNEL = "durable_bots_workers"  # payload: the holder that joined, left or started draining

NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

# Sent after the puts, in a transaction of its own (see `_postgres_wake`): one NOTIFY per partition.
WAKE_INGRESS = f"SELECT pg_notify('{INGRESS_CHANNEL}', p::text) FROM unnest($1::int[]) AS p"
PENDING_INGRESS = """
SELECT id, partition, kind, key, payload, created_at FROM ingress
WHERE partition = ANY($1::int[]) AND finished_at IS NULL ORDER BY id LIMIT $2
"""
FINISH_INGRESS = (
    f"UPDATE ingress SET finished_at = {NOW_MS} WHERE id = ANY($1::bigint[]) AND finished_at IS NULL"
)
# A record whose event was refused (a click the gate's owner turned down): gone at once, so its key is free for
# the next click of the same person.
DROP_INGRESS = "DELETE FROM ingress WHERE id = ANY($1::bigint[])"
# Only finished records, and only old ones: a key must outlive the platform's redeliveries of its event.
PRUNE_INGRESS = f"DELETE FROM ingress WHERE finished_at IS NOT NULL AND finished_at < {NOW_MS} - $1"

# The CTE reads the row as it was before the upsert: a new row, a row that had expired (a worker back after
# a pause) or a change of `draining` is news for the other workers.
HEARTBEAT = f"""
WITH before AS (SELECT draining, expires_at > now() AS live FROM workers WHERE holder = $1)
INSERT INTO workers AS w (holder, pid, host, started_at, expires_at, draining)
VALUES ($1, $2, $3, {NOW_MS}, now() + make_interval(secs => $4), $5)
ON CONFLICT (holder) DO UPDATE SET expires_at = excluded.expires_at, draining = excluded.draining,
    started_at = CASE WHEN w.expires_at > now() THEN w.started_at ELSE excluded.started_at END
RETURNING (SELECT count(*) FROM before WHERE live AND draining = $5) = 0
"""
LIVE_WORKERS = """
SELECT holder, pid, host, started_at, draining FROM workers WHERE expires_at > now() ORDER BY holder
"""
LEAVE = "DELETE FROM workers WHERE holder = $1"


@dataclass(frozen=True)
class IngressRecord:
    """An event taken in by some worker, waiting for (or done by) its partition's owner."""

    id: int
    partition: int
    kind: str
    key: str
    payload: dict[str, Any]
    created_ms: int


@dataclass(frozen=True)
class WorkerInfo:
    """A live worker (its row has not expired)."""

    holder: str
    pid: int | None
    host: str | None
    started_ms: int
    draining: bool


# A key or kind is an id (a platform message id is well under 100 bytes). The cap keeps the unique index's
# row small: PostgreSQL refuses an index row over a few kB with an error that names no key.
MAX_KEY_BYTES = 512


def check_ingress_text(name: str, value: object) -> None:
    """Refuse a kind or key that is not short, non-empty, printable text (`StorageRequestError`, quoting at
    most the start of it)."""
    if type(value) is not str or not value or not value.isprintable():  # NUL and lone surrogates included
        raise StorageRequestError(f"ingress {name} must be non-empty printable text, not {_preview(value)}")
    size = len(value.encode("utf-8"))
    if size > MAX_KEY_BYTES:
        raise StorageRequestError(
            f"ingress {name} is {len(value)} characters ({size} bytes of UTF-8), more than the "
            f"{MAX_KEY_BYTES} bytes allowed: {_preview(value)}"
        )


def _preview(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}... ({len(text)} characters)"


def ingress_payload_text(key: str, payload: dict[str, Any]) -> str:
    """The payload as stored, or `StrictJsonError` naming the key and the offending path."""
    if type(payload) is not dict:
        raise StrictJsonError(
            f"ingress payload for key {_preview(key)} must be a JSON object, not {type(payload).__name__}"
        )
    clean = clean_json(payload, f"ingress payload for key {_preview(key)}")
    return json.dumps(clean, ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def ingress_from_row(row: Any) -> IngressRecord:
    return IngressRecord(
        id=int(row[0]),
        partition=int(row[1]),
        kind=str(row[2]),
        key=str(row[3]),
        payload=json.loads(row[4]),
        created_ms=int(row[5]),
    )


def worker_from_row(row: Any) -> WorkerInfo:
    return WorkerInfo(
        holder=str(row[0]), pid=row[1], host=row[2], started_ms=int(row[3]), draining=bool(row[4])
    )
