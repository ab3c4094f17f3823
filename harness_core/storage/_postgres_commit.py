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

A retire of a document that exists nowhere fails the whole statement (a cast of the refusal to integer; the
caller turns it into `StorageError`), as the transaction rolled back.
"""

from __future__ import annotations

from typing import Any

from harness_core.storage._sql_plan import CommitPlan

UNKNOWN_RETIRE = "durable-bots: commit retires an unknown document"

_FENCED = "(SELECT epoch FROM fence) = $3"

# $1 partition, $2 holder, $3 epoch; then one array per column of each table's rows.
COMMIT_ONE = f"""WITH fence AS (
    SELECT epoch FROM leases WHERE partition = $1 AND holder = $2 FOR SHARE
), conversations_in AS (
    INSERT INTO conversations (id, owner_task_id, record, partition)
    SELECT r.*, $1 FROM unnest($4::bigint[], $5::bigint[], $6::bytea[]) AS r WHERE {_FENCED}
), entries_in AS (
    INSERT INTO entries (id, conversation_id, head, record, partition)
    SELECT r.*, $1 FROM unnest($7::bigint[], $8::bigint[], $9::bigint[], $10::bytea[]) AS r WHERE {_FENCED}
), tasks_in AS (
    INSERT INTO tasks (id, conversation_id, kind, live, record, partition)
    SELECT r.*, $1 FROM unnest($11::bigint[], $12::bigint[], $13::text[], $14::boolean[], $15::bytea[]) AS r
    WHERE {_FENCED}
    ON CONFLICT (id) DO UPDATE SET conversation_id = excluded.conversation_id, kind = excluded.kind,
    live = excluded.live, record = excluded.record
), submissions_in AS (
    INSERT INTO submissions (id, conversation_id, request_id, status, record, partition)
    SELECT r.*, $1 FROM unnest($16::bigint[], $17::bigint[], $18::text[], $19::text[], $20::bytea[]) AS r
    WHERE {_FENCED}
    ON CONFLICT (id) DO UPDATE SET conversation_id = excluded.conversation_id,
    request_id = excluded.request_id, status = excluded.status, record = excluded.record
), docs_in AS (
    INSERT INTO doc_records (id, kind, scope, scope_id, key, rewindable, created_seq, retired_seq, record,
        partition)
    SELECT r.*, $1 FROM unnest($21::bigint[], $22::text[], $23::text[], $24::bigint[], $25::text[],
        $26::boolean[], $27::bigint[], $28::bigint[], $29::bytea[]) AS r WHERE {_FENCED}
), contents_in AS (
    INSERT INTO doc_contents (doc_id, seq, part, is_base, content)
    SELECT r.doc_id, r.seq, r.part, r.is_base, r.content
    FROM unnest($30::bigint[], $31::bigint[], $32::integer[], $33::boolean[], $34::bytea[], $35::boolean[],
        $36::boolean[]) AS r(doc_id, seq, part, is_base, content, reclaimable, rewindable_here)
    WHERE {_FENCED} AND (NOT r.reclaimable
        OR coalesce((SELECT d.rewindable FROM doc_records d WHERE d.id = r.doc_id), r.rewindable_here))
), retired AS (
    UPDATE doc_records d SET retired_seq = r.seq FROM unnest($37::bigint[], $38::bigint[]) AS r(id, seq)
    WHERE d.id = r.id AND {_FENCED}
    RETURNING d.id
), reclaimed AS (
    DELETE FROM doc_contents c USING doc_records d
    WHERE c.doc_id = ANY($39::bigint[]) AND d.id = c.doc_id AND NOT d.rewindable AND {_FENCED}
    AND (c.doc_id = ANY($37::bigint[]) OR EXISTS (
        SELECT FROM unnest($40::bigint[], $41::bigint[], $42::integer[]) AS b(doc_id, seq, part)
        WHERE b.doc_id = c.doc_id AND (c.seq, c.part) < (b.seq, b.part)))
), meta_in AS (
    UPDATE meta SET next_id = GREATEST(next_id, $43), last_seq = GREATEST(last_seq, $44)
    WHERE partition = $1 AND $43::bigint IS NOT NULL AND {_FENCED}
)
SELECT (SELECT epoch FROM fence) AS epoch,
    (CASE WHEN (SELECT epoch FROM fence) IS DISTINCT FROM $3
        OR (SELECT count(*) FROM retired) = cardinality($37::bigint[]) THEN NULL
        ELSE '{UNKNOWN_RETIRE}' END)::integer AS refused"""


def _last_per_id(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    if len(rows) < 2:
        return rows
    return list({row[0]: row for row in rows}.values())


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


def one_statement_args(plan: CommitPlan, partition: int, holder: str, epoch: int) -> list[Any]:
    """The parameters of `COMMIT_ONE` for `plan` (see the module's docstring for what is worked out here)."""
    retired_at = {doc_id: seq for seq, doc_id in plan.retires}  # a document retired twice: the last seq
    created_rewindable = {row[0]: row[5] for row in plan.docs}
    docs = [(*row[:7], retired_at[row[0]], row[8]) if row[0] in retired_at else row for row in plan.docs]
    stored_retires = {doc_id: seq for doc_id, seq in retired_at.items() if doc_id not in created_rewindable}
    newest_base: dict[int, tuple[int, int]] = {}
    for doc_id, seq, part in plan.bases:
        newest_base[doc_id] = max(newest_base.get(doc_id, (seq, part)), (seq, part))
    contents = [
        (
            *row,
            row[0] in retired_at or (row[0] in newest_base and (row[1], row[2]) < newest_base[row[0]]),
            created_rewindable.get(row[0]),
        )
        for row in plan.contents
    ]
    reserve = plan.reserve
    return [
        partition,
        holder,
        epoch,
        *_columns(plan.conversations, 3),
        *_columns(plan.entries, 4),
        *_columns(_last_per_id(plan.tasks), 5),
        *_columns(_last_per_id(plan.submissions), 5),
        *_columns(docs, 9),
        *_columns(contents, 7),
        list(stored_retires),
        list(stored_retires.values()),
        sorted({doc_id for doc_id, _, _ in plan.bases} | stored_retires.keys()),
        *_columns(plan.bases, 3),
        reserve[0] if reserve is not None else None,
        reserve[1] if reserve is not None else None,
    ]
