"""Ids in play for log records: which conversation, task, submission, place, platform message.

Code that starts work for one of these binds its ids with `log_context(...)`; an `asyncio` task created inside
inherits them (tasks copy the context when they are created), so every record logged by that work can carry
them. A log formatter reads them with `log_ids()` (the bots' JSON log format does). Binding costs one context
variable set and reset; nothing is formatted unless a record is emitted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_IDS: ContextVar[dict[str, Any] | None] = ContextVar("harness_core_log_ids", default=None)


def log_ids() -> dict[str, Any]:
    """The ids bound in the current context (a copy)."""
    return dict(_IDS.get() or {})


@contextmanager
def log_context(**ids: Any) -> Iterator[None]:
    """Bind ids (None values are skipped) for the code inside, and for tasks it creates."""
    token = _IDS.set({**(_IDS.get() or {}), **{k: v for k, v in ids.items() if v is not None}})
    try:
        yield
    finally:
        _IDS.reset(token)
