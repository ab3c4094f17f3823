"""Operator commands over the bot's storage: inspect, tasks, retry, approvals, export, check-config.

Each opens the storage like the bot does (same registry, same owner lock or PostgreSQL lease) without starting
to schedule, so what it shows is what the bot would resume. While the bot runs (the lock or lease is held),
the reading commands (inspect, tasks, approvals, export) open the storage read-only instead: no lock, no
lease, no write, tasks shown as the running bot stored them. Commands that change something go through the
running bot (`bots.operator_requests`), on either backend. The store is named by its `description` (a
PostgreSQL URL without its password).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TextIO

from adapters.bridge import ApprovalDoc, PlaceOfDoc
from adapters.bridge.approvals import GATE_TASK
from adapters.redact import redact_url
from bots.admin import is_loopback
from bots.config import BotConfig, ConfigError, Problem
from bots.operator_requests import ask_running_bot, decide, tool_call_of
from bots.ops import place_label
from bots.runtime import (
    EXIT_ERROR,
    EXIT_LOCKED,
    EXIT_OK,
    BotError,
    Runtime,
    adapter_factory,
    adapter_problem,
    check_tools,
    enabled_tools,
    env_problem,
    known_tools,
    open_runtime,
    open_storage,
)
from harness_core import NotFound, Task
from harness_core.records import Entry
from harness_core.storage import OperatorRequest, OperatorRequests
from harness_core.storage import redact_url as redact_storage_url

LOCK_HINT = "operator commands need the storage to themselves: stop the bot, run the command, start it again"
REQUEST_TIMEOUT = 10.0  # how long a command waits for the running bot to pick its request up


def _when(ms: Any) -> str:
    if not isinstance(ms, (int, float)):
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


async def _operator_runtime(config: BotConfig, env: Mapping[str, str], *, reading: bool = False) -> Runtime:
    """The storage as owner; for a `reading` command, a read-only snapshot when the bot holds it."""
    try:
        return await open_runtime(config, env, must_exist=True)
    except BotError as exc:
        if exc.exit_code != EXIT_LOCKED:
            raise
        if not reading:
            raise BotError(f"{exc} ({LOCK_HINT})", exc.exit_code) from None
    return await open_runtime(config, env, must_exist=True, read_only=True)


def _snapshot(runtime: Runtime) -> bool:
    """Was the storage opened read-only beside a running bot? (Backends without read-only opens never are.)"""
    return bool(getattr(runtime.storage, "read_only", False))


def _source_line(runtime: Runtime) -> str:
    # The storage's own description: the SQLite path, or the PostgreSQL URL without its password.
    if _snapshot(runtime):
        return f"storage: {runtime.storage.description} (a snapshot read beside the running bot; nothing was written)"
    return f"storage: {runtime.storage.description} (read by the operator; nothing was scheduled)"


# --- gathering -------------------------------------------------------------------------------------------


async def gather_tasks(runtime: Runtime) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    inspection = await runtime.harness.inspect()
    tasks: list[dict[str, Any]] = []
    for item in inspection.tasks:
        task = item.record
        call = await tool_call_of(runtime.harness, task)
        tool, arguments = (call.name, call.arguments) if call else (None, None)
        gate_id: int | None = None
        if task.kind == GATE_TASK:  # a detached gated call waiting for its decision: name what it will run
            gate_id = int(task.input.get("gate") or 0) or None
            gate = await runtime.harness.snapshot(ApprovalDoc, key=str(gate_id)) or {}
            tool, arguments = gate.get("tool"), gate.get("arguments")
        tasks.append(
            {
                "id": task.id,
                "kind": task.kind,
                "tool": tool,
                "arguments": arguments,
                "gate": gate_id,  # the approval request a gate task waits for (`approvals` lists it)
                "state": item.state,
                "reason": item.reason,
                "waiting_on": item.waiting_on,
                "deadline": task.state.deadline,
                "conversation_id": task.conversation_id,
                "owner_task_id": task.owner_task_id,
                "background": task.background,
                "restarts": task.restarts,
                "parked": task.parked,
            }
        )
    submissions = [
        {
            "id": s.id,
            "conversation_id": s.conversation_id,
            "request_id": s.request_id,
            "type": s.type,
            "status": s.status,
        }
        for s in inspection.submissions
    ]
    return inspection.scheduling, tasks, submissions


async def gather_conversations(runtime: Runtime) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = await runtime.storage.scan_conversations(limit=500, cursor=cursor)
        for record in page.items:
            place = (await runtime.harness.snapshot(PlaceOfDoc, record.id) or {}).get("place")
            latest = await runtime.storage.scan_entries(record.id, order="desc", limit=1)
            found.append(
                {
                    "id": record.id,
                    "place": place,
                    "label": place_label(place) if place else None,
                    "parent": record.parent.model_dump() if record.parent else None,
                    "owner_task_id": record.owner_task_id,
                    "latest_entry": latest.items[0].id if latest.items else None,
                }
            )
        cursor = page.cursor
        if cursor is None:
            break
    return found


async def gather_approvals(runtime: Runtime) -> list[dict[str, Any]]:
    gates = await runtime.harness.family(ApprovalDoc)
    now = runtime.harness.now()
    out: list[dict[str, Any]] = []
    for key, gate in gates.items():
        status = str(gate.get("status"))
        if status == "pending" and int(gate.get("expires_at", 0)) <= now:
            status = "pending (expired, denied at the next scheduling pass)"
        out.append(
            {
                "id": int(key),
                "tool": gate.get("tool"),
                "arguments": gate.get("arguments"),
                "status": status,
                "requester": (gate.get("requester") or {}).get("user_name"),
                "approvers": gate.get("approvers", []),
                "groups": gate.get("groups", []),
                "created_at": gate.get("created_at"),
                "expires_at": gate.get("expires_at"),
                "decided_by": gate.get("decided_by"),
                "decided_at": gate.get("decided_at"),
                "operator_override": bool(gate.get("operator_override")),
                "conversation_id": gate.get("conversation_id"),
                "place": place_label(gate.get("target")) if gate.get("target") else None,
            }
        )
    out.sort(key=lambda g: g["id"])
    return out


async def gather_usage(runtime: Runtime) -> dict[str, Any]:
    usage = await runtime.harness.usage()
    return {
        "total": usage["total"].model_dump(),
        "models": {name: u.model_dump() for name, u in usage["models"].items()},
        "tools": {name: u.model_dump() for name, u in usage["tools"].items()},
    }


# --- rendering ----------------------------------------------------------------------------------------------


def _task_line(task: dict[str, Any]) -> str:
    what = task["kind"] + (f" {task['tool']}" if task["tool"] else "")
    state = task["state"].upper() if task["state"] in ("parked", "blocked") else task["state"]
    line = f"  #{task['id']:<6} {what:<32} conv #{task['conversation_id']:<6} {state}"
    if task["reason"]:
        line += f" ({task['reason']})"
    if task["waiting_on"]:
        line += f" on {task['waiting_on']}"
    if task["deadline"]:
        line += f" until {_when(task['deadline'])}"
    if task["state"] == "parked":
        line += f"  -> fix the cause, then `durable-bots retry {task['id']}`"
    elif task["restarts"]:
        line += f" [{task['restarts']} crash restart(s)]"
    return line


def _approval_line(gate: dict[str, Any]) -> str:
    args = json.dumps(gate["arguments"], sort_keys=True)
    line = f"  gate #{gate['id']:<6} {gate['tool']} {args}  {gate['status']}"
    if gate["requester"]:
        line += f"; asked by {gate['requester']}"
    if gate["decided_by"]:
        line += f"; decided by {gate['decided_by']} at {_when(gate['decided_at'])}"
    elif gate["status"] == "pending":
        who = ", ".join([*gate["approvers"], *(f"group {g}" for g in gate["groups"])]) or "nobody"
        line += f"; approvers: {who}; expires {_when(gate['expires_at'])}"
    if gate["place"]:
        line += f"; in {gate['place']}"
    return line


def _say(out: TextIO, text: str = "") -> None:
    print(text, file=out)


async def inspect_command(
    config: BotConfig, env: Mapping[str, str], out: TextIO, *, as_json: bool, only_tasks: bool = False
) -> int:
    runtime = await _operator_runtime(config, env, reading=True)
    source = _source_line(runtime)
    try:
        scheduling, tasks, submissions = await gather_tasks(runtime)
        if only_tasks:
            if as_json:
                _say(out, json.dumps({"tasks": tasks}, indent=2))
            else:
                _render_tasks(out, tasks)
            return EXIT_OK
        conversations = await gather_conversations(runtime)
        approvals = await gather_approvals(runtime)
        usage = await gather_usage(runtime)
    finally:
        await runtime.close()
    report = {
        "storage": runtime.storage.description,
        "snapshot_beside_running_bot": _snapshot(runtime),
        "scheduling": "running (by the bot)" if _snapshot(runtime) else scheduling,
        "conversations": conversations,
        "tasks": tasks,
        "parked": [t["id"] for t in tasks if t["state"] == "parked"],
        "approvals": approvals,
        "submissions": submissions,
        "usage": usage,
    }
    if as_json:
        _say(out, json.dumps(report, indent=2))
        return EXIT_OK
    _say(out, source)
    _say(out, f"conversations ({len(conversations)}):")
    for conv in conversations:
        what = conv["label"] or (
            f"subagent of task #{conv['owner_task_id']}" if conv["owner_task_id"] else "(no place)"
        )
        if conv["parent"]:
            what += f" (fork of #{conv['parent']['conversation_id']} at entry {conv['parent']['at']})"
        latest = f"latest entry {conv['latest_entry']}" if conv["latest_entry"] else "empty"
        _say(out, f"  #{conv['id']:<6} {what}  [{latest}]")
    _render_tasks(out, tasks)
    pending = [g for g in approvals if g["status"].startswith("pending")]
    _say(out, f"pending approvals ({len(pending)}):")
    for gate in pending:
        _say(out, _approval_line(gate))
    queued = [s for s in submissions if s["status"] == "queued"]
    _say(out, f"submissions: {len(queued)} queued, {len(submissions) - len(queued)} being answered")
    total = usage["total"]
    _say(
        out,
        f"usage: {total['input']} input + {total['output']} output tokens "
        f"(cache read {total['cache_read']}, write {total['cache_write']}), cost ${total['cost']:.4f}",
    )
    for name, model in sorted(usage["models"].items()):
        _say(out, f"  {name}: {model['input']} in / {model['output']} out, ${model['cost']:.4f}")
    return EXIT_OK


def _render_tasks(out: TextIO, tasks: list[dict[str, Any]]) -> None:
    counts: dict[str, int] = {}
    for task in tasks:
        counts[task["state"]] = counts.get(task["state"], 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"
    _say(out, f"tasks ({summary}):")
    for task in tasks:
        _say(out, _task_line(task))


async def approvals_command(
    config: BotConfig, env: Mapping[str, str], out: TextIO, *, as_json: bool, pending_only: bool
) -> int:
    runtime = await _operator_runtime(config, env, reading=True)
    try:
        approvals = await gather_approvals(runtime)
    finally:
        await runtime.close()
    if pending_only:
        approvals = [g for g in approvals if g["status"].startswith("pending")]
    if as_json:
        _say(out, json.dumps({"approvals": approvals}, indent=2))
        return EXIT_OK
    pending = [g for g in approvals if g["status"].startswith("pending")]
    decided = [g for g in approvals if not g["status"].startswith("pending")]
    _say(out, f"pending ({len(pending)}):")
    for gate in pending:
        _say(out, _approval_line(gate))
    if not pending_only:
        _say(out, f"decided ({len(decided)}):")
        for gate in decided:
            _say(out, _approval_line(gate))
    return EXIT_OK


async def _owner(config: BotConfig, env: Mapping[str, str]) -> Runtime | None:
    """The storage as its owner, or None when the running bot holds it."""
    try:
        return await open_runtime(config, env, must_exist=True)
    except BotError as exc:
        if exc.exit_code != EXIT_LOCKED:
            raise
        return None


async def _through_bot(
    config: BotConfig, env: Mapping[str, str], kind: str, args: dict[str, Any]
) -> OperatorRequest:
    """Hand a request to the running bot and return its outcome (BotError when it does not answer). The
    request goes through a read-only handle (SQLite file or PostgreSQL, no lock or lease), like the reads."""
    storage = await open_storage(config, env, read_only=True)
    try:
        if not isinstance(storage, OperatorRequests):
            raise BotError("this storage cannot pass requests to a running bot; stop the bot first")
        try:
            found = await ask_running_bot(storage, kind, args, timeout=REQUEST_TIMEOUT)
        except NotFound as exc:
            raise BotError(str(exc)) from None
    finally:
        await storage.close()
    if found is None:
        raise BotError(
            f"the running bot did not pick the request up within {REQUEST_TIMEOUT:g} s (is it stuck? see its "
            "/healthz); it was withdrawn, nothing was done"
        )
    return found


def _request_result(out: TextIO, found: OperatorRequest) -> int:
    if found.status == "taken":
        raise BotError(
            f"the running bot took the {found.kind} request but has not answered yet; see `durable-bots "
            "inspect` (it may still be done)"
        )
    message = str((found.outcome or {}).get("message", found.status))
    if found.status != "done":
        raise BotError(message)
    _say(out, f"{message} (by the running bot)")
    return EXIT_OK


async def retry_command(
    config: BotConfig, env: Mapping[str, str], out: TextIO, task_id: int, *, timeout: float
) -> int:
    """Clear a parked task and run it until it ends, its conversation is idle, or `timeout` passes: here, or
    in the running bot (then this waits for the task's outcome by reading the storage)."""
    runtime = await _owner(config, env)
    if runtime is None:
        found = await _through_bot(config, env, "retry", {"task": task_id})
        _request_result(out, found)
        label = str((found.outcome or {}).get("label") or "task")
        return await _await_task_in_bot(config, env, out, task_id, label, timeout)
    harness = runtime.harness
    try:
        task = await harness.get_task(task_id)
        if task is None:
            raise BotError(f"there is no task {task_id}")
        if not task.live:
            ended = task.state.outcome.status if task.state.outcome else "ended"
            raise BotError(f"task {task_id} already ended ({ended}); nothing to retry")
        call = await tool_call_of(harness, task)
        label = task.kind + (f" {call.name}" if call else "")
        if not task.parked:
            _say(out, f"task {task_id} ({label}) is not parked; scheduling it anyway")
        _say(out, f"retrying task {task_id} ({label}) in conversation #{task.conversation_id} ...")
        await harness.retry_task(task_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        finished = await _wait(harness.wait_for_task(task_id), deadline - loop.time())
        if finished:
            # Let the rest of the run (the model's answer to the tool result) land too.
            await _wait(harness.wait_for_idle(task.conversation_id), deadline - loop.time())
        current = await harness.get_task(task_id)
        assert current is not None
        if not current.live:
            code = await _say_ended(out, harness.entry, current, label)
            _say(out, "answers reach the chat when the bot runs again")
            return code
        inspection = await harness.inspect()
        state = next((t.state for t in inspection.tasks if t.record.id == task_id), current.state.status)
        _say(
            out,
            f"task {task_id} ({label}) is {state} after {timeout:g}s (no longer parked); the bot continues it "
            "when it runs again",
        )
        return EXIT_OK
    finally:
        await runtime.close()


async def _say_ended(
    out: TextIO, entry: Callable[[int], Awaitable[Entry | None]], task: Task, label: str
) -> int:
    outcome = task.state.outcome
    status = outcome.status if outcome else "ended"
    _say(out, f"task {task.id} ({label}) {status}")
    if outcome and outcome.error:
        _say(out, f"  error: {outcome.error.message}")
    result = await _tool_result_text(entry, task)
    if result:
        _say(out, f"  result: {result}")
    return EXIT_OK if status == "completed" else EXIT_ERROR


async def _await_task_in_bot(
    config: BotConfig, env: Mapping[str, str], out: TextIO, task_id: int, label: str, timeout: float
) -> int:
    """Follow a task the running bot carries out, through read-only handles, until it ends or `timeout`.
    (A SQLite handle reads one snapshot, so each look opens a fresh one.)"""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        storage = await open_storage(config, env, read_only=True)
        try:
            task = await storage.task(task_id)
            if task is not None and not task.live:
                return await _say_ended(out, storage.entry, task, label)
        finally:
            await storage.close()
        if loop.time() >= deadline:
            _say(out, f"task {task_id} is still running after {timeout:g}s; see `durable-bots inspect`")
            return EXIT_OK
        await asyncio.sleep(0.25)


async def cancel_command(config: BotConfig, env: Mapping[str, str], out: TextIO, task_id: int) -> int:
    """Abort a live task: in the running bot, or marked here for the bot's next start."""
    runtime = await _owner(config, env)
    if runtime is None:
        return _request_result(out, await _through_bot(config, env, "cancel", {"task": task_id}))
    try:
        try:
            marked = await runtime.harness.abort_task(task_id)
        except NotFound:
            raise BotError(f"there is no task {task_id}") from None
        if marked == "terminal":
            raise BotError(f"task {task_id} already ended; nothing to cancel")
        _say(out, f"task {task_id} is marked for cancellation; the bot cancels it when it runs again")
        return EXIT_OK
    finally:
        await runtime.close()


async def decide_command(
    config: BotConfig, env: Mapping[str, str], out: TextIO, gate_id: int, *, approve: bool, name: str
) -> int:
    """An operator's approval decision (an override of the approver list, recorded as such)."""
    runtime = await _owner(config, env)
    if runtime is None:
        args = {"gate": gate_id, "approve": approve, "name": name}
        return _request_result(out, await _through_bot(config, env, "decide", args))
    try:
        status, outcome = await decide(runtime.bridge, gate_id, approve, name)
    finally:
        await runtime.close()
    if status != "done":
        raise BotError(str(outcome["message"]))
    _say(out, f"{outcome['message']}; the bot carries it out when it runs again")
    return EXIT_OK


async def _wait(awaitable: Any, seconds: float) -> bool:
    try:
        await asyncio.wait_for(awaitable, max(0.0, seconds))
        return True
    except TimeoutError:
        return False


async def _tool_result_text(entry_of: Callable[[int], Awaitable[Entry | None]], task: Task) -> str | None:
    if task.kind != "core.tool":
        return None
    result = task.state.outcome.result if task.state.outcome else None
    entry_id = result.get("entry_id") if isinstance(result, dict) else None
    if not isinstance(entry_id, int):
        return None
    entry = await entry_of(entry_id)
    for message in entry.model or () if entry is not None else ():
        text = getattr(message, "text", None)
        if callable(text):
            value = text()
            return str(value)[:500]
    return None


async def export_command(
    config: BotConfig, env: Mapping[str, str], out: TextIO, conversation_id: int
) -> tuple[int, int]:
    """Write the transcript (fork-aware, oldest first) as JSONL. Returns (exit code, entries written)."""
    runtime = await _operator_runtime(config, env, reading=True)
    written = 0
    try:
        handle = await runtime.harness.conversation(conversation_id)
        if handle is None:
            raise BotError(f"there is no conversation {conversation_id} (see `durable-bots inspect`)")
        cursor = None
        while True:
            page = await handle.entries(limit=500, cursor=cursor, order="asc")
            for entry in page.items:
                out.write(json.dumps(entry.model_dump(mode="json"), ensure_ascii=False) + "\n")
                written += 1
            cursor = page.cursor
            if cursor is None:
                break
    finally:
        await runtime.close()
    return EXIT_OK, written


def _storage_named(config: BotConfig, env: Mapping[str, str]) -> str:
    """The configured store as check-config names it: never a PostgreSQL password."""
    target = config.storage_target(env)
    if target.kind == "postgres":
        assert target.url is not None
        via = " (from DATABASE_URL)" if target.source == "DATABASE_URL" else ""
        shape = (
            "one leader, standbys wait"
            if config.storage.partitions == 1
            else f"{config.storage.partitions} partitions shared by the workers"
        )
        return f"PostgreSQL {redact_storage_url(target.url)}{via} (lease ttl {config.storage.lease_ttl:g} s, {shape})"
    return f"{target.path or config.storage_path} (durability {config.storage.durability})"


def check_config_command(config: BotConfig, env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    problems = check_tools(config)
    if problems:
        for problem in problems:
            print(problem, file=err)
        return EXIT_ERROR
    try:
        storage = _storage_named(config, env)
    except ConfigError as exc:  # a DATABASE_URL that names no storage (the message never echoes it)
        print(exc, file=err)
        return EXIT_ERROR
    known, _ = known_tools(config)
    tools = enabled_tools(config, known)
    ref = config.bot.model_ref
    warnings: list[str] = []
    if ref.provider == "openai" and not env.get("OPENAI_API_KEY") and not env.get("OPENAI_BASE_URL"):
        warnings.append("OPENAI_API_KEY is not set (fine only for a local server via OPENAI_BASE_URL)")
    if ref.provider == "anthropic" and not env.get("ANTHROPIC_API_KEY"):
        warnings.append("ANTHROPIC_API_KEY is not set")
    adapters: list[str] = []
    refused: list[Problem] = []
    for name in config.adapters:
        state = "" if config.adapter_enabled(name) else ", enabled = false"
        try:
            factory = adapter_factory(config, name)
        except BotError as exc:
            adapters.append(f"{name} (unavailable{state})")
            warnings.append(str(exc))
            continue
        try:
            adapter = factory(config.adapter_options(name), env)  # validates the table; connects nothing
            warnings.extend(f"{name}: {w}" for w in getattr(adapter, "warnings", ()))
        except Exception as exc:
            if env_problem(str(exc)):
                warnings.append(f"{name}: {exc}")
            else:
                refused.append(adapter_problem(config, name, exc))
        adapters.append(f"{name} ({config.adapter_module(name)}{state})")
    if refused:
        for problem in refused:
            print(problem, file=err)
        return EXIT_ERROR
    approvals = config.approvals
    model_note = " (offline demo script)" if ref.provider == "faux" else ""
    _say(out, f"{config.source}: OK")
    _say(out, f"  bot: {config.bot.name}, model {config.bot.model}{model_note}")
    _say(out, f"  storage: {storage}")
    answer = config.answer
    _say(
        out,
        f"  answer: {answer.mode}; unaddressed messages {'recorded' if answer.record_unaddressed else 'ignored'}; "
        f"DMs {'answered' if answer.dms else 'ignored'}; {len(config.channels)} channel override(s)",
    )
    _say(out, f"  tools: {', '.join(tools) or 'none'}")
    if approvals.tools:
        who = ", ".join([*approvals.approvers, *(f"group {g}" for g in approvals.groups)])
        self_note = "self-approval allowed" if approvals.allow_self_approval else "no self-approval"
        _say(
            out,
            f"  approvals: {', '.join(approvals.tools)} by {who} "
            f"(expire after {approvals.expires_minutes:g} min, {self_note})",
        )
    else:
        _say(out, "  approvals: none (no tool waits for a human)")
    webhook = env.get("DEPLOY_WEBHOOK_URL") or config.deploy.webhook_url
    _say(
        out,
        f"  deploy: webhook {redact_url(webhook)}"
        if webhook
        else f"  deploy: no webhook; deploys are recorded in {config.deploy_record_path}",
    )
    logs_note = "" if config.logs_path.exists() else " (does not exist!)"
    if logs_note:
        warnings.append(f"logs.path {config.logs_path} does not exist: search_logs will report an error")
    _say(out, f"  logs: {config.logs_path}{logs_note}")
    _say(out, f"  tickets: {config.tickets_path}")
    _say(out, f"  adapters: {', '.join(adapters) or 'none configured (pass --adapter to run)'}")
    address = config.admin.address
    if address is None:
        _say(out, "  admin endpoint: off ([admin] listen)")
    else:
        _say(out, f"  admin endpoint: http://{config.admin.listen}/ (healthz, readyz, metrics)")
        if not is_loopback(address[0]) and not env.get("ADMIN_TOKEN"):
            warnings.append(
                f"admin.listen {address[0]} is not loopback: the bot refuses to start without ADMIN_TOKEN"
            )
    _say(out, f"  diagnostics: stderr, {config.logging.format} format")
    for warning in warnings:
        _say(out, f"  warning: {warning}")
    return EXIT_OK
