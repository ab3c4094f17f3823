"""A commit in one round trip: the fence and every row of the plan as one statement (data-modifying CTEs).

The plain way (BEGIN, the fence, one `executemany` per table, COMMIT) costs five to seven round trips; under
load each is a wake-up of the server's backend and of this process, and the commit's latency is their sum
(an event is acknowledged only after its commit). One statement is one implicit transaction: the fence is
read with `FOR SHARE` and every insert is guarded by it, so a fenced-out writer writes nothing and learns so
from the returned epoch, as before.

Sibling sub-statements of one statement see the same snapshot, not each other's rows, so a plan is sent this
way only when no part of it needs to see another (`fits_one_statement`): no retires (they update documents
the same commit may create), and no base revision with an older revision of the same document in the same
commit (its reclaim deletes older revisions). Rows upserted twice in one plan (a task or submission changed by
two batches) are sent once, the last version, as the sequential upserts would leave them. Everything else
goes the plain way (`_postgres.PostgresStorage._write`).
"""

from __future__ import annotations

from typing import Any

from harness_core.storage._sql_plan import CommitPlan

_GUARD = "WHERE (SELECT epoch FROM fence) = $3"

# $1 partition, $2 holder, $3 epoch; then one array per column of each table's rows.
COMMIT_ONE = f"""WITH fence AS (
    SELECT epoch FROM leases WHERE partition = $1 AND holder = $2 FOR SHARE
), conversations_in AS (
    INSERT INTO conversations (id, owner_task_id, record, partition)
    SELECT r.*, $1 FROM unnest($4::bigint[], $5::bigint[], $6::bytea[]) AS r {_GUARD}
), entries_in AS (
    INSERT INTO entries (id, conversation_id, head, record, partition)
    SELECT r.*, $1 FROM unnest($7::bigint[], $8::bigint[], $9::bigint[], $10::bytea[]) AS r {_GUARD}
), tasks_in AS (
    INSERT INTO tasks (id, conversation_id, kind, live, record, partition)
    SELECT r.*, $1 FROM unnest($11::bigint[], $12::bigint[], $13::text[], $14::boolean[], $15::bytea[]) AS r
    {_GUARD}
    ON CONFLICT (id) DO UPDATE SET conversation_id = excluded.conversation_id, kind = excluded.kind,
    live = excluded.live, record = excluded.record
), submissions_in AS (
    INSERT INTO submissions (id, conversation_id, request_id, status, record, partition)
    SELECT r.*, $1 FROM unnest($16::bigint[], $17::bigint[], $18::text[], $19::text[], $20::bytea[]) AS r
    {_GUARD}
    ON CONFLICT (id) DO UPDATE SET conversation_id = excluded.conversation_id,
    request_id = excluded.request_id, status = excluded.status, record = excluded.record
), docs_in AS (
    INSERT INTO doc_records (id, kind, scope, scope_id, key, rewindable, created_seq, retired_seq, record,
        partition)
    SELECT r.*, $1 FROM unnest($21::bigint[], $22::text[], $23::text[], $24::bigint[], $25::text[],
        $26::boolean[], $27::bigint[], $28::bigint[], $29::bytea[]) AS r {_GUARD}
), contents_in AS (
    INSERT INTO doc_contents (doc_id, seq, part, is_base, content)
    SELECT * FROM unnest($30::bigint[], $31::bigint[], $32::integer[], $33::boolean[], $34::bytea[]) {_GUARD}
), reclaimed AS (
    DELETE FROM doc_contents c USING unnest($35::bigint[], $36::bigint[], $37::integer[]) AS b(doc_id, seq, part)
    WHERE c.doc_id = b.doc_id AND (c.seq, c.part) < (b.seq, b.part)
    AND NOT (SELECT rewindable FROM doc_records WHERE id = b.doc_id)
    AND (SELECT epoch FROM fence) = $3
), meta_in AS (
    UPDATE meta SET next_id = GREATEST(next_id, $38), last_seq = GREATEST(last_seq, $39)
    WHERE partition = $1 AND $38::bigint IS NOT NULL AND (SELECT epoch FROM fence) = $3
)
SELECT epoch FROM fence"""


def fits_one_statement(plan: CommitPlan) -> bool:
    """Whether `plan` means the same sent as `COMMIT_ONE` (see the module's docstring)."""
    if plan.retires:
        return False
    for doc_id, seq, part in plan.bases:
        if any(row[0] == doc_id and (row[1], row[2]) < (seq, part) for row in plan.contents):
            return False
    return True


def _last_per_id(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    if len(rows) < 2:
        return rows
    return list({row[0]: row for row in rows}.values())


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


def one_statement_args(plan: CommitPlan, partition: int, holder: str, epoch: int) -> list[Any]:
    """The parameters of `COMMIT_ONE` for `plan` (which `fits_one_statement`)."""
    reserve = plan.reserve
    return [
        partition,
        holder,
        epoch,
        *_columns(plan.conversations, 3),
        *_columns(plan.entries, 4),
        *_columns(_last_per_id(plan.tasks), 5),
        *_columns(_last_per_id(plan.submissions), 5),
        *_columns(plan.docs, 9),
        *_columns(plan.contents, 5),
        *_columns(plan.bases, 3),
        reserve[0] if reserve is not None else None,
        reserve[1] if reserve is not None else None,
    ]
