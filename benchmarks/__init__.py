"""Benchmarks for durable-bots (issues 2 and 8). Run `python -m benchmarks [name ...] [--quick]`.

Each benchmark runs our harness and its anchor (raw aiosqlite, LangGraph) in the same run and prints both,
with ratios and whether the goal was met. Figures from real runs live in `benchmarks/RESULTS.md`.
"""

from __future__ import annotations

# Run order: cheap ones first. Name -> module in this package (each has NAME, TITLE, `async run(options)`).
BENCHMARKS: dict[str, str] = {
    "commit_rate": "benchmarks.commit_rate",
    "turns": "benchmarks.turns",
    "storage_growth": "benchmarks.storage_growth",
    "intake_latency": "benchmarks.intake_latency",
    "recovery": "benchmarks.recovery",
    "context_cost": "benchmarks.context_cost",
    "idle_memory": "benchmarks.idle_memory",
    "postgres": "benchmarks.postgres",
    "takeover": "benchmarks.takeover",
    "pg_capacity": "benchmarks.pg_capacity",
    "workers": "benchmarks.workers",
    "intake_bounds": "benchmarks.intake_bounds",
    "memory_growth": "benchmarks.memory_growth",
}
