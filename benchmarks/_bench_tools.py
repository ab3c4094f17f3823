"""The tool the benchmarks' `durable-bots run` processes load (`[tools] modules = ["benchmarks._bench_tools"]`):
the scripted turn's `lookup`, so a user's `/call lookup {"key": ...}` to `faux:demo` runs the same shape of turn
as `benchmarks._script` (model -> tool call -> tool result -> model -> answer)."""

from __future__ import annotations

from benchmarks._script import lookup
from harness_core import Extension

extension = Extension("bench", tools=[lookup])
