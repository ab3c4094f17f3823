"""A commit in one round trip: the fence and every row of the plan as one statement (data-modifying CTEs).

Sent as a transaction (BEGIN, the fence, one `executemany` per table, the retires, COMMIT) a commit costs five
to seven round trips; under load each is a wake-up of the server's backend and of this process, and the
commit's latency is their sum (an event is acknowledged only after its commit). One statement is one implicit
transaction: the fence is read with `FOR SHARE`, every change is guarded by it, and the returned epoch tells a
fenced-out writer that nothing was written, as before.

The sub-statements of one statement see the same snapshot, not each other's rows, so what a sequence of
statements would have done to rows of the same commit is worked out here, before sending:

- a task or submission changed by several batches is sent once, its last version (as sequential upserts
  would leave it);
- a document created and retired in the same commit is inserted retired; only stored documents are updated;
- a revision older than a base revision of the same commit, or of a document the commit retires, is
  reclaimable: it is not inserted unless its document keeps its history (`rewindable`, read from the stored
  document, else from the one this commit creates), as the reclaim after the insert would have deleted it;
  stored revisions are reclaimed by one DELETE, for the documents named.

Ingress records a commit took in (`ingress_finished`) are marked finished by the same statement, fenced like the
rest: a record is finished exactly when what it brought is stored.

A retire of a document that exists nowhere fails the whole statement (a cast of the refusal to integer; the
caller turns it into `StorageError`), as the transaction rolled back.
"""

from __future__ import annotations

from typing import Any

from harness_core.storage._postgres_ingress import NOW_MS
from harness_core.storage._sql_plan import CommitPlan

UNKNOWN_RETIRE = "durable-bots: commit retires an unknown document"

_FENCED = "(SELECT epoch FROM fence) = $3"
_FENCE = "fence AS (SELECT epoch FROM leases WHERE partition = $1 AND holder = $2 FOR SHARE)"


class _Statement:
    """The statement's text and parameters, built part by part: only the tables a commit writes appear in it
    (an empty part would still open and lock its table and indexes: measured, that cost the server more
    than it saved). $1 partition, $2 holder, $3 epoch."""

    def __init__(self, partition: int, holder: str, epoch: int) -> None:
        self.args: list[Any] = [partition, holder, epoch]
        self.parts = [_FENCE]

    def param(self, value: Any, sql_type: str) -> str:
        self.args.append(value)
        return f"${len(self.args)}::{sql_type}"

    def unnest(self, rows: list[tuple[Any, ...]], types: tuple[str, ...]) -> str:
        columns = zip(*rows, strict=True)
        return (
            "unnest("
            + ", ".join(self.param(list(c), f"{t}[]") for c, t in zip(columns, types, strict=True))
            + ")"
        )

    def insert(
        self,
        name: str,
        table: str,
        columns: str,
        rows: list[tuple[Any, ...]],
        types: tuple[str, ...],
        tail: str = "",
    ) -> None:
        if rows:
            self.parts.append(
                f"{name} AS (INSERT INTO {table} ({columns}, partition) SELECT r.*, $1 FROM "
                f"{self.unnest(rows, types)} AS r WHERE {_FENCED}{tail})"
            )

    def text(self, final: str) -> str:
        return "WITH " + ",\n".join(self.parts) + "\n" + final


_UPSERT_TASK = (
    " ON CONFLICT (id) DO UPDATE SET conversation_id = excluded.conversation_id, kind = excluded.kind, "
    "live = excluded.live, record = excluded.record"
)
_UPSERT_SUBMISSION = (
    " ON CONFLICT (id) DO UPDATE SET conversation_id = excluded.conversation_id, "
    "request_id = excluded.request_id, status = excluded.status, record = excluded.record"
)


def _last_per_id(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    if len(rows) < 2:
        return rows
    return list({row[0]: row for row in rows}.values())


def commit_statement(plan: CommitPlan, partition: int, holder: str, epoch: int) -> tuple[str, list[Any]]:
    """The statement for `plan` and its parameters (see the module's docstring for what is worked out here).
    Its one row: `epoch` (the fence; not this writer's: nothing was written), `refused` (always NULL) and
    `ours` (the epoch this writer holds: a commit of no rows still names all three fixed parameters)."""
    retired_at = {doc_id: seq for seq, doc_id in plan.retires}  # a document retired twice: the last seq
    created_rewindable = {row[0]: row[5] for row in plan.docs}
    stored_retires = {doc_id: seq for doc_id, seq in retired_at.items() if doc_id not in created_rewindable}
    newest_base: dict[int, tuple[int, int]] = {}
    for doc_id, seq, part in plan.bases:
        newest_base[doc_id] = max(newest_base.get(doc_id, (seq, part)), (seq, part))

    st = _Statement(partition, holder, epoch)
    st.insert(
        "conversations_in",
        "conversations",
        "id, owner_task_id, record",
        plan.conversations,
        ("bigint", "bigint", "bytea"),
    )
    st.insert(
        "entries_in",
        "entries",
        "id, conversation_id, head, record",
        plan.entries,
        ("bigint", "bigint", "bigint", "bytea"),
    )
    st.insert(
        "tasks_in",
        "tasks",
        "id, conversation_id, kind, live, record",
        _last_per_id(plan.tasks),
        ("bigint", "bigint", "text", "boolean", "bytea"),
        _UPSERT_TASK,
    )
    st.insert(
        "submissions_in",
        "submissions",
        "id, conversation_id, request_id, status, record",
        _last_per_id(plan.submissions),
        ("bigint", "bigint", "text", "text", "bytea"),
        _UPSERT_SUBMISSION,
    )
    docs = [(*row[:7], retired_at[row[0]], row[8]) if row[0] in retired_at else row for row in plan.docs]
    st.insert(
        "docs_in",
        "doc_records",
        "id, kind, scope, scope_id, key, rewindable, created_seq, retired_seq, record",
        docs,
        ("bigint", "text", "text", "bigint", "text", "boolean", "bigint", "bigint", "bytea"),
    )
    if plan.contents:
        contents = [
            (
                *row,
                row[0] in retired_at or (row[0] in newest_base and (row[1], row[2]) < newest_base[row[0]]),
                created_rewindable.get(row[0]),
            )
            for row in plan.contents
        ]
        rows = st.unnest(contents, ("bigint", "bigint", "integer", "boolean", "bytea", "boolean", "boolean"))
        st.parts.append(
            "contents_in AS (INSERT INTO doc_contents (doc_id, seq, part, is_base, content) "
            "SELECT r.doc_id, r.seq, r.part, r.is_base, r.content "
            f"FROM {rows} AS r(doc_id, seq, part, is_base, content, reclaimable, rewindable_here) "
            f"WHERE {_FENCED} AND (NOT r.reclaimable "
            "OR coalesce((SELECT d.rewindable FROM doc_records d WHERE d.id = r.doc_id), r.rewindable_here)))"
        )
    refused = "NULL"
    reclaim: list[str] = []
    if stored_retires:
        ids = st.param(list(stored_retires), "bigint[]")
        seqs = st.param(list(stored_retires.values()), "bigint[]")
        st.parts.append(
            f"retired AS (UPDATE doc_records d SET retired_seq = r.seq FROM unnest({ids}, {seqs}) AS r(id, seq) "
            f"WHERE d.id = r.id AND {_FENCED} RETURNING d.id)"
        )
        # A cast PostgreSQL refuses at run time (a constant would be refused while planning): the statement fails.
        refused = (
            f"(CASE WHEN (SELECT epoch FROM fence) IS DISTINCT FROM $3 OR (SELECT count(*) FROM retired) = "
            f"cardinality({ids}) THEN NULL ELSE '{UNKNOWN_RETIRE}' END)"
        )
        reclaim.append(f"c.doc_id = ANY({ids})")
    if plan.bases:
        bases = st.unnest(plan.bases, ("bigint", "bigint", "integer"))
        reclaim.append(
            f"EXISTS (SELECT FROM {bases} AS b(doc_id, seq, part) "
            "WHERE b.doc_id = c.doc_id AND (c.seq, c.part) < (b.seq, b.part))"
        )
    if reclaim:
        named = st.param(sorted(newest_base.keys() | stored_retires.keys()), "bigint[]")
        st.parts.append(
            f"reclaimed AS (DELETE FROM doc_contents c USING doc_records d WHERE c.doc_id = ANY({named}) "
            f"AND d.id = c.doc_id AND NOT d.rewindable AND {_FENCED} AND ({' OR '.join(reclaim)}))"
        )
    if plan.ingress_finished:
        # Only this partition's records, only unfinished ones (finishing twice keeps the first time).
        records = st.param(sorted(set(plan.ingress_finished)), "bigint[]")
        st.parts.append(
            f"ingress_done AS (UPDATE ingress SET finished_at = {NOW_MS} WHERE id = ANY({records}) "
            f"AND partition = $1 AND finished_at IS NULL AND {_FENCED})"
        )
    if plan.reserve is not None:
        next_id, last_seq = (st.param(value, "bigint") for value in plan.reserve)
        st.parts.append(
            f"meta_in AS (UPDATE meta SET next_id = GREATEST(next_id, {next_id}), "
            f"last_seq = GREATEST(last_seq, {last_seq}) WHERE partition = $1 AND {_FENCED})"
        )
    return st.text(
        f"SELECT (SELECT epoch FROM fence) AS epoch, {refused}::integer AS refused, $3::bigint AS ours"
    ), st.args
