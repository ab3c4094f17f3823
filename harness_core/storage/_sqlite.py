"""The SQLite backend (aiosqlite, WAL): the default store for long-running bots.

Every record is one row holding its JSON; a few columns copy the fields that reads filter on, so every read is
an index range. One commit is one SQL transaction written in one hop to aiosqlite's worker thread. WAL checkpoints run on the
reader connection's thread, beside the writer, so no commit waits for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import aiosqlite
from pydantic import BaseModel

from harness_core.errors import (
    StorageClosed,
    StorageCorrupt,
    StorageError,
    StorageRequestError,
)
from harness_core.records import (
    Conversation,
    DocScope,
    DocumentRecord,
    DocumentValue,
    Entry,
    Submission,
    Task,
)
from harness_core.storage._lock import OwnerLock
from harness_core.storage._operator import (
    FINISHED_REQUESTS_KEPT,
    REQUEST_COLUMNS,
    OperatorRequest,
    request_from_row,
)
from harness_core.storage._protocol import CommitBatch, StorageMeta
from harness_core.storage._sql_plan import CommitPlan, plan_or_refuse
from harness_core.storage._sql_reads import MAX_SEQ, SqlRecordReads, wants_contents
from harness_core.storage._sqlite_schema import SCHEMA_VERSION, migrate

Durability = Literal["normal", "full"]
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
R = TypeVar("R", Conversation, Entry, Task, Submission)


# Statements of one commit, in the order the memory backend applies a batch.
_INSERT_CONVERSATION = "INSERT INTO conversations (id, owner_task_id, record) VALUES (?, ?, ?)"
_INSERT_ENTRY = "INSERT INTO entries (id, conversation_id, head, record) VALUES (?, ?, ?, ?)"
_UPSERT_TASK = (
    "INSERT INTO tasks (id, conversation_id, kind, live, record) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET conversation_id = excluded.conversation_id, kind = excluded.kind, "
    "live = excluded.live, record = excluded.record"
)
# ON CONFLICT (id) rather than INSERT OR REPLACE: a clash on (conversation_id, request_id) with another
# submission must fail, not silently delete that other row.
_UPSERT_SUBMISSION = (
    "INSERT INTO submissions (id, conversation_id, request_id, status, record) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET conversation_id = excluded.conversation_id, "
    "request_id = excluded.request_id, status = excluded.status, record = excluded.record"
)
_INSERT_DOC = (
    "INSERT INTO doc_records (id, kind, scope, scope_id, key, rewindable, created_seq, retired_seq, record) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_CONTENT = "INSERT INTO doc_contents (doc_id, seq, part, is_base, content) VALUES (?, ?, ?, ?, ?)"
# A base of a current-only document makes its older revisions unreachable; rewindable history is kept.
_RECLAIM_BEFORE_BASE = (
    "DELETE FROM doc_contents WHERE doc_id = ?1 AND (seq, part) < (?2, ?3) "
    "AND (SELECT rewindable FROM doc_records WHERE id = ?1) = 0"
)
_RETIRE = "UPDATE doc_records SET retired_seq = ? WHERE id = ?"
# A retired current-only document can never be read again (reads by seq are refused for it).
_RECLAIM_RETIRED = (
    "DELETE FROM doc_contents WHERE doc_id = ?1 AND (SELECT rewindable FROM doc_records WHERE id = ?1) = 0"
)
# A reservation is stored negated: a negative next_id at open says the last process did not close (its
# reservation is all that is known), a positive one is the exact value written by a graceful close.
_UPDATE_META = "UPDATE meta SET next_id = -max(abs(next_id), ?), last_seq = max(last_seq, ?) WHERE id = 1"
_SET_META = "UPDATE meta SET next_id = ?, last_seq = ? WHERE id = 1"
# A commit writes a handful of pages; SQLite's own checkpoint (every 1000 pages) would land inside about one
# commit in 200 and make it several times slower. We checkpoint after this many commits on the reader thread
# instead, and leave SQLite's on the writer only as a backstop (in pages) should ours fall behind.
_CHECKPOINT_EVERY = 200
# `PRAGMA quick_check` at open (see `SqliteStorage.open` for the measurements behind these): a store up to
# INLINE_CHECK_BYTES is checked before open returns; a bigger one in the background, so a restart does not wait
# for it. Either check stops after CHECK_BUDGET seconds.
CHECK_BUDGET = 60.0
INLINE_CHECK_BYTES = 32 * 2**20
# The background check starts this many seconds after open: the restart's own first work (catch-up, the runs
# a crash interrupted) goes first.
BACKGROUND_CHECK_DELAY = 1.0
_BACKSTOP_PAGES = 20_000

log = logging.getLogger("harness_core.storage")

# The newest base at or before a seq, then it and the revisions after it. INDEXED BY: finding that base is one
# seek in the partial index of bases, not a walk back through a long rewindable history.
_NEWEST_BASE = (
    "SELECT seq, part FROM doc_contents INDEXED BY doc_contents_bases "
    "WHERE doc_id = ? AND is_base = 1 AND seq <= ? ORDER BY seq DESC, part DESC LIMIT 1"
)
_CONTENTS_FROM = (
    "SELECT content FROM doc_contents WHERE doc_id = ? AND (seq, part) >= (?, ?) AND seq <= ? "
    "ORDER BY seq, part"
)


def _content_tail(conn: sqlite3.Connection, doc_id: int, upto: int) -> list[Any]:
    # With no base the whole range comes back, so materialize() reports the missing base as corruption.
    found = conn.execute(_NEWEST_BASE, (doc_id, upto)).fetchone()
    seq, part = found if found is not None else (0, 0)
    return conn.execute(_CONTENTS_FROM, (doc_id, seq, part, upto)).fetchall()


_STATEMENTS = (
    _INSERT_CONVERSATION,
    _INSERT_ENTRY,
    _UPSERT_TASK,
    _UPSERT_SUBMISSION,
    _INSERT_DOC,
    _INSERT_CONTENT,
    _RECLAIM_BEFORE_BASE,
)


def _json(record: BaseModel) -> str:
    # Fields left at None are omitted (every optional record field defaults to None, so reading restores
    # them): about 15% fewer bytes per turn. Nulls inside JSON values (data, inputs, documents) are kept.
    return record.model_dump_json(exclude_none=True)


def _write(conn: sqlite3.Connection, plan: CommitPlan) -> None:
    """Runs on the connection thread: the whole group of batches in one transaction."""
    # IMMEDIATE takes the write lock up front, so a competing writer fails here and not half way through.
    conn.execute("BEGIN IMMEDIATE")
    try:
        for sql, rows in plan.statements(_STATEMENTS):
            if rows:
                conn.executemany(sql, rows)
        if plan.retires:
            changed = conn.executemany(_RETIRE, plan.retires).rowcount
            if changed != len(plan.retires):
                raise StorageError(f"commit retires an unknown document (ids {[r[1] for r in plan.retires]})")
            conn.executemany(_RECLAIM_RETIRED, [(doc_id,) for _, doc_id in plan.retires])
        if plan.reserve is not None:
            conn.execute(_UPDATE_META, plan.reserve)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # some errors (disk full, I/O) already rolled back
            conn.execute("ROLLBACK")
        raise


def _translate(path: str, action: str, exc: sqlite3.Error) -> StorageError:
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return StorageError(
            f"storage {path} is locked by another SQLite connection that does not take the owner lock "
            f"({exc}); {action} failed"
        )
    if name.startswith("SQLITE_READONLY"):
        return StorageError(
            f"storage {path} cannot be written (read-only file system or permissions: {exc}); {action} failed"
        )
    if name.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")):
        return StorageCorrupt(f"storage {path} is not a readable SQLite database ({exc}); {action} failed")
    return StorageError(f"storage {path}: {action} failed: {exc}")


async def _on_thread(db: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    # aiosqlite has no public "run this callable on the connection thread". Its private `_execute` queues
    # exactly that, so a commit is one hop instead of one per statement, and no other queued call (a read)
    # can run between BEGIN and COMMIT.
    execute = cast(Callable[[Callable[[], T]], Awaitable[T]], db._execute)
    return await execute(lambda: fn(db._conn))


def _quick_check(
    conn: sqlite3.Connection, path: str, budget: float, stop: threading.Event | None = None
) -> bool:
    """`PRAGMA quick_check` (every page and record format, no index-to-table cross check) within `budget`
    seconds. True when it checked the whole file; False when it ran out of time (a partial check, logged): a
    big store still opens in bounded time, and a page it did not reach is checked by SQLite when it is read
    (a corrupt one raises `StorageCorrupt` then). Raises `StorageCorrupt` naming what it found."""
    if budget <= 0:
        return False
    deadline = time.monotonic() + budget
    conn.set_progress_handler(
        lambda: int(time.monotonic() > deadline or (stop is not None and stop.is_set())), 10_000
    )
    try:
        rows = conn.execute("PRAGMA quick_check(5)").fetchall()
    except sqlite3.OperationalError as exc:
        if "interrupt" not in str(exc):
            raise
        if stop is None or not stop.is_set():
            log.info(
                "storage %s: quick_check stopped after its %.1f s budget (a partial check)", path, budget
            )
        return False
    finally:
        conn.set_progress_handler(None, 0)
    found = [line.strip() for row in rows for line in str(row[0]).splitlines() if line.strip()]
    if found != ["ok"]:
        problems = [line for line in found if not line.startswith("***")][:3]  # one line: the first three
        raise StorageCorrupt(
            f"storage {path} is corrupt (quick_check: {'; '.join(problems)}); {RESTORE_HINT}"
        )
    return True


def _check_in_background(path: str, budget: float, stop: threading.Event) -> StorageCorrupt | None:
    """Runs in a worker thread, on its own read-only connection (WAL: it never blocks the writer)."""
    conn = sqlite3.connect(
        f"file:{urllib.parse.quote(path)}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
    )
    try:
        _quick_check(conn, path, budget, stop)
    except StorageCorrupt as exc:
        return exc
    except sqlite3.DatabaseError as exc:
        if (getattr(exc, "sqlite_errorname", "") or "").startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")):
            return StorageCorrupt(f"storage {path} is corrupt ({exc}); {RESTORE_HINT}")
        raise
    finally:
        conn.close()
    return None


def _setup(conn: sqlite3.Connection, path: str, durability: Durability, check_budget: float) -> StorageMeta:
    conn.execute("PRAGMA user_version").fetchone()  # reads the header: a foreign file fails here
    (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
    if str(mode).lower() != "wal":
        raise StorageError(f"storage {path} cannot use WAL journaling (journal_mode is {mode})")
    _quick_check(conn, path, check_budget)
    conn.execute(f"PRAGMA synchronous = {'FULL' if durability == 'full' else 'NORMAL'}")
    conn.execute("PRAGMA foreign_keys = ON")  # a change to an unknown document fails its commit
    conn.execute(f"PRAGMA wal_autocheckpoint = {_BACKSTOP_PAGES}")
    migrate(conn, path)
    next_id, last_seq = conn.execute("SELECT next_id, last_seq FROM meta WHERE id = 1").fetchone()
    if int(next_id) < 0:  # not closed gracefully: continue from the ids actually stored
        return StorageMeta(next_id=_next_unused_id(conn), last_seq=int(last_seq))
    return StorageMeta(next_id=int(next_id), last_seq=int(last_seq))


# Operator requests (see _operator.py) live in a table of their own, outside the versioned schema: it is
# created by whichever side touches it first and is never part of a harness commit.
_REQUESTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS operator_requests (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, "
    "args TEXT NOT NULL, status TEXT NOT NULL, outcome TEXT, created_at INTEGER NOT NULL, finished_at INTEGER)"
)


def _has_requests(conn: sqlite3.Connection) -> bool:
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'operator_requests'")
    return found.fetchone() is not None


# Looked at twice a second by the leader: the requests still to carry out have an index, and finished ones
# older than a week are deleted whenever a request is queued, so the table holds about a week of requests.
_REQUESTS_OPEN = (
    "CREATE INDEX IF NOT EXISTS operator_requests_open ON operator_requests (id) "
    "WHERE status IN ('pending', 'taken')"
)
_PRUNE_REQUESTS = "DELETE FROM operator_requests WHERE finished_at IS NOT NULL AND finished_at < ?"


def _put_request(conn: sqlite3.Connection, kind: str, args: str) -> int:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(_REQUESTS_TABLE)
        conn.execute(_REQUESTS_OPEN)
        now = int(time.time() * 1000)
        conn.execute(_PRUNE_REQUESTS, (now - int(FINISHED_REQUESTS_KEPT * 1000),))
        cursor = conn.execute(
            "INSERT INTO operator_requests (kind, args, status, created_at) VALUES (?, ?, 'pending', ?)",
            (kind, args, now),
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return int(cursor.lastrowid or 0)


def _get_request(conn: sqlite3.Connection, request_id: int) -> OperatorRequest | None:
    if not _has_requests(conn):
        return None
    row = conn.execute(
        f"SELECT {REQUEST_COLUMNS} FROM operator_requests WHERE id = ?", (request_id,)
    ).fetchone()
    return None if row is None else request_from_row(row)


def _pending_requests(conn: sqlite3.Connection, limit: int) -> list[OperatorRequest]:
    if not _has_requests(conn):
        return []
    rows = conn.execute(
        f"SELECT {REQUEST_COLUMNS} FROM operator_requests WHERE status IN ('pending', 'taken') "
        "ORDER BY id LIMIT ?",
        (limit,),
    ).fetchall()
    return [request_from_row(row) for row in rows]


def _settle_request(
    conn: sqlite3.Connection, request_id: int, status: str, outcome: str | None, *, taken_too: bool = False
) -> bool:
    """Move a pending request (with `taken_too`, a taken one too) to `status`; False if it was not."""
    if not _has_requests(conn):
        return False
    states = "('pending', 'taken')" if taken_too else "('pending')"
    finished = None if status == "taken" else int(time.time() * 1000)
    changed = conn.execute(
        f"UPDATE operator_requests SET status = ?, outcome = ?, finished_at = ? WHERE id = ? AND status IN {states}",
        (status, outcome, finished, request_id),
    ).rowcount
    return bool(changed)


def _read_only_setup(conn: sqlite3.Connection, path: str) -> StorageMeta:
    """Start the one read transaction every later read of a read-only handle runs in (its snapshot)."""
    (version,) = conn.execute("PRAGMA user_version").fetchone()  # a foreign file fails here
    if version != SCHEMA_VERSION:
        raise StorageError(
            f"storage {path} has schema version {version}, this build reads {SCHEMA_VERSION}; "
            "start the bot (it migrates the file) or use the matching durable-bots version"
        )
    conn.execute("BEGIN")
    next_id, last_seq = conn.execute("SELECT next_id, last_seq FROM meta WHERE id = 1").fetchone()
    return StorageMeta(next_id=int(next_id), last_seq=int(last_seq))


def _existing(path: Path) -> tuple[Path, str]:
    file = path.absolute()
    if not file.is_file():
        raise StorageError(f"there is no storage at {file}")
    return file, str(file)


# After a crash, every minted id that was ever observable is in one of these tables (nothing is visible
# before its commit, and rows are never deleted), so the next id is one above their maximum: ids people see (task #38, gate
# #38, deploy-38, conversation #3) stay small and dense across restarts of any kind, instead of jumping to the
# meta row's reservation after a crash. Each max() is one seek at the end of the primary key.
_MAX_ID = (
    "SELECT max(coalesce((SELECT max(id) FROM conversations), 0), coalesce((SELECT max(id) FROM entries), 0), "
    "coalesce((SELECT max(id) FROM tasks), 0), coalesce((SELECT max(id) FROM submissions), 0), "
    "coalesce((SELECT max(id) FROM doc_records), 0))"
)


def _next_unused_id(conn: sqlite3.Connection) -> int:
    (highest,) = conn.execute(_MAX_ID).fetchone()
    return int(highest or 0) + 1


def _prepare(path: Path) -> tuple[str, OwnerLock]:
    """Take the owner lock, then check the file is a SQLite database, or create one. Local syscalls, inline."""
    file = path.absolute()
    description = str(file)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create the directory of storage {description}: {exc}") from exc
    lock = OwnerLock.acquire(file.with_name(file.name + ".lock"), description)
    try:
        _check_header(file, description)
        if not file.exists():
            _create(file)
    except (OSError, sqlite3.Error) as exc:
        lock.release()
        raise StorageError(f"cannot create storage {description}: {exc}") from exc
    except BaseException:
        lock.release()
        raise
    return description, lock


def _store_bytes(path: str) -> int:
    total = 0
    for name in (path, path + "-wal"):
        with contextlib.suppress(OSError):
            total += os.stat(name).st_size
    return total


_HEADER = b"SQLite format 3\x00"
RESTORE_HINT = (
    "restore it from a backup (move this file and its -wal/-shm files aside first), "
    "or give the storage a new path to start empty"
)


def _check_header(file: Path, description: str) -> None:
    """Refuse a file that is not a SQLite database before SQLite sees it: SQLite would take a zero-length file
    for a new empty database and start over, silently, where a store was expected."""
    try:
        with open(file, "rb") as handle:
            header = handle.read(len(_HEADER))
    except FileNotFoundError:
        return
    if header == _HEADER:
        return
    if not header:
        wal = file.with_name(file.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            return  # the first pages are still in the WAL (a store from an older build that crashed early)
        raise StorageCorrupt(
            f"storage {description} is an empty (zero-length) file, not a SQLite database; {RESTORE_HINT}"
        )
    raise StorageCorrupt(
        f"storage {description} is not a SQLite database (wrong file header); {RESTORE_HINT}"
    )


def _create(file: Path) -> None:
    """A new store appears complete or not at all: its header is written to a side file (0600; SQLite gives
    -wal and -shm the database file's mode) that is renamed into place, so a crash during creation never
    leaves the zero-length file that `_check_header` refuses."""
    side = file.with_name(f"{file.name}.new-{os.getpid()}")
    side.unlink(missing_ok=True)
    os.close(os.open(side, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        conn = sqlite3.connect(side, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode = WAL").fetchone()  # writes the header (the mode is persistent)
        finally:
            conn.close()
        with open(side, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(side, file)
    finally:
        for leftover in (side, side.with_name(side.name + "-wal"), side.with_name(side.name + "-shm")):
            leftover.unlink(missing_ok=True)
    directory = os.open(file.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class SqliteStorage(SqlRecordReads):
    """A SQLite file. Open with `await SqliteStorage.open(path)`; one process owns it at a time."""

    _numbered = False
    # INDEXED BY: without statistics the planner may pick the full conversation index and walk every entry of
    # the conversation.
    _LATEST_HEAD = (
        "SELECT record FROM entries INDEXED BY entries_heads "
        "WHERE conversation_id = ? AND head IS NOT NULL AND id <= ? ORDER BY id DESC LIMIT 1"
    )

    def __init__(
        self,
        path: str,
        db: aiosqlite.Connection,
        reader: aiosqlite.Connection,
        lock: OwnerLock | None,
        meta: StorageMeta,
    ) -> None:
        self._path = path
        self._db = db
        # Scans run on a second connection (WAL lets readers run beside the writer), so a long scan never
        # queues ahead of a commit or of the short lookups commits make.
        self._reader = reader
        self._lock = lock
        self._next_id = meta.next_id
        self._last_seq = meta.last_seq
        # The meta row holds a reservation above what is used, written only when commits pass it (about once
        # per thousand commits) and set exact at close: one page fewer to write per commit. After a crash the
        # next process continues above the reservation for seqs (never shown; gaps are allowed) and from the
        # highest stored id for ids (see `_next_unused_id`), so ids stay dense.
        self._reserved = (meta.next_id, meta.last_seq)
        self._closed = False
        self._uncheckpointed = 0
        self._checkpointing: asyncio.Task[None] | None = None  # owned here: awaited by close()
        self.read_only = lock is None  # opened by open_read_only(): one snapshot, no writes, no lock
        self._verifying: asyncio.Task[None] | None = (
            None  # the background check of a big store (close() stops it)
        )
        self._stop_verifying = threading.Event()
        self._closing = asyncio.Event()
        self._damage: StorageCorrupt | None = None  # what that check found: every later call raises it

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "normal",
        busy_timeout: float = 5.0,
        check_budget: float = CHECK_BUDGET,
    ) -> SqliteStorage:
        """Open (or create) the database at `path`, taking the owner lock `<path>.lock`.

        `durability="normal"` survives process crashes (the newest commits may be lost on power failure);
        `"full"` also syncs every commit to disk. `busy_timeout` (seconds) bounds the wait for a foreign
        SQLite writer that holds the database.

        Opening checks the file: a zero-length file or one that is not SQLite is refused (`StorageCorrupt`,
        never started as an empty store), and `PRAGMA quick_check` reads every page for up to `check_budget`
        seconds (default `CHECK_BUDGET`, 60 s; 0 turns it off). A store up to `INLINE_CHECK_BYTES` (32 MiB,
        database + WAL) is checked before `open` returns (tens of milliseconds), and damage raises
        `StorageCorrupt` with the path and the fix. A bigger store is checked in the background on a read-only
        connection of its own, starting `BACKGROUND_CHECK_DELAY` (1 s) after open, so a restart does not wait
        for it (the recovery goal is a first answer within 1 s): measured on a 791 MiB store of 1,010,000 entries, the whole check takes 0.5-1.6 s with the file
        in the page cache and 5.3 s cold. Damage found there is logged as an ERROR with the path and the fix,
        and every later call raises that `StorageCorrupt` (a commit then stops the harness). Pages no check
        reached are still verified by SQLite as they are read.
        """
        if durability not in ("normal", "full"):
            raise ValueError(f"durability must be 'normal' or 'full', not {durability!r}")
        description, lock = _prepare(Path(path))
        inline = _store_bytes(description) <= INLINE_CHECK_BYTES
        try:
            db = await aiosqlite.connect(description, isolation_level=None, timeout=busy_timeout)
            try:
                meta = await _on_thread(
                    db, lambda conn: _setup(conn, description, durability, check_budget if inline else 0)
                )
                reader = await aiosqlite.connect(description, isolation_level=None, timeout=busy_timeout)
            except BaseException:
                await db.close()
                raise
            try:
                await _on_thread(reader, lambda conn: conn.execute("PRAGMA query_only = ON").fetchall())
            except BaseException:
                await reader.close()
                await db.close()
                raise
        except sqlite3.Error as exc:
            lock.release()
            raise _translate(description, "open", exc) from exc
        except OSError as exc:
            lock.release()
            raise StorageError(f"cannot open storage {description}: {exc}") from exc
        except BaseException:
            lock.release()
            raise
        storage = cls(description, db, reader, lock, meta)
        if not inline and check_budget > 0:
            storage._verifying = asyncio.create_task(storage._verify(check_budget), name="sqlite-quick-check")
        return storage

    @classmethod
    async def open_read_only(
        cls, path: str | os.PathLike[str], *, busy_timeout: float = 5.0
    ) -> SqliteStorage:
        """Open an existing database for reading only, beside the process that owns it.

        Takes no owner lock and writes nothing to the database (`mode=ro`); WAL lets this reader run beside
        the owner's commits. Every read of the handle runs in one read transaction started here, so what it
        returns is one consistent snapshot as of the open, however many commits land meanwhile. `commit()`
        raises `StorageRequestError`. Close it soon: the snapshot holds back WAL checkpoints past it.

        SQLite creates the `-wal` and `-shm` files if they are missing and, after a crash, rebuilds the WAL
        index in `-shm` (shared memory, not the database), so this also works when no owner runs.
        """
        file, description = _existing(Path(path))
        try:
            db = await aiosqlite.connect(
                f"{file.as_uri()}?mode=ro", uri=True, isolation_level=None, timeout=busy_timeout
            )
            try:
                meta = await _on_thread(db, lambda conn: _read_only_setup(conn, description))
            except BaseException:
                await db.close()
                raise
        except sqlite3.Error as exc:
            raise _translate(description, "open read-only", exc) from exc
        return cls(description, db, db, None, meta)

    @property
    def description(self) -> str:
        return self._path

    def _check(self) -> None:
        if self._closed:
            raise StorageClosed(f"storage {self._path} is closed")
        if self._damage is not None:
            raise self._damage

    async def _verify(self, budget: float) -> None:
        """The check at open of a store too big to wait for. Damage found makes every later call raise
        `StorageCorrupt` (a commit then stops the harness), after an ERROR log naming the path and the fix."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), BACKGROUND_CHECK_DELAY)
        if self._closing.is_set():
            return
        try:
            found = await asyncio.to_thread(_check_in_background, self._path, budget, self._stop_verifying)
        except Exception as exc:  # the check itself failed (not damage it found): say so, run on
            log.warning("storage %s: the background quick_check failed: %s", self._path, exc)
            return
        if found is not None:
            log.error("%s", found)
            self._damage = found

    async def _run(self, fn: Callable[[sqlite3.Connection], T], action: str) -> T:
        self._check()
        try:
            return await _on_thread(self._db, fn)
        except sqlite3.Error as exc:
            raise _translate(self._path, action, exc) from exc

    async def _rows(self, sql: str, params: Sequence[Any], action: str) -> list[Any]:
        return await self._run(lambda conn: conn.execute(sql, params).fetchall(), action)

    async def _scan_rows(self, sql: str, params: Sequence[Any], action: str) -> list[Any]:
        """Rows of a scan, read on the reader connection."""
        self._check()
        try:
            return await _on_thread(self._reader, lambda conn: conn.execute(sql, params).fetchall())
        except sqlite3.Error as exc:
            raise _translate(self._path, action, exc) from exc

    async def meta(self) -> StorageMeta:
        self._check()
        return StorageMeta(next_id=self._next_id, last_seq=self._last_seq)

    async def commit(self, batches: Sequence[CommitBatch]) -> None:
        self._check()
        if self.read_only:
            raise StorageRequestError(f"storage {self._path} is open read-only; commits need its owner")
        last = self._last_seq
        for batch in batches:
            if batch.seq <= last:
                raise StorageRequestError(f"commit seq {batch.seq} is not after {last}")
            if batch.ingress_finished:
                raise StorageRequestError(f"storage {self._path} keeps no ingress records to finish")
            last = batch.seq
        if not batches:
            return
        plan = plan_or_refuse(batches, self._next_id, self._reserved, _json, self._path)
        try:
            await self._run(lambda conn: _write(conn, plan), "commit")
        except asyncio.CancelledError:
            # Outcome uncertain (a cancelled caller does not stop the worker thread): resync from the
            # database, queued behind the write, so the cached meta never lags what is stored.
            with contextlib.suppress(Exception):
                await self._reload_meta()
            raise
        # Any other error came out of _write, which rolled the transaction back: nothing was stored.
        self._next_id = plan.next_id
        self._last_seq = plan.last_seq
        if plan.reserve is not None:
            self._reserved = plan.reserve
        self._uncheckpointed += 1
        if self._uncheckpointed >= _CHECKPOINT_EVERY and self._checkpointing is None:
            self._uncheckpointed = 0
            self._checkpointing = asyncio.create_task(self._checkpoint(), name="sqlite-checkpoint")

    async def _checkpoint(self) -> None:
        """Copy the WAL into the database file without blocking the writer (PASSIVE: frames a reader still
        needs stay for the next round). A failure loses nothing: the frames stay in the WAL, and SQLite's
        own checkpoint on the writer takes over if the WAL keeps growing."""
        try:
            await _on_thread(
                self._reader, lambda conn: conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            )
        except (sqlite3.Error, ValueError) as exc:  # ValueError: the reader closed meanwhile
            log.warning("storage %s: background WAL checkpoint failed: %s", self._path, exc)
        finally:
            self._checkpointing = None

    async def _reload_meta(self) -> None:
        rows = await self._rows("SELECT next_id, last_seq FROM meta WHERE id = 1", (), "read meta")
        self._next_id, self._last_seq = abs(int(rows[0][0])), int(rows[0][1])
        self._reserved = (self._next_id, self._last_seq)

    # --- documents ----------------------------------------------------------------------------------------

    async def find_document(
        self,
        kind: str,
        scope: DocScope,
        scope_id: int | None,
        key: str | None = None,
        *,
        at_seq: int | None = None,
    ) -> DocumentRecord | None:
        sql = (
            "SELECT retired_seq, record FROM doc_records "
            "WHERE kind = ? AND scope = ? AND scope_id IS ? AND key IS ?"
        )
        params: list[Any] = [kind, scope, scope_id, key]
        if at_seq is None:
            sql += " AND retired_seq IS NULL"
        else:
            sql += " AND created_seq <= ? AND (retired_seq IS NULL OR retired_seq > ?)"
            params += [at_seq, at_seq]
        rows = await self._rows(sql + " ORDER BY id DESC LIMIT 1", params, "find document")
        return None if not rows else self._doc_record(rows[0][1], rows[0][0])

    async def document(self, doc_id: int, *, at_seq: int | None = None) -> DocumentValue | None:
        def read(conn: sqlite3.Connection) -> tuple[Any, list[Any]]:
            row = conn.execute(
                "SELECT rewindable, created_seq, retired_seq, record, kind FROM doc_records WHERE id = ?",
                (doc_id,),
            ).fetchone()
            if row is None or not wants_contents(row[0], row[1], row[2], at_seq):
                return row, []
            return row, _content_tail(conn, doc_id, MAX_SEQ if at_seq is None else at_seq)

        row, content_rows = await self._run(read, "read document")
        return self._document_value(doc_id, row, content_rows, at_seq)

    async def scan_documents(
        self,
        *,
        scope: DocScope,
        scope_id: int | None = None,
        kind: str | None = None,
        alive_only: bool = True,
    ) -> list[DocumentRecord]:
        sql = "SELECT retired_seq, record FROM doc_records WHERE scope = ? AND scope_id IS ?"
        params: list[Any] = [scope, scope_id]
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        if alive_only:
            sql += " AND retired_seq IS NULL"
        rows = await self._scan_rows(sql + " ORDER BY id", params, "scan documents")
        return [self._doc_record(text, retired) for retired, text in rows]

    # --- operator requests (harness_core.storage.OperatorRequests) ------------------------------------------

    async def _requests(self, fn: Callable[[sqlite3.Connection], T], action: str) -> T:
        """Run a request-table call: on the writer thread for the owner; for a read-only handle on a short
        connection of its own (its snapshot would never see the owner's answers, and it must not write)."""
        self._check()
        if not self.read_only:
            return await self._run(fn, action)

        def once() -> T:
            conn = sqlite3.connect(self._path, isolation_level=None, timeout=5.0)
            try:
                return fn(conn)
            finally:
                conn.close()

        try:
            return await asyncio.to_thread(once)
        except sqlite3.Error as exc:
            raise _translate(self._path, action, exc) from exc

    async def put_operator_request(self, kind: str, args: dict[str, Any]) -> int:
        text = json.dumps(args)
        return await self._requests(lambda conn: _put_request(conn, kind, text), "queue an operator request")

    async def operator_request(self, request_id: int) -> OperatorRequest | None:
        return await self._requests(lambda conn: _get_request(conn, request_id), "read an operator request")

    async def withdraw_operator_request(self, request_id: int) -> bool:
        return await self._requests(
            lambda conn: _settle_request(conn, request_id, "withdrawn", None), "withdraw an operator request"
        )

    async def pending_operator_requests(self, limit: int = 20) -> list[OperatorRequest]:
        return await self._requests(lambda conn: _pending_requests(conn, limit), "read operator requests")

    async def claim_operator_request(self, request_id: int) -> bool:
        return await self._requests(
            lambda conn: _settle_request(conn, request_id, "taken", None), "take an operator request"
        )

    async def finish_operator_request(
        self, request_id: int, status: Literal["done", "failed"], outcome: dict[str, Any]
    ) -> bool:
        text = json.dumps(outcome)
        return await self._requests(
            lambda conn: _settle_request(conn, request_id, status, text, taken_too=True),
            "finish an operator request",
        )

    async def close(self) -> None:
        """Checkpoint the WAL into the database file, close the connection, release the owner lock."""
        if self._closed:
            return
        self._closed = True
        if self._lock is None:  # read-only: end the snapshot, nothing to write back or release
            await self._db.close()
            return
        try:
            self._closing.set()
            self._stop_verifying.set()  # interrupts the check at its next progress callback
            for task in (self._checkpointing, self._verifying):
                if task is not None:
                    await asyncio.gather(task, return_exceptions=True)
            await self._reader.close()  # first: an open reader would keep the checkpoint from truncating
            exact = (self._next_id, self._last_seq)
            with contextlib.suppress(sqlite3.Error):  # if it fails the reservation stays: still never reused
                await _on_thread(self._db, lambda conn: conn.execute(_SET_META, exact).fetchall())
            try:
                await _on_thread(
                    self._db, lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                )
            except sqlite3.Error:
                pass  # the WAL is durable as it is and the next open replays it
            await self._db.close()
        finally:
            self._lock.release()
