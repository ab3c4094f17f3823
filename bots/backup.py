"""`durable-bots backup FILE`: a consistent copy of the storage, safe while the bot runs.

SQLite's online backup API copies the database in one step inside one read transaction, so the copy is the
database as of one commit, while the bot (a WAL writer) keeps committing. The copy is written to
`FILE.part` created 0600 (it holds every conversation), switched from WAL to a rollback journal so it is one
self-contained file, checked (`PRAGMA quick_check`), synced and then renamed to FILE: a failed backup never
leaves a half file under the name. A PostgreSQL store is backed up with the server's own tools (`pg_dump`);
`backup` says so instead of looking for a file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path

from bots.config import BotConfig, ConfigError
from bots.runtime import EXIT_ERROR, EXIT_STORAGE, BotError
from harness_core.storage import redact_url


def sqlite_source(config: BotConfig, env: Mapping[str, str]) -> Path:
    """The SQLite file to back up; BotError when the storage is PostgreSQL (named without its password)."""
    try:
        target = config.storage_target(env)
    except ConfigError as exc:
        raise BotError(str(exc)) from None
    if target.kind == "postgres":
        assert target.url is not None
        raise BotError(
            f"the storage is PostgreSQL ({redact_url(target.url)}): back it up with pg_dump or the provider's "
            "backups; `backup` copies a SQLite file"
        )
    return target.path or config.storage_path


def check_target(target: Path) -> None:
    """Refuse a target that is there and not a regular file: the copy is renamed over it, and a rename
    would replace a device, a pipe or a socket (as root, `backup /dev/sda`), or fail on a directory."""
    if (target.exists() or target.is_symlink()) and not target.is_file():
        raise BotError(f"{target} is there and is not a regular file; name a new file or a regular one")


def target_error(target: Path, exc: OSError) -> BotError:
    """One line for a file that cannot be written (missing or unwritable folder, full disk)."""
    where = exc.filename or target
    # A read-only file system or a full disk is the storage class of failure (exit 3), like the store's own.
    code = EXIT_STORAGE if exc.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT) else EXIT_ERROR
    return BotError(f"cannot write {target}: {exc.strerror or exc} ({where})", code)


def backup_storage(source: Path, target: Path) -> int:
    """Copy `source` to `target` (mode 0600); returns the copy's size in bytes."""
    try:
        return _backup(source, target)
    except OSError as exc:
        raise target_error(target, exc) from None


def _backup(source: Path, target: Path) -> int:
    if not source.is_file():
        raise BotError(f"there is no storage at {source} yet (has the bot run with this config?)")
    if target.absolute() == source.absolute():
        raise BotError("the backup must go to another file than the storage itself")
    check_target(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    with contextlib.suppress(FileNotFoundError):
        part.unlink()
    os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        src = sqlite3.connect(f"{source.absolute().as_uri()}?mode=ro", uri=True, timeout=10.0)
        try:
            dst = sqlite3.connect(part, isolation_level=None)
            try:
                src.backup(dst, pages=-1)  # one step: one snapshot, never restarted by the bot's commits
                dst.execute("PRAGMA journal_mode = DELETE")
                (check,) = dst.execute("PRAGMA quick_check").fetchone()
                if check != "ok":
                    raise BotError(f"the copy of {source} does not check out ({check}); nothing was written")
            finally:
                dst.close()
        finally:
            src.close()
        with open(part, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(part, 0o600)
        part.replace(target)
    except sqlite3.Error as exc:
        raise BotError(f"backup of {source} failed: {exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            part.unlink()
    return target.stat().st_size
