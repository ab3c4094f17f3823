"""A `[tools] modules` plugin for crash tests: tools that SIGKILL their own process at chosen moments.

Markers live in `$BOTS_CRASH_DIR`; `ledger.txt` there records every execution start across processes.

- `fragile`: kills the process every time until `repaired` exists (a task that crashes its process at the
  same step: parked after the restart limit, then `durable-bots retry`);
- `open_ticket`: the real ops tool, then (first time only) a kill before its result is committed, so the
  restarted bot replays it;
- `lookup_conversations`: (first time only) a kill inside the history subagent's tool, so the restarted bot
  re-executes `search_history`, which must find its child conversation again.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from bots.ops import OpsContext, lookup_conversations_tool, open_ticket_tool
from harness_core import Extension, ToolApi, ToolResult, tool


def _dir() -> Path:
    return Path(os.environ["BOTS_CRASH_DIR"])


def _ledger(line: str) -> None:
    with (_dir() / "ledger.txt").open("a") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _die_once(marker: str) -> None:
    path = _dir() / marker
    if not path.exists():
        path.touch()
        os.kill(os.getpid(), signal.SIGKILL)


def extension(ctx: OpsContext | None) -> Extension:
    @tool(replay="safe")
    def fragile() -> str:
        """Crashes the process unless repaired."""
        _ledger("fragile")
        if not (_dir() / "repaired").exists():
            os.kill(os.getpid(), signal.SIGKILL)
        return "worked this time"

    @tool(replay="safe", name="open_ticket")
    async def open_ticket(title: str, api: ToolApi, body: str = "") -> ToolResult | str:
        """Open a ticket (the real tool, then a crash the first time)."""
        assert ctx is not None
        _ledger(f"open_ticket {title}")
        result = await open_ticket_tool(ctx).execute({"title": title, "body": body}, api)
        _die_once("ticket-crashed")
        return result

    @tool(replay="safe", name="lookup_conversations")
    async def lookup_conversations(query: str, api: ToolApi) -> ToolResult | str:
        """Search earlier conversations (a crash the first time)."""
        assert ctx is not None
        _ledger(f"lookup {query}")
        _die_once("lookup-crashed")
        return await lookup_conversations_tool(ctx).execute({"query": query}, api)

    return Extension("crash-tools", tools=[fragile, open_ticket, lookup_conversations])
