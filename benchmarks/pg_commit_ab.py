"""An A/B driver for the PostgreSQL commit path: one build's commit costs, printed on one line each, so two
builds can be run alternately (whole-benchmark runs move too much with other load on this machine to compare
across runs). Not one of `python -m benchmarks`' benchmarks; it reuses `pg_capacity`'s measurements:

- `ours_writers`: N partitions committing small harness commits (one entry + one document change) at once,
  4 s each for N = 1, 4, 8: commits/s, server and client CPU per commit;
- `turn_costs`: a real `durable-bots run` worker (64 partitions) answering 100 tool turns and 100 plain turns
  and recording 200 messages, one at a time: server and worker CPU per unit.

Run one build from a checkout of it, the other from this one, alternately:

    PYTHONPATH=/tmp/old .venv/bin/python -m benchmarks.pg_commit_ab old
    .venv/bin/python -m benchmarks.pg_commit_ab new
"""

from __future__ import annotations

import asyncio
import sys

from benchmarks import pg_capacity
from benchmarks._env import Options
from benchmarks._pg_server import Probe, durable_server


async def measure(label: str) -> None:
    async with durable_server() as server:
        probe = await Probe.open(server)
        try:
            for writers in (1, 4, 8):
                rate, unit = await pg_capacity.ours_writers(server, probe, writers, 4.0)
                print(
                    f"{label} {writers} writers: {rate:,.0f} commits/s, server CPU {unit.cpu_ms:.3f} ms, "
                    f"client CPU {unit.bot_commits:.3f} ms per commit",
                    flush=True,
                )
            costs = await pg_capacity.turn_costs(server, probe, Options(), 100, 200, 5.0)
            for name, unit in (("tool turn", costs.tool_turn), ("plain turn", costs.plain_turn)):
                print(
                    f"{label} {name}: server CPU {unit.cpu_ms:.2f} ms, worker CPU {unit.worker_cpu_ms:.2f} ms"
                )
            print(f"{label} recorded message: server CPU {costs.recorded.cpu_ms:.2f} ms", flush=True)
        finally:
            await probe.close()


if __name__ == "__main__":
    asyncio.run(measure(sys.argv[1] if len(sys.argv) > 1 else "this build"))
