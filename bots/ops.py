"""The ops bot: tools for an operations channel, each declared with the replay policy its effect deserves.

| tool             | replay | why                                                                            |
|------------------|--------|--------------------------------------------------------------------------------|
| `search_logs`    | safe   | reads files; running it twice is harmless                                      |
| `open_ticket`    | safe   | keyed: the tracker deduplicates on `ticket:<title>`, so a replay finds the     |
|                  |        | ticket the first run created and the result names it                           |
| `deploy`         | unsafe | approval-gated; POSTs with `Idempotency-Key: deploy-<task id>`; never re-run   |
|                  |        | blindly after a crash: the model is told it was interrupted and decides        |
| `search_history` | safe   | a subagent conversation owned by the tool task; a replay finds the same child  |
|                  |        | and the same submission (`request_id=subagent:<task id>`), so nothing is asked |
|                  |        | twice                                                                          |
| `schedule`       | safe   | from the bridge (`bridge.extension()`): a durable timer                        |

Every call runs under a time limit (`[tools] timeout`, 60 s; `search_history` declares 300 s): past it, it is
stopped and the model gets an error result. `search_logs` stays responsive on any pattern and log size (see
`bots.log_search`).

The faux:demo model script lives in `bots.demo`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from adapters.bridge import ApprovalDoc, PlaceOfDoc
from bots.config import BotConfig
from bots.log_search import search_log_files
from harness_core import (
    CORE_ASSISTANT,
    CORE_USER,
    AgentChange,
    AgentDoc,
    Extension,
    Harness,
    Input,
    Task,
    TaskOwned,
    ToolApi,
    ToolResult,
    ToolSpec,
    Tx,
    tool,
)
from harness_core.messages import AssistantMessage, UserMessage, user_text
from harness_core.storage import Storage

log = logging.getLogger("bots.ops")

HISTORY_PREFIX = "[history search] "
HISTORY_TOOL = "lookup_conversations"
HISTORY_INSTRUCTIONS = (
    "You answer one question about earlier conversations of this team. Use lookup_conversations with a few "
    "distinctive words from the question, then answer briefly, quoting who said what and where. Say so when "
    "nothing matches. You cannot change anything."
)
MAX_HISTORY_HITS = 20

log = logging.getLogger("bots.ops")


@dataclass
class OpsContext:
    """What the ops tools need besides their arguments. `transport` lets tests route the webhook call."""

    config: BotConfig
    env: Mapping[str, str]
    storage: Storage
    transport: httpx.AsyncBaseTransport | None = None


def ops_extension(ctx: OpsContext) -> Extension:
    """The `ops` extension: search_logs, open_ticket, deploy, search_history."""
    return Extension(
        "ops",
        tools=[search_logs_tool(ctx), open_ticket_tool(ctx), deploy_tool(ctx), search_history_tool(ctx)],
    )


def history_extension(ctx: OpsContext) -> Extension:
    """The read-only tool of the history subagent (only its child conversations select it)."""
    return Extension("ops-history", tools=[lookup_conversations_tool(ctx)])


# --- search_logs -----------------------------------------------------------------------------------------


def search_logs_tool(ctx: OpsContext) -> ToolSpec:
    @tool(replay="safe", name="search_logs")
    async def search_logs(pattern: str, api: ToolApi) -> ToolResult:
        """Search the service logs. `pattern` is a case-insensitive regular expression in RE2 syntax (plain
        words work too, e.g. `checkout ERROR`; no backreferences or lookaround). Returns the matching lines as
        `file:line: text`, newest files last."""
        # In a worker thread (files are read and matched there, RE2 releases the GIL), stopped through `stop`
        # when this call is cancelled, and returning what it has shortly before the tool's time limit.
        stop = threading.Event()
        limit = api.time_limit
        deadline = None if limit is None else time.monotonic() + limit - min(limit * 0.1, 5.0)
        try:
            return await asyncio.to_thread(
                search_log_files,
                ctx.config.logs_path,
                pattern,
                ctx.config.logs.max_results,
                stop=stop,
                deadline=deadline,
            )
        finally:
            stop.set()

    return search_logs


# --- open_ticket -----------------------------------------------------------------------------------------


def ticket_key(title: str) -> str:
    """The idempotency key of a ticket: its normalized title (so a replay, or a second ask, finds it)."""
    return "ticket:" + " ".join(title.lower().split())


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` (created 0600: it holds chat-derived text, like the database)."""
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(
        os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8"
    ) as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def tracker_open(
    path: Path, title: str, body: str, key: str, extra: dict[str, Any]
) -> tuple[dict[str, Any], bool]:
    """Create a ticket in the JSON tracker unless one with `key` exists. Returns (ticket, created)."""
    with _locked(path):
        tickets: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
        for ticket in tickets:
            if ticket.get("key") == key:
                return ticket, False
        ticket = {
            "id": f"TICKET-{len(tickets) + 1}",
            "title": title,
            "body": body,
            "key": key,
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            **extra,
        }
        tickets.append(ticket)
        _write_atomic(path, json.dumps(tickets, indent=2) + "\n")
        return ticket, True


def open_ticket_tool(ctx: OpsContext) -> ToolSpec:
    @tool(replay="safe", name="open_ticket")
    async def open_ticket(title: str, api: ToolApi, body: str = "") -> ToolResult:
        """Open a ticket in the team's tracker. Idempotent per title: asking again (or a restart while it
        runs) returns the ticket that already exists instead of creating a duplicate."""
        key = ticket_key(title)
        extra = {"conversation_id": api.conversation_id, "task_id": api.task_id}
        try:
            ticket, created = await asyncio.to_thread(
                tracker_open, ctx.config.tickets_path, title, body, key, extra
            )
        except OSError as exc:  # the message names the file: the log gets it, the chat gets the config key
            log.warning("open_ticket: cannot write %s: %s", ctx.config.tickets_path, exc)
            return ToolResult(
                f"Could not write the ticket file (tickets.path): {exc.strerror or 'I/O error'}.",
                is_error=True,
            )
        details = {"ticket": ticket["id"], "created": created, "key": key}
        if created:
            return ToolResult(f"Opened {ticket['id']}: {ticket['title']}", details=details)
        return ToolResult(
            f"{ticket['id']} is already open for this title: {ticket['title']} (no duplicate created)",
            details=details,
        )

    return open_ticket


# --- deploy ----------------------------------------------------------------------------------------------


def deploy_key(task_id: int) -> str:
    return f"deploy-{task_id}"


def _record_deploy(path: Path, record: dict[str, Any]) -> bool:
    """Append to the local deploy log unless this idempotency key is there already. True when written."""
    with _locked(path):
        if path.exists():
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    if json.loads(line).get("idempotency_key") == record["idempotency_key"]:
                        return False
        with os.fdopen(
            os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a", encoding="utf-8"
        ) as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return True


def deploy_tool(ctx: OpsContext) -> ToolSpec:
    @tool(name="deploy")
    async def deploy(service: str, version: str, api: ToolApi) -> ToolResult:
        """Deploy `version` of `service`. Needs a human approver's click before it runs; state exactly what
        you deploy and why. If it was interrupted, do not repeat it blindly: ask someone to check first."""
        key = deploy_key(api.task_id)
        gate = await api.harness.snapshot(ApprovalDoc, key=str(api.task_id)) or {}
        requester = (gate.get("requester") or {}).get("user_name")
        payload = {
            "service": service,
            "version": version,
            "idempotency_key": key,
            "bot": ctx.config.bot.name,
            "task_id": api.task_id,
            "conversation_id": api.conversation_id,
            "requested_by": requester,
            "approved_by": gate.get("decided_by"),
        }
        url = ctx.env.get("DEPLOY_WEBHOOK_URL") or ctx.config.deploy.webhook_url
        # An audit line (with the task and conversation ids in play, see bots/logs.py).
        log.info("deploy of %s %s, approved by %s", service, version, gate.get("decided_by"))
        if not url:
            record = {**payload, "recorded_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
            path = ctx.config.deploy_record_path
            try:
                await asyncio.to_thread(_record_deploy, path, record)
            except OSError as exc:
                log.warning("deploy: cannot write the deploy record %s: %s", path, exc)
                return ToolResult(
                    f"Could not write the local deploy record (deploy.record_path): {exc.strerror or 'I/O error'}; "
                    "nothing was deployed.",
                    is_error=True,
                    details={"idempotency_key": key},
                )
            log.info("deploy: recorded %s in %s", key, path)
            return ToolResult(
                f"No deploy webhook is configured (deploy.webhook_url), so nothing was deployed for real: "
                f"recorded the deploy of {service} {version} in the local deploy record (deploy.record_path, "
                f"idempotency key {key}).",
                details={"idempotency_key": key},
            )
        headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
        token = ctx.env.get("DEPLOY_WEBHOOK_TOKEN")
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            async with httpx.AsyncClient(
                timeout=ctx.config.deploy.timeout_seconds, transport=ctx.transport
            ) as client:
                response = await client.post(url, json=payload, headers=headers)
        except httpx.TimeoutException:
            return ToolResult(
                f"The deploy webhook did not answer in time; the deploy of {service} {version} may or may not "
                f"have started. Check the deploy system for idempotency key {key} before trying again.",
                is_error=True,
                details={"idempotency_key": key},
            )
        except httpx.HTTPError as exc:
            return ToolResult(
                f"Could not reach the deploy webhook ({type(exc).__name__}); nothing was deployed.",
                is_error=True,
                details={"idempotency_key": key},
            )
        snippet = response.text[:300].strip()
        details = {"idempotency_key": key, "status": response.status_code}
        if response.is_success:
            text = (
                f"Deploy of {service} {version} accepted by the deploy webhook (HTTP {response.status_code}"
            )
            text += f", idempotency key {key})" + (f": {snippet}" if snippet else ".")
            return ToolResult(text, details=details)
        return ToolResult(
            f"The deploy webhook refused the deploy of {service} {version} (HTTP {response.status_code})"
            + (f": {snippet}" if snippet else "."),
            is_error=True,
            details=details,
        )

    return deploy


# --- search_history: a subagent over stored conversations ------------------------------------------------


def search_history_tool(ctx: OpsContext) -> ToolSpec:
    # A subagent's model round-trips take longer than the 60 s default; `[tools.timeouts]` can still change it.
    @tool(replay="safe", name="search_history", timeout=300)
    async def search_history(question: str, api: ToolApi) -> ToolResult:
        """Ask a helper agent to search the team's earlier conversations (what was said, by whom, where) and
        answer `question`. Read-only."""

        async def child(tx: Tx, task: Task) -> int:
            existing = await tx.conversations_owned_by(task.id)
            if existing:  # re-executed after a crash: the same child, the same question
                return existing[0].id
            record = await tx.create_conversation(TaskOwned(task_id=task.id))
            agent = await tx.doc(AgentDoc, record.id)
            change = AgentChange(tools=[HISTORY_TOOL], instructions=HISTORY_INSTRUCTIONS)
            agent.value = change.apply(agent.value)
            return record.id

        child_id: int = await api.commit(child)
        handle = await api.conversation(child_id)
        if handle is None:
            return ToolResult(f"history conversation {child_id} is missing", is_error=True)
        submission = await handle.submit(
            Input(f"{HISTORY_PREFIX}{question}", request_id=f"subagent:{api.task_id}")
        )
        settled = await submission.wait()
        details = {"conversation_id": child_id}
        if settled.status != "done" or settled.answer is None:
            reason = settled.reason or "no answer"
            return ToolResult(
                f"The history search did not answer ({reason}).", is_error=True, details=details
            )
        entry = await api.harness.entry(settled.answer)
        message = entry.model[0] if entry is not None and entry.model else None
        text = message.text() if isinstance(message, AssistantMessage) else ""
        return ToolResult(text or "(the history search gave no text)", details=details)

    return search_history


def place_label(place: Mapping[str, Any] | None) -> str:
    if not place:
        return "(no place)"
    label = f"{place.get('platform')}:{place.get('workspace')}/{place.get('channel')}"
    if place.get("thread"):
        label += f" thread {place['thread']}"
    return label


async def _question_cutoff(harness: Harness, storage: Storage, child_id: int) -> int | None:
    """Entries at or after the user message that asked the question are not 'earlier': the id of that
    message (ids are one monotone sequence per storage)."""
    record = await harness.conversation_record(child_id)
    if record is None or record.owner_task_id is None:
        return None
    owner = await harness.get_task(record.owner_task_id)
    if owner is None or not isinstance(owner.input, dict) or "assistant" not in owner.input:
        return None
    assistant = int(owner.input["assistant"])
    page = await storage.scan_entries(owner.conversation_id, max_id=assistant, order="desc", limit=50)
    for entry in page.items:
        if entry.kind == CORE_USER:
            return entry.id
    return assistant


def _entry_text(entry: Any) -> str:
    texts: list[str] = []
    for message in entry.model or ():
        if isinstance(message, UserMessage):
            texts.append(user_text(message))
        elif isinstance(message, AssistantMessage):
            texts.append(message.text())
    return " ".join(t for t in texts if t)


async def search_conversations(
    harness: Harness,
    storage: Storage,
    query: str,
    *,
    before: int | None = None,
    limit: int = MAX_HISTORY_HITS,
) -> list[dict[str, Any]]:
    """Substring search (any of the words, case-insensitive) over user and assistant messages of every
    ownerless conversation (channels, threads, DMs), newest first, ranked by how many words match."""
    words = [w for w in query.lower().split() if w]
    if not words:
        return []
    hits: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = await storage.scan_conversations(limit=200, cursor=cursor)
        for conversation in page.items:
            if conversation.owner_task_id is not None:
                continue  # subagent children: their own questions are not history
            place = (await harness.snapshot(PlaceOfDoc, conversation.id) or {}).get("place")
            entry_cursor = None
            while True:
                entries = await storage.scan_entries(
                    conversation.id,
                    max_id=None if before is None else before - 1,
                    order="desc",
                    limit=500,
                    cursor=entry_cursor,
                )
                for entry in entries.items:
                    if entry.kind not in (CORE_USER, CORE_ASSISTANT):
                        continue
                    text = _entry_text(entry)
                    lowered = text.lower()
                    score = sum(1 for w in words if w in lowered)
                    if score:
                        hits.append(
                            {
                                "score": score,
                                "entry_id": entry.id,
                                "conversation_id": conversation.id,
                                "place": place_label(place),
                                "role": "user" if entry.kind == CORE_USER else "bot",
                                "text": text,
                            }
                        )
                entry_cursor = entries.cursor
                if entry_cursor is None:
                    break
        cursor = page.cursor
        if cursor is None:
            break
    hits.sort(key=lambda h: (-h["score"], -h["entry_id"]))
    return hits[:limit]


def lookup_conversations_tool(ctx: OpsContext) -> ToolSpec:
    @tool(replay="safe", name=HISTORY_TOOL)
    async def lookup_conversations(query: str, api: ToolApi) -> ToolResult:
        """Find earlier messages containing any of the words in `query` (case-insensitive), best matches
        first. Each hit names the place, who spoke and the entry id."""
        harness: Harness = api.harness
        before = await _question_cutoff(harness, ctx.storage, api.conversation_id)
        hits = await search_conversations(harness, ctx.storage, query, before=before)
        if not hits:
            return ToolResult(f"No earlier messages mention any of: {query}", details={"hits": 0})
        lines = [f"[{h['place']} #{h['entry_id']}] {h['role']}: {_clip(h['text'], 300)}" for h in hits]
        return ToolResult(
            f"{len(hits)} earlier message(s):\n" + "\n".join(lines), details={"hits": len(hits)}
        )

    return lookup_conversations


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = [
    "HISTORY_PREFIX",
    "HISTORY_TOOL",
    "OpsContext",
    "deploy_key",
    "history_extension",
    "ops_extension",
    "search_conversations",
    "search_log_files",
    "ticket_key",
    "tracker_open",
]
