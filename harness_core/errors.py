"""Errors raised by the harness. Each says what went wrong in words an operator can act on."""

from __future__ import annotations


class HarnessError(Exception):
    """Base class for harness errors."""


class StorageError(HarnessError):
    """A storage backend failed. Raised inside a commit it closes the harness with reason `failed`."""


class StorageLocked(StorageError):
    """Another process owns this storage (it holds the owner lock)."""

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(f"storage {path} is in use by another process ({holder}); stop it first")
        self.path = path
        self.holder = holder


class LeaseLost(StorageError):
    """This process no longer owns the PostgreSQL partition (another took over, or renewal failed past the
    lease's safe validity). Nothing more may be committed or sent; the process should stop."""


class StorageCorrupt(StorageError):
    """Stored data that was confirmed by a commit cannot be read back."""


class StorageClosed(StorageError):
    """The storage was used after close()."""


class StorageRequestError(StorageError):
    """A read asked for something the storage cannot answer (a bad cursor, a wrong order). Not fatal."""


class StrictJsonError(HarnessError, ValueError):
    """A value is not strict JSON (NaN, infinity, a set, a function, a non-string key...)."""


class ReadAfterWrite(HarnessError):
    """A table read after a table write in the same commit callback."""


class DraftRevoked(HarnessError):
    """A document draft was used after its commit callback finished."""


class HarnessClosed(HarnessError):
    """The harness is closing or closed; `reason` is `closed` or `failed`."""

    def __init__(self, reason: str = "closed", cause: BaseException | None = None) -> None:
        detail = f": {cause}" if cause is not None else ""
        super().__init__(f"harness {reason}{detail}")
        self.reason = reason
        self.cause = cause


class RequestIdConflict(HarnessError):
    """A request id was reused with a different submission type or content."""


class ConversationBusy(HarnessError):
    """`when_busy="reject"` on a busy conversation."""


class NotFound(HarnessError, LookupError):
    """An id that does not name a record."""


class InvalidOperation(HarnessError):
    """An operation not allowed in the record's current state (e.g. an owner that already finished)."""


class DocumentVersionError(HarnessError):
    """A stored document version is newer than its definition, or older without a migration."""
