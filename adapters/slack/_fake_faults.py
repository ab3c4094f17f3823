"""Fault injection for the fake Slack: injected errors, request hooks, process kills (private module)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from adapters.slack._fake_model import JsonDict, RecordedCall

HookWhen = Literal["before", "after_effect"]


@dataclass(frozen=True)
class DropConnection:
    """Hook result: close the HTTP connection without any response (the client sees a disconnect)."""


DROP = DropConnection()
"""The :class:`DropConnection` instance to return from a request hook."""


@dataclass(frozen=True)
class Respond:
    """Hook result: answer with this instead (for a ``before`` hook the method's effect is not applied)."""

    body: JsonDict
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


HookResult = DropConnection | Respond | None
HookFunc = Callable[[RecordedCall], "Awaitable[HookResult] | HookResult"]


@dataclass
class RequestHook:
    """A registered request hook (see ``FakeSlack.on_request``)."""

    method: str
    when: HookWhen
    func: HookFunc
    remaining: int | None
    match: Callable[[RecordedCall], bool] | None
    fired: list[RecordedCall] = field(default_factory=list)
    """Calls the hook ran for."""

    @property
    def active(self) -> bool:
        return self.remaining is None or self.remaining > 0

    def remove(self) -> None:
        """Disarm the hook."""
        self.remaining = 0

    def applies_to(self, call: RecordedCall, when: HookWhen) -> bool:
        return (
            self.active
            and self.when == when
            and self.method in (call.method, "*")
            and (self.match is None or self.match(call))
        )


@dataclass
class Fault:
    """An injected failure for the next calls of a method (see ``FakeSlack.rate_limit`` / ``fail``)."""

    method: str
    remaining: int | None
    error: str
    status: int
    retry_after: int | None
    after_effect: bool
    match: Callable[[RecordedCall], bool] | None
    hits: list[RecordedCall] = field(default_factory=list)
    """Calls that got this fault."""

    @property
    def active(self) -> bool:
        return self.remaining is None or self.remaining > 0

    def cancel(self) -> None:
        self.remaining = 0

    def applies_to(self, call: RecordedCall, *, after_effect: bool) -> bool:
        return (
            self.active
            and self.after_effect == after_effect
            and self.method in (call.method, "*")
            and (self.match is None or self.match(call))
        )


class Faults:
    """The armed faults and hooks of one fake."""

    def __init__(self) -> None:
        self.faults: list[Fault] = []
        self.hooks: list[RequestHook] = []

    def take_fault(self, call: RecordedCall, *, after_effect: bool) -> Fault | None:
        for fault in self.faults:
            if fault.applies_to(call, after_effect=after_effect):
                if fault.remaining is not None:
                    fault.remaining -= 1
                fault.hits.append(call)
                return fault
        return None

    async def run_hooks(self, call: RecordedCall, when: HookWhen) -> HookResult:
        """Run the matching hooks in registration order; the first non-``None`` result wins."""
        for hook in list(self.hooks):
            if not hook.applies_to(call, when):
                continue
            if hook.remaining is not None:
                hook.remaining -= 1
            hook.fired.append(call)
            result = hook.func(call)
            if isinstance(result, Awaitable):
                result = await result
            if isinstance(result, (DropConnection, Respond)):
                return result
        return None

    def clear(self) -> None:
        for fault in self.faults:
            fault.cancel()
        for hook in self.hooks:
            hook.remove()
        self.faults.clear()
        self.hooks.clear()


def _process_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``Z`` zombie...), ``""`` if gone, ``None`` if unknowable."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return ""
    except OSError:
        return None
    return fields[0] if fields else ""


async def kill_process(pid: int, sig: int = signal.SIGKILL, *, timeout: float = 5.0) -> None:
    """Send ``sig`` to ``pid`` and wait until the process is dead (a zombie counts as dead).

    Waiting matters: a SIGKILLed process on another CPU could otherwise still read a response written
    right after ``kill()`` returned.
    """
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _process_state(pid)
        if state is None:  # no /proc: give the signal a moment
            await asyncio.sleep(0.1)
            return
        if state in ("", "Z", "X", "x"):
            return
        await asyncio.sleep(0.005)
