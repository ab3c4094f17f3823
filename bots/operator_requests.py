"""Operator commands that change a running bot: `retry`, `cancel`, `approvals decide`.

While the bot runs it owns the storage, so the command queues a durable request in it
(`harness_core.storage.OperatorRequests`); the bot's `OperatorDesk` picks requests up within a second, carries
each out through the ordinary harness API (`retry_task`, `abort_task`, the bridge's approval decision marked as
an operator override) and writes the outcome back, which the command prints. A request the bot does not pick
up in time is withdrawn, so nothing happens later behind the operator's back.

Request kinds and arguments: `retry {"task": id}`, `cancel {"task": id}`,
`decide {"gate": id, "approve": bool, "name": who}`. Outcomes: `{"message": text, ...}`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from adapters.bridge import Bridge
from bots.background import OwnedLoop
from harness_core import Harness, InvalidOperation, NotFound, Task
from harness_core.messages import ToolCall
from harness_core.storage import OperatorRequest, OperatorRequests

log = logging.getLogger("bots.operator")
POLL_INTERVAL = 0.25
CARRY_OUT_TIMEOUT = 10.0

Outcome = tuple[Literal["done", "failed"], dict[str, Any]]


def operator_label(name: str) -> str:
    """How an operator's decision is shown (on the approval card, in `approvals`)."""
    return f"{name} (operator override)"


async def tool_call_of(harness: Harness, task: Task) -> ToolCall | None:
    """The model's call behind a `core.tool` task (its name and arguments)."""
    if task.kind != "core.tool" or not isinstance(task.input, dict):
        return None
    entry = await harness.entry(int(task.input.get("assistant", 0)))
    for message in entry.model or () if entry is not None else ():
        for part in getattr(message, "content", ()):
            if isinstance(part, ToolCall) and part.id == task.input.get("call_id"):
                return part
    return None


async def task_label(harness: Harness, task_id: int) -> str | None:
    task = await harness.get_task(task_id)
    if task is None:
        return None
    call = await tool_call_of(harness, task)
    return task.kind + (f" {call.name}" if call else "")


async def retry(harness: Harness, task_id: int) -> Outcome:
    label = await task_label(harness, task_id)
    try:
        await harness.retry_task(task_id)
    except NotFound:
        return "failed", {"message": f"there is no task {task_id}"}
    except InvalidOperation:
        return "failed", {"message": f"task {task_id} already ended; nothing to retry"}
    return "done", {
        "message": f"task {task_id} ({label}) is scheduled again",
        "task": task_id,
        "label": label,
    }


async def cancel(harness: Harness, task_id: int) -> Outcome:
    label = await task_label(harness, task_id)
    try:
        marked = await harness.abort_task(task_id)
    except NotFound:
        return "failed", {"message": f"there is no task {task_id}"}
    if marked == "terminal":
        return "failed", {"message": f"task {task_id} ({label}) already ended; nothing to cancel"}
    return "done", {"message": f"task {task_id} ({label}) is being cancelled", "task": task_id}


async def decide(bridge: Bridge, gate_id: int, approve: bool, name: str) -> Outcome:
    who = operator_label(name)
    decision = await bridge.decide(
        gate_id,
        user_id=f"operator:{name}",
        user_name=who,
        action="approve" if approve else "deny",
        operator=True,
    )
    if decision.accepted:
        return "done", {"message": f"gate {gate_id} {decision.status} by {who}", "status": decision.status}
    if decision.reason == "unknown_gate":
        return "failed", {"message": f"there is no approval request {gate_id} (see `durable-bots approvals`)"}
    if decision.reason == "expired":
        return "failed", {"message": f"gate {gate_id} expired before the decision; it counts as denied"}
    by = f" by {decision.decided_by}" if decision.decided_by else ""
    return "failed", {
        "message": f"gate {gate_id} was already {decision.status}{by}",
        "status": decision.status,
    }


async def carry_out(harness: Harness, bridge: Bridge, request: OperatorRequest) -> Outcome:
    args = request.args
    try:
        if request.kind == "retry":
            return await retry(harness, int(args["task"]))
        if request.kind == "cancel":
            return await cancel(harness, int(args["task"]))
        if request.kind == "decide":
            return await decide(bridge, int(args["gate"]), bool(args["approve"]), str(args["name"]))
    except (KeyError, TypeError, ValueError) as exc:
        return "failed", {"message": f"malformed {request.kind} request: {exc!r}"}
    return "failed", {"message": f"unknown operator request {request.kind!r}"}


class OperatorDesk(OwnedLoop):
    """In the running bot: polls the storage for operator requests and carries them out, one at a time.
    Owns its polling task (`start()` / `stop()`)."""

    task_name = "operator-desk"

    def __init__(self, storage: OperatorRequests, harness: Harness, bridge: Bridge) -> None:
        self.storage = storage
        self.harness = harness
        self.bridge = bridge

    async def _run(self) -> None:
        while True:
            try:
                for request in await self.storage.pending_operator_requests():
                    await self.handle(request)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broken request or a storage hiccup must not end the desk
                log.warning("operator requests: %s", exc)
            await asyncio.sleep(POLL_INTERVAL)

    async def handle(self, request: OperatorRequest) -> None:
        log.info("operator request %d: %s %s", request.id, request.kind, request.args)
        if request.status == "pending" and not await self.storage.claim_operator_request(request.id):
            log.info("operator request %d was withdrawn before it was taken", request.id)
            return
        try:
            status, outcome = await asyncio.wait_for(
                carry_out(self.harness, self.bridge, request), CARRY_OUT_TIMEOUT
            )
        except TimeoutError:
            status, outcome = (
                "failed",
                {"message": f"not done within {CARRY_OUT_TIMEOUT:g} s; check `inspect`"},
            )
        except Exception as exc:  # answered, not left pending: a request that breaks would come back forever
            log.warning("operator request %d failed: %r", request.id, exc)
            status, outcome = "failed", {"message": f"{request.kind} failed: {type(exc).__name__}: {exc}"}
        if not await self.storage.finish_operator_request(request.id, status, outcome):
            log.warning("operator request %d was withdrawn while it was carried out", request.id)


async def ask_running_bot(
    storage: OperatorRequests,
    kind: str,
    args: dict[str, Any],
    *,
    timeout: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> OperatorRequest | None:
    """Queue a request and wait for the running bot's outcome; None (and the request withdrawn) when the
    bot did not pick it up within `timeout` seconds."""
    request_id = await storage.put_operator_request(kind, args)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        found = await storage.operator_request(request_id)
        if found is not None and found.status not in ("pending", "taken"):
            return found
        if found is None:  # deleted under us (pruned, the table emptied by hand): nothing will answer it
            raise NotFound(
                f"operator request {request_id} is no longer in the request table (pruned or deleted by hand); "
                "whether it was carried out is unknown: see `durable-bots inspect`"
            )
        now = loop.time()
        if now >= deadline and (found is None or found.status == "pending"):
            if await storage.withdraw_operator_request(request_id):
                return None
            continue  # taken or finished just now: read it again
        if found is not None and now >= deadline + CARRY_OUT_TIMEOUT + 2:
            return found  # taken, and no outcome yet: the caller says so (it may still finish)
        await sleep(0.1)
