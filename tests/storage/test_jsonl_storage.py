"""JSONL specifics: file layout and modes, torn tails, corruption, fsync ordering, failed appends."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from harness_core.errors import StorageCorrupt, StorageError, StorageRequestError
from harness_core.records import Conversation, DocumentContent, DocumentRecord, Entry
from harness_core.storage import CommitBatch, DocChange, DocCreate, JsonlStorage, _jsonl


def commit_n(seq: int) -> CommitBatch:
    """Commit `seq` (from 2): two entries and a delta on document 1."""
    change = DocChange(
        id=1, content=DocumentContent(seq=seq, version=1, delta=[{"op": "add", "path": "/-", "value": seq}])
    )
    entries = [Entry(id=seq * 10 + i, conversation_id=1, kind="t.note", data={"seq": seq}) for i in range(2)]
    return CommitBatch(seq=seq, next_id=seq * 10 + 10, entries=entries, doc_changes=[change])


def first_commit() -> CommitBatch:
    record = DocumentRecord(id=1, kind="t.log", scope="conversation", scope_id=1, created_seq=1)
    return CommitBatch(
        seq=1,
        next_id=10,
        conversations=[Conversation(id=1)],
        doc_creates=[DocCreate(record=record, version=1, value=[])],
    )


async def filled(root: Path, commits: int, *, fsync: bool = False) -> None:
    storage = await JsonlStorage.open(root, fsync=fsync)
    await storage.commit([first_commit()])
    for seq in range(2, commits + 1):
        await storage.commit([commit_n(seq)])
    await storage.close()


async def state(root: Path) -> tuple[int, list[int], Any]:
    storage = await JsonlStorage.open(root)
    try:
        entries = [e.id for e in (await storage.scan_entries(1, order="asc")).items]
        value = await storage.document(1)
        assert value is not None
        return (await storage.meta()).last_seq, entries, value.value
    finally:
        await storage.close()


def lines(root: Path) -> list[bytes]:
    return (root / "main.jsonl").read_bytes().splitlines(keepends=True)


async def test_layout_and_private_files(tmp_path: Path) -> None:
    root = tmp_path / "store"
    await filled(root, 3)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "main.jsonl").stat().st_mode) == 0o600
    assert stat.S_IMODE((root / ".lock").stat().st_mode) == 0o600
    markers = [json.loads(line) for line in lines(root) if line.startswith(b'{"type":"commit"')]
    assert [m["seqs"] for m in markers] == [[1], [2], [3]]  # one marker per commit
    assert await state(root) == (3, [20, 21, 30, 31], [2, 3])


async def test_a_group_of_batches_is_one_commit_with_one_marker(tmp_path: Path) -> None:
    root = tmp_path / "store"
    storage = await JsonlStorage.open(root)
    await storage.commit([first_commit(), commit_n(2), commit_n(3)])
    await storage.close()
    markers = [json.loads(line) for line in lines(root) if line.startswith(b'{"type":"commit"')]
    assert markers == [{"type": "commit", "seqs": [1, 2, 3], "lines": 11, "sha256": markers[0]["sha256"]}]
    assert await state(root) == (3, [20, 21, 30, 31], [2, 3])


@pytest.mark.parametrize(
    "tail",
    [
        b'{"type":"entry","rec',  # a partial last line
        # complete record lines without their marker
        b'{"type":"batch","seq":4,"next_id":50}\n'
        b'{"type":"entry","record":{"id":40,"conversation_id":1,"kind":"t"}}\n',
        # records, garbage and a torn marker
        b'{"type":"batch","seq":4,"next_id":50}\n\x00\x00garbage\n{"type":"commit","seq',
    ],
)
async def test_a_torn_tail_is_dropped_and_truncated(tmp_path: Path, tail: bytes) -> None:
    root = tmp_path / "store"
    await filled(root, 3)
    size = (root / "main.jsonl").stat().st_size
    with (root / "main.jsonl").open("ab") as file:
        file.write(tail)
    assert await state(root) == (3, [20, 21, 30, 31], [2, 3])
    assert (root / "main.jsonl").stat().st_size == size  # truncated back to the last marker
    storage = await JsonlStorage.open(root)
    await storage.commit([commit_n(4)])  # new commits follow the last marker cleanly
    await storage.close()
    assert await state(root) == (4, [20, 21, 30, 31, 40, 41], [2, 3, 4])


async def test_a_changed_confirmed_line_is_refused_by_its_checksum(tmp_path: Path) -> None:
    root = tmp_path / "store"
    await filled(root, 3)
    content = lines(root)
    target = next(i for i, line in enumerate(content) if b'"id":30' in line)
    content[target] = content[target].replace(b'"seq":3', b'"seq":9')
    (root / "main.jsonl").write_bytes(b"".join(content))
    # A checksum covers a whole commit: the error names the commit's lines (1-based), header to last record.
    header = next(i for i, line in enumerate(content) if line.startswith(b'{"type":"batch","seq":3')) + 1
    commit_lines = rf"lines {header}-{header + 3} do not match the checksum"
    with pytest.raises(StorageCorrupt, match=rf"main\.jsonl is corrupt at line {header}: {commit_lines}"):
        await JsonlStorage.open(root)
    # The refused open released its lock: a fixed file opens again.
    content[target] = content[target].replace(b'"seq":9', b'"seq":3')
    (root / "main.jsonl").write_bytes(b"".join(content))
    assert (await state(root))[0] == 3


async def test_an_unreadable_confirmed_line_is_named(tmp_path: Path) -> None:
    root = tmp_path / "store"
    await filled(root, 3)
    content = lines(root)
    target = next(i for i, line in enumerate(content) if b'"id":21' in line)
    content[target] = b'{"type":"entry","record":{"id":"not a number"}}\n'
    # Re-seal the marker so that the checksum matches and the record itself is what fails.
    marker_at = next(i for i in range(target, len(content)) if content[i].startswith(b'{"type":"commit"'))
    start = max(i for i in range(marker_at) if content[i].startswith(b'{"type":"commit"')) + 1
    marker = json.loads(content[marker_at])
    marker["sha256"] = hashlib.sha256(b"".join(content[start:marker_at])).hexdigest()
    content[marker_at] = json.dumps(marker, separators=(",", ":")).encode() + b"\n"
    (root / "main.jsonl").write_bytes(b"".join(content))
    with pytest.raises(StorageCorrupt, match=rf"corrupt at line {target + 1}: unreadable record"):
        await JsonlStorage.open(root)


async def test_a_missing_confirmed_line_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "store"
    await filled(root, 3)
    content = lines(root)
    del content[next(i for i, line in enumerate(content) if b'"id":20' in line)]
    (root / "main.jsonl").write_bytes(b"".join(content))
    with pytest.raises(StorageCorrupt, match="confirms 4 lines, found 3"):
        await JsonlStorage.open(root)


async def test_fsync_writes_data_durably_before_its_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    storage = await JsonlStorage.open(root, fsync=True)
    events: list[str] = []
    real_write, real_fsync = os.write, os.fsync

    def write(fd: int, data: Any) -> int:
        events.append("marker" if bytes(data).startswith(b'{"type":"commit"') else "data")
        return real_write(fd, data)

    def fsync(fd: int) -> None:
        events.append("fsync")
        real_fsync(fd)

    monkeypatch.setattr(_jsonl.os, "write", write)
    monkeypatch.setattr(_jsonl.os, "fsync", fsync)
    await storage.commit([first_commit()])
    await storage.commit([commit_n(2)])
    monkeypatch.undo()
    await storage.close()
    assert events == ["data", "fsync", "marker", "fsync"] * 2
    assert await state(root) == (2, [20, 21], [2])


async def test_without_fsync_a_commit_is_one_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = await JsonlStorage.open(tmp_path / "store")
    writes: list[bytes] = []
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        writes.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(_jsonl.os, "write", write)
    await storage.commit([first_commit(), commit_n(2)])
    monkeypatch.undo()
    await storage.close()
    assert len(writes) == 1
    assert writes[0].endswith(b"\n")
    assert writes[0].splitlines()[-1].startswith(b'{"type":"commit"')


async def test_a_failed_append_stops_commits_and_reopen_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    await filled(root, 2)
    storage = await JsonlStorage.open(root)
    real_write = os.write

    def short_then_fail(fd: int, data: Any) -> int:
        monkeypatch.setattr(_jsonl.os, "write", failing)
        return real_write(fd, bytes(data)[:25])  # part of the commit reaches the file

    def failing(fd: int, data: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_jsonl.os, "write", short_then_fail)
    with pytest.raises(StorageError, match="No space left"):
        await storage.commit([commit_n(3)])
    monkeypatch.undo()
    with pytest.raises(StorageError, match="refuses commits after a failed append"):
        await storage.commit([commit_n(3)])
    assert await storage.entry(30) is None  # never published
    await storage.close()
    assert await state(root) == (2, [20, 21], [2])
    storage = await JsonlStorage.open(root)
    await storage.commit([commit_n(3)])
    await storage.close()
    assert await state(root) == (3, [20, 21, 30, 31], [2, 3])


async def test_changes_to_unknown_documents_are_refused_before_writing(tmp_path: Path) -> None:
    root = tmp_path / "store"
    await filled(root, 2)
    size = (root / "main.jsonl").stat().st_size
    storage = await JsonlStorage.open(root)
    try:
        stray = DocChange(id=99, content=DocumentContent(seq=3, version=1, base={}))
        with pytest.raises(StorageRequestError, match="unknown document 99"):
            await storage.commit([CommitBatch(seq=3, next_id=40, doc_changes=[stray])])
        with pytest.raises(StorageRequestError, match="unknown document 98"):
            await storage.commit([CommitBatch(seq=3, next_id=40, doc_retires=[98])])
        assert (root / "main.jsonl").stat().st_size == size
        await storage.commit([commit_n(3)])  # still healthy
    finally:
        await storage.close()
