"""Pieces every backend shares: materializing document revisions and paging cursors."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import jsonpatch

from harness_core.errors import StorageCorrupt, StorageRequestError
from harness_core.records import DocumentContent, DocumentRecord, DocumentValue
from harness_core.storage._protocol import Order


def materialize(
    record: DocumentRecord, contents: Iterable[DocumentContent], at_seq: int | None = None
) -> DocumentValue | None:
    """Replay the newest base and its delta tail (up to `at_seq` when given).

    `contents` must be in ascending seq order. Returns None when nothing is stored at or before `at_seq`.
    """
    chosen = [c for c in contents if at_seq is None or c.seq <= at_seq]
    if not chosen:
        if at_seq is None:
            raise StorageCorrupt(f"document {record.id} ({record.kind}) has no stored base")
        return None
    base_index = None
    for index in range(len(chosen) - 1, -1, -1):
        if chosen[index].is_base:
            base_index = index
            break
    if base_index is None:
        raise StorageCorrupt(f"document {record.id} ({record.kind}) has deltas but no base")
    base = chosen[base_index]
    value = copy.deepcopy(base.base)
    version = base.version
    tail = chosen[base_index + 1 :]
    for content in tail:
        if content.version != version:
            raise StorageCorrupt(
                f"document {record.id} ({record.kind}) changes version inside a delta tail at seq {content.seq}"
            )
        try:
            value = jsonpatch.apply_patch(value, content.delta or [], in_place=True)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, KeyError) as exc:
            raise StorageCorrupt(
                f"document {record.id} ({record.kind}) has a delta at seq {content.seq} that does not apply: {exc}"
            ) from exc
    return DocumentValue(record=record, version=version, value=value, deltas_since_base=len(tail))


def check_cursor(cursor: dict[str, Any] | None, order: Order, scan: str) -> tuple[Order, int | None]:
    """Validate a cursor for a scan; a cursor keeps its order and rejects the opposite one."""
    if cursor is None:
        return order, None
    if cursor.get("scan") != scan or cursor.get("order") not in ("asc", "desc") or "after" not in cursor:
        raise StorageRequestError(f"cursor {cursor!r} does not belong to a {scan} scan")
    cursor_order: Order = cursor["order"]
    if cursor_order != order:
        raise StorageRequestError(f"cursor is for order {cursor_order!r}, the scan asked for {order!r}")
    after = cursor["after"]
    if not isinstance(after, int):
        raise StorageRequestError(f"cursor {cursor!r} is malformed")
    return cursor_order, after


def make_cursor(scan: str, order: Order, last_id: int) -> dict[str, Any]:
    return {"scan": scan, "order": order, "after": last_id}
