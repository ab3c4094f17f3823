"""Counters of what the bridge did, for an operator's metrics (`bots/metrics.py` exports them).

Plain integer increments on the hot path and nothing else: an exporter reads them when it is scraped. Each
counter counts since the process started (Prometheus counters reset with the process).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class BridgeStats:
    taken_in: Counter[str] = field(default_factory=Counter)
    """Human messages committed by intake, by platform (answered or only recorded)."""
    duplicates: Counter[str] = field(default_factory=Counter)
    """Messages intake had already taken in (a platform retry, a catch-up overlap), by platform."""
    answers_delivered: Counter[str] = field(default_factory=Counter)
    """Answers whose final render reached the platform, by platform."""
    approvals_decided: Counter[str] = field(default_factory=Counter)
    """Accepted approval decisions, by outcome (approved, denied)."""

    def add(self, other: BridgeStats) -> None:
        """Add `other`'s counts to these (a worker keeps the counts of partitions it no longer runs)."""
        self.taken_in.update(other.taken_in)
        self.duplicates.update(other.duplicates)
        self.answers_delivered.update(other.answers_delivered)
        self.approvals_decided.update(other.approvals_decided)
