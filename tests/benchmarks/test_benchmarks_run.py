"""Smoke test: every benchmark runs at its tiny size and prints its figures. No timing assertions: figures
are for benchmarks/RESULTS.md, not for pass/fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import BENCHMARKS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_benchmark_runs_and_prints_figures(name: str, tmp_path: Path) -> None:
    # The anchors (LangGraph) come with the `bench` extra, which `make test` installs: a missing one fails.
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", name, "--tiny", "--dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"== {name}:" in done.stdout
    assert "[MET ]" in done.stdout or "[MISS]" in done.stdout  # a goal was evaluated on real figures
