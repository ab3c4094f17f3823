"""SIGHUP: re-read the config file and apply what can change without a restart.

Applied at once: `[answer]` and `[channels]` (the next message is judged by them), `[approvals]` (requests
made from now on; a request already pending keeps the approvers it was made with, like a card already
shown), `[tools] enabled` and `[bot] instructions` (every channel and thread conversation is brought up to
them, as at start). Anything else that changed (model, storage, adapters, admin, logging, tool modules...)
needs a restart: the reload says which, and keeps the running values.

A file that does not validate changes nothing: every problem is logged with its line, and the bot keeps
running on the config it had.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from bots.config import BotConfig, ConfigError, load_config

log = logging.getLogger("bots.reload")

RELOADABLE = ("answer", "channels", "approvals")


async def reload_config(runtime: object, say: Callable[[str], None]) -> BotConfig | None:
    """Apply the file at `runtime.config.source` to the running bot; returns the new config, or None when it
    was refused (then nothing changed)."""
    from bots.runtime import (  # late: runtime imports this module
        Runtime,
        agent_change,
        approval_policies,
        bridge_config,
        check_tools,
        enabled_tools,
        known_tools,
        sync_agents,
    )

    current = runtime.config  # type: ignore[attr-defined]  # a Runtime, or a worker's (bots.workers)
    assert isinstance(current, BotConfig)
    try:
        fresh = load_config(current.source)
        problems = check_tools(fresh)
    except ConfigError as exc:
        problems = exc.problems
    if problems:
        for problem in problems:
            log.error("reload: %s", problem)
        say(
            f"durable-bots: reload refused, {len(problems)} problem(s) in {current.source} (see the log); "
            "still running on the previous config"
        )
        return None
    restart_only = [
        name
        for name in type(fresh).model_fields
        if name not in (*RELOADABLE, "bot", "tools") and getattr(fresh, name) != getattr(current, name)
    ]
    if fresh.bot.model_dump(exclude={"instructions"}) != current.bot.model_dump(exclude={"instructions"}):
        restart_only.insert(0, "bot (model, name)")
    if fresh.tools.modules != current.tools.modules:
        restart_only.append("tools.modules")
    known, _ = known_tools(fresh)
    tools = enabled_tools(fresh, known)
    # The model stays the running one: a new provider needs a restart.
    agent = dataclasses.replace(agent_change(fresh, tools), model=current.bot.model_ref)
    # runtime.config stays the file the bot started with: a second reload still names what awaits a restart.
    if isinstance(runtime, Runtime):
        runtime.bridge.config = bridge_config(fresh)
        runtime.bridge.approvals.policies = approval_policies(fresh)
        runtime.bridge.agent = agent
        runtime.agent = agent
        runtime.tools = tools
        updated = await sync_agents(runtime)
    else:  # a worker: every partition it runs now, and the ones it opens later
        apply = runtime.apply_reload  # type: ignore[attr-defined]
        updated = int(await apply(bridge_config(fresh), approval_policies(fresh), agent))
    say(
        f"durable-bots: reloaded {current.source}: answer, channels, approvals, tools, instructions applied"
        f" ({updated} conversation(s) updated)"
    )
    if restart_only:
        say(f"durable-bots: changed but applied only after a restart: {', '.join(restart_only)}")
    return fresh


class Reloads:
    """Runs one reload per SIGHUP, one at a time (a signal during a reload queues one more). Owns its task."""

    def __init__(self, runtime: object, say: Callable[[str], None]) -> None:
        self.runtime = runtime
        self.say = say
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def request(self) -> None:
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="config-reload")

    async def _run(self) -> None:
        while True:
            self._again = False
            try:
                await reload_config(self.runtime, self.say)
            except Exception as exc:  # e.g. the storage failed while updating conversations
                log.exception("reload failed")
                self.say(
                    f"durable-bots: reload failed ({exc}); some settings may be applied, send SIGHUP again"
                )
            if not self._again:
                return

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
