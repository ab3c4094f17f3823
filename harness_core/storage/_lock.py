"""The owner lock: one process owns a persistent storage at a time.

An `fcntl.flock` on a sidecar file. The kernel drops it when the holder's last descriptor closes, which
includes the process dying for any reason, so a SIGKILLed owner never blocks its successor and there is no
stale-lock cleanup to get wrong. flock locks belong to an open file description, so a second open inside the
same process conflicts too. The holder writes who it is into the file so a refused opener can name it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from harness_core.errors import StorageError, StorageLocked


def _describe_holder(raw: bytes) -> str:
    try:
        info = json.loads(raw.decode("utf-8"))
        return f"pid {int(info['pid'])} on host {info['host']}, started {info['started']}"
    except (ValueError, KeyError, TypeError):
        # The holder took the lock but has not written its name yet (or the file is foreign).
        return "holder unknown"


class OwnerLock:
    """An acquired owner lock. `release()` is idempotent."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: Path, storage: str) -> OwnerLock:
        """Take the lock at `path` without waiting; `StorageLocked` names the holder when it is taken."""
        try:
            # os.open descriptors are non-inheritable, so child processes never keep the lock alive.
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StorageError(f"cannot open lock file {path} for storage {storage}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(os.pread(fd, 4096, 0))
            os.close(fd)
            raise StorageLocked(storage, holder) from None
        except OSError as exc:
            os.close(fd)
            raise StorageError(f"cannot lock {path} for storage {storage}: {exc}") from exc
        try:
            started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started})
            os.ftruncate(fd, 0)
            os.pwrite(fd, info.encode("utf-8") + b"\n", 0)
        except OSError as exc:
            os.close(fd)
            raise StorageError(f"cannot write lock file {path} for storage {storage}: {exc}") from exc
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        # Never unlinked: another opener may already hold a descriptor of this inode, and a newcomer would
        # then create and lock a different file, giving two owners.
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        os.close(fd)  # closing the last descriptor releases the flock
