"""The PostgreSQL schema as ordered, versioned migrations (table `schema_version` holds the applied version).

Append new steps at the end and never edit a released one. Each step runs in its own transaction under an
advisory lock, so two processes opening a fresh database at once migrate it once. A database whose version is
newer than this build knows is refused.

Records are stored whole as the UTF-8 bytes of their JSON (`bytea`), not `jsonb`: measured on this harness's
records (`python -m benchmarks postgres`, benchmarks/RESULTS.md) bytea inserts faster and takes less room, and jsonb would
refuse strings holding U+0000 (valid strict JSON) and reorder object keys, so a reopened context would not be
byte-identical to the one the model saw. The other columns exist only to be indexed.

Every row carries its `partition` (§9 of the design). Version 3 records the store's partition count (fixed
when the store is created; a store that already held data is one partition), and adds the store-wide tables of
many workers: `ingress` (platform events taken in by any worker, for the partition's owner) and `workers`
(who is alive, for balancing). Leases of partitions have ids >= 0; other resources (a Discord shard) use
negative ids in the same table. Version 4 indexes the operator requests still to carry out (taken ones too).
"""

from __future__ import annotations

import asyncpg

from harness_core.errors import StorageError

# Advisory lock key for migrations (any constant; "dbots" in ASCII).
MIGRATION_LOCK = 0x64626F7473

MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        1,
        (
            # Ids and seqs are minted by the partition's lease holder from here, reserved in blocks: a new
            # holder starts above the reservation, so nothing stored is ever minted twice.
            """CREATE TABLE meta (
                partition INTEGER PRIMARY KEY,
                next_id BIGINT NOT NULL,
                last_seq BIGINT NOT NULL
            )""",
            "INSERT INTO meta (partition, next_id, last_seq) VALUES (0, 1, 0)",
            # One owner per partition. `epoch` grows on every takeover; each commit checks it in its own
            # transaction (fencing). `holder` is NULL after a graceful release.
            """CREATE TABLE leases (
                partition INTEGER PRIMARY KEY,
                holder TEXT,
                pid INTEGER,
                host TEXT,
                epoch BIGINT NOT NULL,
                acquired_at TIMESTAMPTZ NOT NULL,
                expires_at TIMESTAMPTZ NOT NULL
            )""",
            """CREATE TABLE conversations (
                id BIGINT PRIMARY KEY,
                partition INTEGER NOT NULL,
                owner_task_id BIGINT,
                record BYTEA NOT NULL
            )""",
            """CREATE TABLE entries (
                id BIGINT PRIMARY KEY,
                partition INTEGER NOT NULL,
                conversation_id BIGINT NOT NULL,
                head BIGINT,
                record BYTEA NOT NULL
            )""",
            """CREATE TABLE tasks (
                id BIGINT PRIMARY KEY,
                partition INTEGER NOT NULL,
                conversation_id BIGINT NOT NULL,
                kind TEXT NOT NULL,
                live BOOLEAN NOT NULL,
                record BYTEA NOT NULL
            )""",
            """CREATE TABLE submissions (
                id BIGINT PRIMARY KEY,
                partition INTEGER NOT NULL,
                conversation_id BIGINT NOT NULL,
                request_id TEXT,
                status TEXT NOT NULL,
                record BYTEA NOT NULL,
                UNIQUE (conversation_id, request_id)
            )""",
            """CREATE TABLE doc_records (
                id BIGINT PRIMARY KEY,
                partition INTEGER NOT NULL,
                kind TEXT NOT NULL,
                scope TEXT NOT NULL,
                scope_id BIGINT,
                key TEXT,
                rewindable BOOLEAN NOT NULL,
                created_seq BIGINT NOT NULL,
                retired_seq BIGINT,
                record BYTEA NOT NULL
            )""",
            # `part` orders several revisions of one document written by the same commit.
            """CREATE TABLE doc_contents (
                doc_id BIGINT NOT NULL REFERENCES doc_records (id),
                seq BIGINT NOT NULL,
                part INTEGER NOT NULL,
                is_base BOOLEAN NOT NULL,
                content BYTEA NOT NULL,
                PRIMARY KEY (doc_id, seq, part)
            )""",
            "CREATE INDEX conversations_by_owner ON conversations (owner_task_id, id)",
            "CREATE INDEX entries_by_conversation ON entries (conversation_id, id)",
            "CREATE INDEX entries_heads ON entries (conversation_id, id) WHERE head IS NOT NULL",
            "CREATE INDEX tasks_by_live ON tasks (live, id)",
            "CREATE INDEX tasks_by_conversation ON tasks (conversation_id, id)",
            "CREATE INDEX tasks_by_kind ON tasks (kind, id)",
            "CREATE INDEX submissions_by_conversation ON submissions (conversation_id, id)",
            "CREATE INDEX submissions_by_status ON submissions (status, id)",
            "CREATE INDEX doc_records_by_address ON doc_records (kind, scope, scope_id, key, id)",
            "CREATE INDEX doc_records_by_scope ON doc_records (scope, scope_id, id)",
            "CREATE INDEX doc_contents_bases ON doc_contents (doc_id, seq, part) WHERE is_base",
        ),
    ),
    (
        2,
        (
            # Operator requests (see `_postgres_requests`): written by operator commands without the lease,
            # carried out and answered by the partition's leader. Never part of a harness commit.
            """CREATE TABLE operator_requests (
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                partition INTEGER NOT NULL,
                kind TEXT NOT NULL,
                args TEXT NOT NULL,
                status TEXT NOT NULL,
                outcome TEXT,
                created_at BIGINT NOT NULL,
                finished_at BIGINT
            )""",
            "CREATE INDEX operator_requests_pending ON operator_requests (partition, id) WHERE status = 'pending'",
        ),
    ),
    (
        3,
        (
            # The partition count, written by the first open that names one (`PostgresStore.open`); a store
            # that already holds data was written by one process as partition 0: it is one partition.
            """CREATE TABLE store_shape (
                one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
                partitions INTEGER NOT NULL CHECK (partitions >= 1)
            )""",
            """INSERT INTO store_shape (partitions) SELECT 1
                WHERE EXISTS (SELECT 1 FROM meta WHERE next_id > 1 OR last_seq > 0)
                   OR EXISTS (SELECT 1 FROM conversations)
                   OR EXISTS (SELECT 1 FROM operator_requests)""",
            # An untouched store: each partition's meta row is written by its first open (its first id).
            "DELETE FROM meta WHERE NOT EXISTS (SELECT 1 FROM store_shape)",
            # Exactly once across workers: `key` (a platform message id) is unique over the whole store.
            # `payload` is strict JSON text (ASCII-escaped, so U+0000 and every code point fit `text`).
            """CREATE TABLE ingress (
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                key TEXT NOT NULL UNIQUE,
                partition INTEGER NOT NULL,
                kind TEXT NOT NULL,
                payload TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                finished_at BIGINT
            )""",
            "CREATE INDEX ingress_pending ON ingress (partition, id) WHERE finished_at IS NULL",
            """CREATE TABLE workers (
                holder TEXT PRIMARY KEY,
                pid INTEGER,
                host TEXT,
                started_at BIGINT NOT NULL,
                expires_at TIMESTAMPTZ NOT NULL,
                draining BOOLEAN NOT NULL DEFAULT FALSE
            )""",
            # Recovery scans of one partition (live tasks, submissions by status, global documents).
            "CREATE INDEX tasks_by_partition ON tasks (partition, live, id)",
            "CREATE INDEX submissions_by_partition ON submissions (partition, status, id)",
            "CREATE INDEX conversations_by_partition ON conversations (partition, id)",
            "CREATE INDEX doc_records_by_partition ON doc_records (partition, scope, scope_id, id)",
        ),
    ),
    (
        4,
        (
            # Workers look for requests to carry out twice a second (`status IN ('pending', 'taken')`): the
            # index of version 2 covered only 'pending', so each look read the whole table (200,000 finished
            # requests: 21 ms a look). This one serves those looks whatever the table holds.
            "CREATE INDEX operator_requests_open ON operator_requests (partition, id) "
            "WHERE status IN ('pending', 'taken')",
            "DROP INDEX IF EXISTS operator_requests_pending",
        ),
    ),
)

SCHEMA_VERSION = MIGRATIONS[-1][0]


async def stored_version(conn: asyncpg.Connection) -> int | None:
    """The applied version, or None for a database this harness never touched."""
    exists = await conn.fetchval("SELECT to_regclass('schema_version') IS NOT NULL")
    if not exists:
        return None
    version = await conn.fetchval("SELECT version FROM schema_version")
    return None if version is None else int(version)


async def migrate(conn: asyncpg.Connection, description: str, *, upto: int = SCHEMA_VERSION) -> int:
    """Apply every step newer than the stored version, up to `upto`; return the version before migrating."""
    stored = await stored_version(conn)
    if stored is not None:
        _refuse_newer(stored, description)
        if stored >= upto:
            # Nothing to apply: no lock and no DDL, so a role that may only read and write the tables (they
            # were created by another role) opens the store too.
            return stored
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
    try:
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version (one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), "
                "version INTEGER NOT NULL)"
            )
        except asyncpg.InsufficientPrivilegeError as exc:
            raise StorageError(
                f"storage {description}: its schema needs creating or upgrading (version {stored or 0} of "
                f"{SCHEMA_VERSION}), which this role may not do ({exc}); open it once as a role that may create "
                "tables in the schema (its owner); after that this role needs only SELECT, INSERT, UPDATE and DELETE on "
                "the tables and USAGE on their sequences"
            ) from None
        await conn.execute("INSERT INTO schema_version (version) VALUES (0) ON CONFLICT DO NOTHING")
        current = int(await conn.fetchval("SELECT version FROM schema_version"))
        _refuse_newer(current, description)
        for version, statements in MIGRATIONS:
            if version <= current or version > upto:
                continue
            async with conn.transaction():
                for statement in statements:
                    await conn.execute(statement)
                await conn.execute("UPDATE schema_version SET version = $1", version)
        return current
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)


def _refuse_newer(version: int, description: str) -> None:
    if version > SCHEMA_VERSION:
        raise StorageError(
            f"storage {description} has schema version {version}, newer than this build knows "
            f"({SCHEMA_VERSION}); upgrade durable-bots"
        )


async def store_partitions(conn: asyncpg.Connection, description: str, partitions: int | None) -> int:
    """The store's partition count: recorded by the first open that names one (`partitions`); a later open
    naming another count is refused (the count is fixed: ids and places are spread by it)."""
    if partitions is not None:
        await conn.execute(
            "INSERT INTO store_shape (partitions) VALUES ($1) ON CONFLICT DO NOTHING", partitions
        )
    stored = await conn.fetchval("SELECT partitions FROM store_shape")
    if stored is None:
        return 1  # nothing recorded yet and nobody asked: a read-only look at a fresh store
    if partitions is not None and int(stored) != partitions:
        raise StorageError(
            f"storage {description} has {stored} partitions, not {partitions} as configured: the count is "
            f"fixed when a store is created; set [storage] partitions = {stored} (or use a new database)"
        )
    return int(stored)
