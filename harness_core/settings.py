"""Harness settings: read live by each reader (change them between turns and the next boundary sees it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class RetrySettings:
    enabled: bool = True
    max_retries: int = 3  # retries after the first attempt
    base_delay_ms: int = 2_000
    max_delay_ms: int = 60_000

    def delay_ms(self, attempt: int, retry_after_ms: int | None) -> int:
        """Backoff for the given 1-based attempt, honouring the server's retry-after, capped."""
        backoff = self.base_delay_ms * int(2 ** max(0, attempt - 1))
        if retry_after_ms is not None:
            backoff = max(retry_after_ms, 0)
        return min(backoff, self.max_delay_ms)


@dataclass
class CompactionSettings:
    enabled: bool = True
    reserve_tokens: int = 16_384
    keep_recent_tokens: int = 20_000
    background_tokens: int = 32_768


@dataclass
class ProgressSettings:
    partial_interval_ms: int = 100  # streaming partials are committed at most this often
    output_interval_ms: int = 100  # tool output is committed at most this often


@dataclass
class ToolSettings:
    """Time limits of tool executions, in seconds (`None`: no limit).

    The limit of a tool is `timeouts[name]` when the host set one, else the tool's own `@tool(timeout=...)`,
    else `timeout`. It covers `execute` only (not argument validation, hooks or an approval wait), per attempt
    (a call replayed after a restart gets the whole limit again); a tool past its limit is cancelled and the
    model gets an error result saying so.
    """

    timeout: float | None = 60.0
    timeouts: dict[str, float | None] = field(default_factory=dict)

    def time_limit(self, name: str, declared: float | None) -> float | None:
        if name in self.timeouts:
            return self.timeouts[name]
        return declared if declared is not None else self.timeout


@dataclass
class WatchdogSettings:
    """The event-loop lag watchdog: it wakes every `interval_ms` and logs a WARNING naming the tool tasks that
    ran meanwhile when its wake-up came `threshold_ms` or more late (something blocked the loop)."""

    enabled: bool = True
    threshold_ms: int = 250
    interval_ms: int = 100


@dataclass
class HarnessSettings:
    extensions: list[str] | None = None  # default selection; None = every installed extension
    retry: RetrySettings = field(default_factory=RetrySettings)
    compaction: CompactionSettings = field(default_factory=CompactionSettings)
    progress: ProgressSettings = field(default_factory=ProgressSettings)
    tool_execution: Literal["parallel", "sequential"] = "parallel"
    steering_mode: Literal["one-at-a-time", "all"] = "one-at-a-time"
    follow_up_mode: Literal["one-at-a-time", "all"] = "one-at-a-time"
    # Queued items when a run ends without an answer: "continue" places them at once (the next run starts),
    # "hold" keeps them until the next submission (pi-durable). See `_inbox.after_failed_run`.
    after_failed_run: Literal["continue", "hold"] = "continue"
    restart_limit: int = 5  # process deaths at the same step before a task is parked
    stream: dict[str, Any] = field(default_factory=dict)  # provider options pinned into each request
    context_retention_ms: int = 600_000
    tools: ToolSettings = field(default_factory=ToolSettings)
    watchdog: WatchdogSettings = field(default_factory=WatchdogSettings)
    # The cache of each conversation's active range (entries read back for prompts): bytes and conversations
    # held at most. A process running several harnesses (one per owned partition) gives each a share.
    context_cache_bytes: int = 8 * 2**20
    context_cache_conversations: int = 512
