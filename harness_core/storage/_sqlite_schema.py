"""The SQLite schema as ordered, versioned migrations (`PRAGMA user_version` holds the applied version).

Append new steps at the end and never edit a released one: a store opened by a newer build migrates forward
one step per transaction, and a store whose version is newer than this build knows is refused.
Records are stored whole as JSON text; the other columns exist only to be indexed.
"""

from __future__ import annotations

import sqlite3

from harness_core.errors import StorageError

# Step 1: the record tables. Step 2: the secondary indexes the hot reads use.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        1,
        (
            """CREATE TABLE meta (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                next_id INTEGER NOT NULL,
                last_seq INTEGER NOT NULL
            )""",
            "INSERT INTO meta (id, next_id, last_seq) VALUES (1, 1, 0)",
            """CREATE TABLE conversations (
                id INTEGER PRIMARY KEY,
                owner_task_id INTEGER,
                record TEXT NOT NULL
            )""",
            """CREATE TABLE entries (
                id INTEGER PRIMARY KEY,
                conversation_id INTEGER NOT NULL,
                head INTEGER,
                record TEXT NOT NULL
            )""",
            """CREATE TABLE tasks (
                id INTEGER PRIMARY KEY,
                conversation_id INTEGER NOT NULL,
                kind TEXT NOT NULL,
                live INTEGER NOT NULL,
                record TEXT NOT NULL
            )""",
            """CREATE TABLE submissions (
                id INTEGER PRIMARY KEY,
                conversation_id INTEGER NOT NULL,
                request_id TEXT,
                status TEXT NOT NULL,
                record TEXT NOT NULL,
                UNIQUE (conversation_id, request_id)
            )""",
            """CREATE TABLE doc_records (
                id INTEGER PRIMARY KEY,
                kind TEXT NOT NULL,
                scope TEXT NOT NULL,
                scope_id INTEGER,
                key TEXT,
                rewindable INTEGER NOT NULL,
                created_seq INTEGER NOT NULL,
                retired_seq INTEGER,
                record TEXT NOT NULL
            )""",
            # `part` orders several revisions of one document written by the same commit (a fork's copy and
            # a change to it, say), so (doc_id, seq, part) is the revision order.
            """CREATE TABLE doc_contents (
                doc_id INTEGER NOT NULL REFERENCES doc_records (id),
                seq INTEGER NOT NULL,
                part INTEGER NOT NULL,
                is_base INTEGER NOT NULL,
                content TEXT NOT NULL,
                PRIMARY KEY (doc_id, seq, part)
            ) WITHOUT ROWID""",
        ),
    ),
    (
        2,
        (
            "CREATE INDEX conversations_by_owner ON conversations (owner_task_id, id)",
            "CREATE INDEX entries_by_conversation ON entries (conversation_id, id)",
            # Only head markers: latest_head is one index seek however long the conversation is.
            "CREATE INDEX entries_heads ON entries (conversation_id, id) WHERE head IS NOT NULL",
            "CREATE INDEX tasks_by_live ON tasks (live, id)",
            "CREATE INDEX tasks_by_conversation ON tasks (conversation_id, id)",
            "CREATE INDEX tasks_by_kind ON tasks (kind, id)",
            "CREATE INDEX submissions_by_conversation ON submissions (conversation_id, id)",
            "CREATE INDEX submissions_by_status ON submissions (status, id)",
            "CREATE INDEX doc_records_by_address ON doc_records (kind, scope, scope_id, key, id)",
            "CREATE INDEX doc_records_by_scope ON doc_records (scope, scope_id, id)",
            # Finding the newest base at or before a seq skips the delta tail of long rewindable histories.
            "CREATE INDEX doc_contents_bases ON doc_contents (doc_id, seq, part) WHERE is_base = 1",
        ),
    ),
)

SCHEMA_VERSION = MIGRATIONS[-1][0]


def migrate(conn: sqlite3.Connection, path: str, *, upto: int = SCHEMA_VERSION) -> int:
    """Apply every step newer than the stored version, up to `upto`; return the version before migrating."""
    (current,) = conn.execute("PRAGMA user_version").fetchone()
    if current > SCHEMA_VERSION:
        raise StorageError(
            f"storage {path} has schema version {current}, newer than this build knows ({SCHEMA_VERSION}); "
            "upgrade durable-bots"
        )
    for version, statements in MIGRATIONS:
        if version <= current or version > upto:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in statements:
                conn.execute(statement)
            # user_version lives in the database header, so it commits or rolls back with the step.
            conn.execute(f"PRAGMA user_version = {version:d}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # some errors (disk full, I/O) already rolled back
                conn.execute("ROLLBACK")
            raise
    return int(current)
