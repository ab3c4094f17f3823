"""Issue 8.3: intake latency. PLACEHOLDER: not yet available.

The benchmark drives the platform bridge (devchat or the fake Slack intake path, in process) at 500 messages/s
across 50 channels and reports p50/p99 from receipt to durable commit (goal: p99 under 10 ms). It needs
`adapters.bridge`, which is being written; until it exists this module measures nothing and reports no figure.
"""

from __future__ import annotations

import importlib.util

from benchmarks._env import Options
from benchmarks._report import Report

NAME = "intake_latency"
TITLE = "intake latency through the platform bridge (issue 8.3)"
MESSAGE = "not yet available: needs adapters.bridge"


async def run(options: Options) -> Report:
    report = Report(
        NAME,
        TITLE,
        "Planned: 500 messages/s across 50 channels through the bridge's intake path (devchat or fake Slack, "
        "in process); p50/p99 from receipt to durable commit. Goal: p99 under 10 ms.",
        available=False,
    )
    present = importlib.util.find_spec("adapters.bridge") is not None
    print(MESSAGE if not present else f"{MESSAGE} (adapters.bridge now exists: write this benchmark)")
    report.note(MESSAGE)
    report.goal("p99 receipt -> durable commit under 10 ms", None, "no figure: placeholder")
    return report
