"""The chat's own durable store: channels, messages (human, bot, approval cards) and an append-only event log.

devchat is a chat platform of its own; this file is its database, separate from the harness storage. Every
change is one SQLite transaction that also appends an event (`{"type": "message" | "channel", ...}`); the event's
sequence number is the cursor a page resumes from. Listeners (the websocket hub) hear about events only after
their transaction committed, under the store's write lock, so they see them in sequence order. Old events are
pruned (`keep_events`); a client behind the pruned range gets a snapshot instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS channels (
    name TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    created_by TEXT
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    channel TEXT NOT NULL REFERENCES channels(name),
    thread INTEGER REFERENCES messages(id),
    kind TEXT NOT NULL CHECK (kind IN ('human', 'bot', 'approval')),
    author TEXT NOT NULL,
    text TEXT NOT NULL,
    key TEXT,
    client_id TEXT,
    gate TEXT,
    final INTEGER NOT NULL DEFAULT 1,
    created_at INTEGER NOT NULL,
    edited_at INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS messages_client ON messages(client_id) WHERE client_id IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS messages_key ON messages(channel, key) WHERE key IS NOT NULL;
CREATE INDEX IF NOT EXISTS messages_place ON messages(channel, thread, id);
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL);
"""

COLUMNS = "id, channel, thread, kind, author, text, key, client_id, gate, final, created_at, edited_at"
SNAPSHOT_MESSAGES = 5_000
MAX_BACKLOG = 2_000  # a client further behind than this gets a snapshot


class StoreLocked(RuntimeError):
    """Another process has this devchat store open."""


def now_ms() -> int:
    return int(time.time() * 1000)


def _row(row: Any) -> dict[str, Any]:
    (
        id_,
        channel,
        thread,
        kind,
        author,
        text,
        key,
        client_id,
        gate,
        final,
        created_at,
        edited_at,
    ) = row
    message: dict[str, Any] = {
        "id": int(id_),
        "channel": channel,
        "thread": thread,
        "kind": kind,
        "author": author,
        "text": text,
        "final": bool(final),
        "created_at": created_at,
        "edited_at": edited_at,
    }
    if kind == "human":
        message["client_id"] = client_id
    else:
        message["key"] = key
    if gate is not None:
        message["gate"] = json.loads(gate)
    return message


@dataclass
class Snapshot:
    epoch: str
    cursor: int
    channels: list[dict[str, Any]]
    messages: list[dict[str, Any]]


Listener = Callable[[list[dict[str, Any]]], None]


class Writer:
    """One open write transaction: queries plus the events it appends."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.events: list[dict[str, Any]] = []

    async def one(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        async with self.db.execute(sql, params) as cursor:
            return await cursor.fetchone()

    async def run(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        async with self.db.execute(sql, params) as cursor:
            return int(cursor.lastrowid or 0)

    async def message(self, message_id: int) -> dict[str, Any] | None:
        row = await self.one(f"SELECT {COLUMNS} FROM messages WHERE id = ?", (message_id,))
        return None if row is None else _row(row)

    async def emit(self, body: dict[str, Any]) -> None:
        seq = await self.run("INSERT INTO events (body) VALUES (?)", (json.dumps(body),))
        self.events.append({"seq": seq, **body})


class ChatStore:
    """`epoch` changes with the store (a page's cursor means nothing in another one). `store_id` is minted with
    the file and goes into every place key, hence every request id: a post in a new store (the old file deleted)
    never reuses the id of a post in the old one. Stores created before store ids have "" and keep their ids."""

    def __init__(
        self, path: Path, db: Any, lock_fd: int, epoch: str, keep_events: int, store_id: str = ""
    ) -> None:
        self.path = path
        self.db = db
        self.epoch = epoch
        self.store_id = store_id
        self.keep_events = keep_events
        self.lock = asyncio.Lock()  # one writer; readers that must not interleave with writes take it too
        self.listeners: list[Listener] = []
        self._lock_fd: int | None = lock_fd
        self.closed = False

    # --- lifecycle --------------------------------------------------------------------------------------------

    @classmethod
    async def open(cls, path: Path, *, keep_events: int = 10_000) -> ChatStore:
        path = Path(path)
        if not path.parent.exists():
            path.parent.mkdir(parents=True, mode=0o700)
        lock_fd = _take_lock(path)
        try:
            # Create the file 0600 before SQLite does (its -wal/-shm files copy the database's permissions).
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            db = await aiosqlite.connect(str(path), isolation_level=None)
        except BaseException:
            os.close(lock_fd)
            raise
        try:
            await db.execute("PRAGMA journal_mode = WAL")
            # NORMAL: a committed transaction survives the process dying (SIGKILL); only an OS crash can lose
            # the last few, and the bridge reconciles bot messages by key either way.
            await db.execute("PRAGMA synchronous = NORMAL")
            await db.execute("PRAGMA foreign_keys = ON")
            await db.executescript(SCHEMA)
            async with db.execute("SELECT value FROM meta WHERE key = 'epoch'") as cursor:
                row = await cursor.fetchone()
            if row is None:  # a new store
                epoch, store_id = secrets.token_hex(8), secrets.token_hex(4)
                await db.execute("BEGIN IMMEDIATE")
                await db.execute("INSERT INTO meta (key, value) VALUES ('epoch', ?)", (epoch,))
                await db.execute("INSERT INTO meta (key, value) VALUES ('store_id', ?)", (store_id,))
                await db.execute("COMMIT")
            else:
                epoch = str(row[0])
                async with db.execute("SELECT value FROM meta WHERE key = 'store_id'") as cursor:
                    found = await cursor.fetchone()
                if found is None:  # created before store ids: its posts were taken in under the old ids
                    await db.execute("INSERT INTO meta (key, value) VALUES ('store_id', '')")
                store_id = "" if found is None else str(found[0])
        except BaseException:
            await db.close()
            os.close(lock_fd)
            raise
        return cls(path, db, lock_fd, epoch, keep_events, store_id)

    async def close(self) -> None:
        async with self.lock:
            if self.closed:
                return
            self.closed = True
            await self.db.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    # --- writing ----------------------------------------------------------------------------------------------

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Writer]:
        """A transaction; its events reach the listeners after COMMIT, still in sequence order."""
        async with self.lock:
            await self.db.execute("BEGIN IMMEDIATE")
            writer = Writer(self.db)
            try:
                yield writer
                if writer.events:
                    await self._prune(writer)
                await self.db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):  # nothing to roll back when COMMIT itself went through
                    await self.db.execute("ROLLBACK")
                raise
            if writer.events:
                for listener in list(self.listeners):
                    listener(writer.events)

    async def _prune(self, writer: Writer) -> None:
        last = int(writer.events[-1]["seq"])
        if last % 256 == 0 and last > self.keep_events:
            through = last - self.keep_events
            await writer.run("DELETE FROM events WHERE seq <= ?", (through,))
            await writer.run(
                "INSERT INTO meta (key, value) VALUES ('pruned_through', ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (str(through),),
            )

    async def add_channel(self, name: str, created_by: str | None) -> bool:
        """Create a channel; False when it already exists."""
        async with self.write() as w:
            if await w.one("SELECT 1 FROM channels WHERE name = ?", (name,)) is not None:
                return False
            at = now_ms()
            await w.run(
                "INSERT INTO channels (name, created_at, created_by) VALUES (?, ?, ?)", (name, at, created_by)
            )
            await w.emit({"type": "channel", "channel": {"name": name, "created_at": at}})
            return True

    async def add_human(
        self, channel: str, thread: int | None, author: str, text: str, client_id: str
    ) -> tuple[dict[str, Any], bool]:
        """Store a post from the page once per `client_id`. Returns (message, created)."""
        async with self.write() as w:
            row = await w.one(f"SELECT {COLUMNS} FROM messages WHERE client_id = ?", (client_id,))
            if row is not None:
                return _row(row), False
            message_id = await w.run(
                "INSERT INTO messages (channel, thread, kind, author, text, client_id, created_at) "
                "VALUES (?, ?, 'human', ?, ?, ?, ?)",
                (channel, thread, author, text, client_id, now_ms()),
            )
            message = await w.message(message_id)
            assert message is not None
            await w.emit({"type": "message", "message": message})
            return message, True

    async def add_bot(
        self,
        channel: str,
        thread: int | None,
        *,
        kind: str,
        author: str,
        text: str,
        key: str,
        gate: dict[str, Any] | None = None,
        final: bool = True,
    ) -> tuple[dict[str, Any], bool]:
        """Store a bot message once per (channel, key); a repeated key returns the message already there."""
        async with self.write() as w:
            row = await w.one(f"SELECT {COLUMNS} FROM messages WHERE channel = ? AND key = ?", (channel, key))
            if row is not None:
                return _row(row), False
            message_id = await w.run(
                "INSERT INTO messages (channel, thread, kind, author, text, key, gate, final, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    channel,
                    thread,
                    kind,
                    author,
                    text,
                    key,
                    None if gate is None else json.dumps(gate),
                    int(final),
                    now_ms(),
                ),
            )
            message = await w.message(message_id)
            assert message is not None
            await w.emit({"type": "message", "message": message})
            return message, True

    async def update(
        self,
        message_id: int,
        *,
        text: str | None = None,
        gate: dict[str, Any] | None = None,
        final: bool | None = None,
    ) -> dict[str, Any] | None:
        """Change a bot message (text, approval state, final flag). None when there is no such message."""
        async with self.write() as w:
            current = await w.message(message_id)
            if current is None or current["kind"] == "human":
                return None
            new_text = current["text"] if text is None else text
            new_gate = current.get("gate") if gate is None else gate
            new_final = current["final"] if final is None else final
            if (new_text, new_gate, new_final) == (current["text"], current.get("gate"), current["final"]):
                return current
            await w.run(
                "UPDATE messages SET text = ?, gate = ?, final = ?, edited_at = ? WHERE id = ?",
                (
                    new_text,
                    None if new_gate is None else json.dumps(new_gate),
                    int(new_final),
                    now_ms(),
                    message_id,
                ),
            )
            message = await w.message(message_id)
            assert message is not None
            await w.emit({"type": "message", "message": message})
            return message

    async def delete_bot(self, message_id: int) -> bool:
        """Delete a bot message (a reply part no longer needed). True when it is gone (also when it was gone
        already); False when it must stay because a thread hangs off it."""
        async with self.write() as w:
            current = await w.message(message_id)
            if current is None:
                return True
            if current["kind"] == "human":
                return False
            if await w.one("SELECT 1 FROM messages WHERE thread = ? LIMIT 1", (message_id,)) is not None:
                return False
            await w.run("DELETE FROM messages WHERE id = ?", (message_id,))
            await w.emit({"type": "deleted", "id": message_id, "channel": current["channel"]})
            return True

    # --- reading ----------------------------------------------------------------------------------------------

    async def _all(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        async with self.db.execute(sql, params) as cursor:
            return list(await cursor.fetchall())

    async def message(self, message_id: int) -> dict[str, Any] | None:
        rows = await self._all(f"SELECT {COLUMNS} FROM messages WHERE id = ?", (message_id,))
        return _row(rows[0]) if rows else None

    async def channels(self) -> list[dict[str, Any]]:
        rows = await self._all("SELECT name, created_at FROM channels ORDER BY created_at, name")
        return [{"name": name, "created_at": at} for name, at in rows]

    async def has_channel(self, name: str) -> bool:
        return bool(await self._all("SELECT 1 FROM channels WHERE name = ?", (name,)))

    async def find_key(self, channel: str, thread: int | None, key: str) -> int | None:
        rows = await self._all(
            "SELECT id FROM messages WHERE channel = ? AND thread IS ? AND key = ?", (channel, thread, key)
        )
        return int(rows[0][0]) if rows else None

    async def find_key_anywhere(self, key: str) -> int | None:
        rows = await self._all("SELECT id FROM messages WHERE key = ?", (key,))
        return int(rows[0][0]) if rows else None

    async def humans_after(self, channel: str, thread: int | None, after: int | None) -> list[dict[str, Any]]:
        rows = await self._all(
            f"SELECT {COLUMNS} FROM messages WHERE channel = ? AND thread IS ? AND kind = 'human' AND id > ? "
            "ORDER BY id",
            (channel, thread, after or 0),
        )
        return [_row(r) for r in rows]

    async def human_places(self) -> list[tuple[str, int | None]]:
        rows = await self._all("SELECT DISTINCT channel, thread FROM messages WHERE kind = 'human'")
        return [(str(channel), None if thread is None else int(thread)) for channel, thread in rows]

    async def last_seq(self) -> int:
        rows = await self._all("SELECT seq FROM sqlite_sequence WHERE name = 'events'")
        return int(rows[0][0]) if rows else 0

    async def snapshot(self) -> Snapshot:
        """Channels and the newest messages, with the cursor they reflect. Call under `lock` when the result
        must not interleave with writes."""
        rows = await self._all(
            f"SELECT {COLUMNS} FROM messages ORDER BY id DESC LIMIT ?", (SNAPSHOT_MESSAGES,)
        )
        return Snapshot(
            self.epoch, await self.last_seq(), await self.channels(), [_row(r) for r in reversed(rows)]
        )

    async def events_after(self, cursor: int) -> list[dict[str, Any]] | None:
        """Events after `cursor`, or None when they are no longer all available (pruned, too many, or a cursor
        from the future): the client needs a snapshot."""
        last = await self.last_seq()
        if cursor > last:
            return None
        pruned = await self._all("SELECT value FROM meta WHERE key = 'pruned_through'")
        if pruned and cursor < int(pruned[0][0]):
            return None
        if last - cursor > MAX_BACKLOG:
            return None
        rows = await self._all("SELECT seq, body FROM events WHERE seq > ? ORDER BY seq", (cursor,))
        return [{"seq": int(seq), **json.loads(body)} for seq, body in rows]


def _take_lock(path: Path) -> int:
    """An flock on `<store>.lock`: the kernel drops it when this process dies, so SIGKILL never leaves it stale."""
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown"
        os.close(fd)
        raise StoreLocked(f"devchat store {path} is open in another process ({holder})") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
    return fd
