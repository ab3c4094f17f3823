"""The JSONL backend: an append-only log in a directory, replayed into memory on open.

`main.jsonl` holds, per commit, the record lines of every batch followed by ONE commit marker:

    {"type":"batch","seq":7,"next_id":42}
    {"type":"entry","record":{...}}
    ...
    {"type":"commit","seqs":[7],"lines":3,"sha256":"<hex of the 3 record lines>"}

A commit exists exactly when its marker does. On open, lines after the last marker (a torn tail left by a
crash mid-append) are dropped and the file is truncated back to that marker; confirmed lines that do not match
their marker's count and checksum, or do not parse, refuse the open with `StorageCorrupt`. Reads are served
from a `MemoryStorage` index, so they have the reference semantics by construction.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness_core.errors import (
    StorageClosed,
    StorageCorrupt,
    StorageError,
    StorageRequestError,
    StrictJsonError,
)
from harness_core.records import (
    Conversation,
    DocScope,
    DocumentContent,
    DocumentRecord,
    DocumentValue,
    Entry,
    Page,
    Submission,
    SubmissionStatus,
    Task,
)
from harness_core.storage._lock import OwnerLock
from harness_core.storage._memory import MemoryStorage
from harness_core.storage._protocol import CommitBatch, DocChange, DocCreate, Order, StorageMeta

MAIN_FILE = "main.jsonl"
LOCK_FILE = ".lock"
_MARKER_PREFIX = b'{"type":"commit"'


def _line(kind: str, body: str) -> str:
    return f'{{"type":"{kind}",{body}}}\n'


def _encode(batches: Sequence[CommitBatch]) -> tuple[bytes, bytes]:
    """Serialize a commit before any I/O: the record lines, and the marker that confirms them."""
    lines: list[str] = []
    for batch in batches:
        lines.append(_line("batch", f'"seq":{int(batch.seq)},"next_id":{int(batch.next_id)}'))
        lines.extend(_line("conversation", f'"record":{c.model_dump_json()}') for c in batch.conversations)
        lines.extend(_line("entry", f'"record":{e.model_dump_json()}') for e in batch.entries)
        lines.extend(_line("task", f'"record":{t.model_dump_json()}') for t in batch.tasks)
        lines.extend(_line("submission", f'"record":{s.model_dump_json()}') for s in batch.submissions)
        for create in batch.doc_creates:
            content = DocumentContent(seq=batch.seq, version=create.version, base=create.value)
            body = f'"record":{create.record.model_dump_json()},"content":{content.model_dump_json()}'
            lines.append(_line("doc_create", body))
        for change in batch.doc_changes:
            lines.append(
                _line("doc_change", f'"id":{int(change.id)},"content":{change.content.model_dump_json()}')
            )
        lines.extend(_line("doc_retire", f'"id":{int(doc_id)}') for doc_id in batch.doc_retires)
    records = "".join(lines).encode("utf-8")
    marker = {
        "type": "commit",
        "seqs": [batch.seq for batch in batches],
        "lines": len(lines),
        "sha256": hashlib.sha256(records).hexdigest(),
    }
    return records, (json.dumps(marker, separators=(",", ":")) + "\n").encode("utf-8")


@dataclass
class _Replay:
    batches: list[CommitBatch]
    docs: set[int]
    confirmed_end: int  # byte offset just after the last commit marker
    size: int


class _Reader:
    """Replays `main.jsonl`: validates each commit against its marker and rebuilds the batches."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.batches: list[CommitBatch] = []
        self.docs: set[int] = set()
        self.last_seq = 0
        self.batch: CommitBatch | None = None  # the batch the next record line belongs to

    def corrupt(self, line: int, why: str) -> StorageCorrupt:
        return StorageCorrupt(f"storage {self.path} is corrupt at line {line}: {why}; refusing to open")

    def read(self) -> _Replay:
        pending: list[tuple[int, bytes]] = []
        offset = confirmed_end = 0
        with self.path.open("rb") as file:
            for number, raw in enumerate(file, start=1):
                if not raw.endswith(b"\n"):
                    break  # a partial last line: the append it belonged to never finished
                offset += len(raw)
                marker = self.marker(raw)
                if marker is None:
                    pending.append((number, raw))
                    continue
                self.confirm(pending, marker, number)
                pending = []
                confirmed_end = offset
        return _Replay(self.batches, self.docs, confirmed_end, self.path.stat().st_size)

    @staticmethod
    def marker(raw: bytes) -> dict[str, Any] | None:
        if not raw.startswith(_MARKER_PREFIX):
            return None
        try:
            marker = json.loads(raw)
        except ValueError:
            return None  # a damaged marker confirms nothing; the next marker's line count exposes it
        valid = (
            isinstance(marker, dict)
            and isinstance(marker.get("lines"), int)
            and isinstance(marker.get("sha256"), str)
            and isinstance(marker.get("seqs"), list)
        )
        return marker if valid else None

    def confirm(self, pending: list[tuple[int, bytes]], marker: dict[str, Any], number: int) -> None:
        if len(pending) != marker["lines"]:
            first = pending[0][0] if pending else number
            raise self.corrupt(
                first,
                f"the commit marker at line {number} confirms {marker['lines']} lines, found {len(pending)}",
            )
        digest = hashlib.sha256(b"".join(raw for _, raw in pending)).hexdigest()
        if digest != marker["sha256"]:
            first = pending[0][0] if pending else number
            raise self.corrupt(
                first, f"lines {first}-{number - 1} do not match the checksum of their commit marker"
            )
        before = len(self.batches)
        self.batch = None  # a commit starts with a batch header, never continues the previous commit
        for line_number, raw in pending:
            try:
                self.apply(json.loads(raw), line_number)
            except (ValueError, ValidationError, KeyError, TypeError) as exc:
                raise self.corrupt(line_number, f"unreadable record ({exc})") from exc
        seqs = [batch.seq for batch in self.batches[before:]]
        if seqs != marker["seqs"]:
            raise self.corrupt(
                number, f"the commit marker lists seqs {marker['seqs']}, the records hold {seqs}"
            )

    def apply(self, line: dict[str, Any], number: int) -> None:
        kind = line["type"]
        if kind == "batch":
            seq = line["seq"]
            if not isinstance(seq, int) or seq <= self.last_seq:
                raise self.corrupt(number, f"commit seq {seq} is not after {self.last_seq}")
            self.last_seq = seq
            self.batch = CommitBatch(seq=seq, next_id=int(line["next_id"]))
            self.batches.append(self.batch)
            return
        batch = self.batch
        if batch is None:
            raise self.corrupt(number, "a record before its batch header")
        if kind == "conversation":
            batch.conversations.append(Conversation.model_validate(line["record"]))
        elif kind == "entry":
            batch.entries.append(Entry.model_validate(line["record"]))
        elif kind == "task":
            batch.tasks.append(Task.model_validate(line["record"]))
        elif kind == "submission":
            batch.submissions.append(Submission.model_validate(line["record"]))
        elif kind == "doc_create":
            record = DocumentRecord.model_validate(line["record"])
            content = DocumentContent.model_validate(line["content"])
            batch.doc_creates.append(DocCreate(record=record, version=content.version, value=content.base))
            self.docs.add(record.id)
        elif kind == "doc_change":
            self.known_doc(line["id"], number)
            batch.doc_changes.append(
                DocChange(id=line["id"], content=DocumentContent.model_validate(line["content"]))
            )
        elif kind == "doc_retire":
            self.known_doc(line["id"], number)
            batch.doc_retires.append(line["id"])
        else:
            raise self.corrupt(number, f"unknown line type {kind!r}")

    def known_doc(self, doc_id: Any, number: int) -> None:
        if not isinstance(doc_id, int) or doc_id not in self.docs:
            raise self.corrupt(number, f"a change to unknown document {doc_id!r}")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _append(fd: int, records: bytes, marker: bytes, fsync: bool) -> None:
    if not fsync:
        _write_all(fd, records + marker)
        return
    # The data reaches the disk before its marker is even written, so a marker never survives without it.
    _write_all(fd, records)
    os.fsync(fd)
    _write_all(fd, marker)
    os.fsync(fd)  # and the acknowledged commit itself survives power loss


def _open_files(directory: Path, fsync: bool) -> tuple[str, OwnerLock, int, Path]:
    """Create the directory, take the owner lock, open the log. A few local syscalls, done inline."""
    root = directory.absolute()
    description = str(root)
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create storage directory {description}: {exc}") from exc
    lock = OwnerLock.acquire(root / LOCK_FILE, description)
    main = root / MAIN_FILE
    try:
        created = not main.exists()
        fd = os.open(main, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        if created and fsync:
            _fsync_dir(root)
    except OSError as exc:
        lock.release()
        raise StorageError(f"cannot open {main}: {exc}") from exc
    return description, lock, fd, main


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _recover(fd: int, main: Path, fsync: bool) -> _Replay:
    replay = _Reader(main).read()
    if replay.size > replay.confirmed_end:
        os.ftruncate(fd, replay.confirmed_end)  # drop the torn tail so new appends follow the last marker
        if fsync:
            os.fsync(fd)
    return replay


class JsonlStorage:
    """An append-only directory store. Open with `await JsonlStorage.open(directory)`.

    History is kept in memory; prefer `SqliteStorage` for long-running bots. With `fsync=True` every commit is
    on disk before `commit()` returns; without it, commits survive process crashes but not power loss.
    """

    def __init__(
        self, description: str, lock: OwnerLock, fd: int, index: MemoryStorage, docs: set[int], fsync: bool
    ) -> None:
        self._description = description
        self._lock = lock
        self._fd = fd
        self._index = index
        self._docs = docs
        self._fsync = fsync
        self._closed = False
        self._failed: BaseException | None = None

    @classmethod
    async def open(cls, directory: str | os.PathLike[str], *, fsync: bool = False) -> JsonlStorage:
        description, lock, fd, main = _open_files(Path(directory), fsync)
        try:
            replay = await asyncio.to_thread(_recover, fd, main, fsync)
            index = await MemoryStorage.open()
            if replay.batches:
                await index.commit(replay.batches)
        except BaseException as exc:
            os.close(fd)
            lock.release()
            if isinstance(exc, OSError):
                raise StorageError(f"cannot read {main}: {exc}") from exc
            raise
        return cls(description, lock, fd, index, replay.docs, fsync)

    @property
    def description(self) -> str:
        return self._description

    def _check(self) -> None:
        if self._closed:
            raise StorageClosed(f"storage {self._description} is closed")

    async def meta(self) -> StorageMeta:
        self._check()
        return await self._index.meta()

    async def commit(self, batches: Sequence[CommitBatch]) -> None:
        self._check()
        if self._failed is not None:
            raise StorageError(
                f"storage {self._description} refuses commits after a failed append ({self._failed}); "
                "reopen it"
            )
        last = (await self._index.meta()).last_seq
        for batch in batches:
            if batch.seq <= last:
                raise StorageRequestError(f"commit seq {batch.seq} is not after {last}")
            last = batch.seq
        if not batches:
            return
        created = self._check_documents(batches)
        try:
            records, marker = _encode(batches)
        except (ValueError, TypeError, RecursionError) as exc:  # PydanticSerializationError is a ValueError
            # Nothing was written: a certain refusal, not an uncertain write (see the storage protocol).
            raise StrictJsonError(
                f"storage {self._description} refused a commit before writing it: {exc}"
            ) from exc
        try:
            if self._fsync:
                await asyncio.to_thread(_append, self._fd, records, marker, True)
            else:
                _append(self._fd, records, marker, False)  # page-cache writes are quicker than a thread hop
        except BaseException as exc:
            # Part of the commit may be in the file: appending after it would bury it inside the next commit.
            self._failed = exc
            if isinstance(exc, OSError):
                raise StorageError(f"append to {self._description}/{MAIN_FILE} failed: {exc}") from exc
            raise
        await self._index.commit(batches)  # copies, so the caller may keep mutating its batches
        self._docs.update(created)

    def _check_documents(self, batches: Iterable[CommitBatch]) -> set[int]:
        """Reject changes to unknown documents before writing: replay would refuse such a log."""
        created: set[int] = set()
        for batch in batches:
            created.update(create.record.id for create in batch.doc_creates)
            for doc_id in [change.id for change in batch.doc_changes] + list(batch.doc_retires):
                if doc_id not in self._docs and doc_id not in created:
                    raise StorageRequestError(f"commit changes unknown document {doc_id}")
        return created

    async def conversation(self, conversation_id: int) -> Conversation | None:
        self._check()
        return await self._index.conversation(conversation_id)

    async def scan_conversations(
        self,
        *,
        owner_task_id: int | None = None,
        order: Order = "asc",
        limit: int = 100,
        cursor: dict[str, Any] | None = None,
    ) -> Page[Conversation]:
        self._check()
        return await self._index.scan_conversations(
            owner_task_id=owner_task_id, order=order, limit=limit, cursor=cursor
        )

    async def entry(self, entry_id: int) -> Entry | None:
        self._check()
        return await self._index.entry(entry_id)

    async def scan_entries(
        self,
        conversation_id: int,
        *,
        min_id: int | None = None,
        max_id: int | None = None,
        order: Order = "desc",
        limit: int = 100,
        cursor: dict[str, Any] | None = None,
    ) -> Page[Entry]:
        self._check()
        return await self._index.scan_entries(
            conversation_id, min_id=min_id, max_id=max_id, order=order, limit=limit, cursor=cursor
        )

    async def latest_head(self, conversation_id: int, *, at_or_before: int | None = None) -> Entry | None:
        self._check()
        return await self._index.latest_head(conversation_id, at_or_before=at_or_before)

    async def task(self, task_id: int) -> Task | None:
        self._check()
        return await self._index.task(task_id)

    async def scan_tasks(
        self,
        *,
        live: bool | None = None,
        conversation_id: int | None = None,
        kind: str | None = None,
        order: Order = "asc",
        limit: int = 100,
        cursor: dict[str, Any] | None = None,
    ) -> Page[Task]:
        self._check()
        return await self._index.scan_tasks(
            live=live, conversation_id=conversation_id, kind=kind, order=order, limit=limit, cursor=cursor
        )

    async def submission(self, submission_id: int) -> Submission | None:
        self._check()
        return await self._index.submission(submission_id)

    async def submission_by_request(self, conversation_id: int, request_id: str) -> Submission | None:
        self._check()
        return await self._index.submission_by_request(conversation_id, request_id)

    async def scan_submissions(
        self,
        *,
        conversation_id: int | None = None,
        status: SubmissionStatus | None = None,
        order: Order = "asc",
        limit: int = 100,
        cursor: dict[str, Any] | None = None,
    ) -> Page[Submission]:
        self._check()
        return await self._index.scan_submissions(
            conversation_id=conversation_id, status=status, order=order, limit=limit, cursor=cursor
        )

    async def find_document(
        self,
        kind: str,
        scope: DocScope,
        scope_id: int | None,
        key: str | None = None,
        *,
        at_seq: int | None = None,
    ) -> DocumentRecord | None:
        self._check()
        return await self._index.find_document(kind, scope, scope_id, key, at_seq=at_seq)

    async def document(self, doc_id: int, *, at_seq: int | None = None) -> DocumentValue | None:
        self._check()
        return await self._index.document(doc_id, at_seq=at_seq)

    async def document_contents(self, doc_id: int) -> list[DocumentContent]:
        self._check()
        return await self._index.document_contents(doc_id)

    async def scan_documents(
        self,
        *,
        scope: DocScope,
        scope_id: int | None = None,
        kind: str | None = None,
        alive_only: bool = True,
    ) -> list[DocumentRecord]:
        self._check()
        return await self._index.scan_documents(
            scope=scope, scope_id=scope_id, kind=kind, alive_only=alive_only
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._index.close()
            os.close(self._fd)
        finally:
            self._lock.release()
