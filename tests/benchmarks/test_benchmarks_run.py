"""Smoke test: every benchmark runs at its tiny size and prints its figures. No timing assertions: figures
are for benchmarks/RESULTS.md, not for pass/fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import BENCHMARKS
from benchmarks._env import Options
from benchmarks.intake_bounds import CASES
from benchmarks.workers import cases, label

REPO = Path(__file__).resolve().parents[2]


def run_tiny(name: str, workdir: Path) -> str:
    # The anchors (LangGraph) come with the `bench` extra, which `make test` installs: a missing one fails.
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", name, "--tiny", "--dir", str(workdir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"== {name}:" in done.stdout
    assert "[MET ]" in done.stdout or "[MISS]" in done.stdout  # a goal was evaluated on real figures
    return done.stdout


SPECIFIC = ("intake_latency", "workers", "intake_bounds")  # run by the tests below, with more checks


@pytest.mark.parametrize("name", [name for name in BENCHMARKS if name not in SPECIFIC])
def test_benchmark_runs_and_prints_figures(name: str, tmp_path: Path) -> None:
    run_tiny(name, tmp_path)


def test_intake_latency_measures_the_bridge_and_both_slack_paths(tmp_path: Path) -> None:
    stdout = run_tiny("intake_latency", tmp_path)
    for path in ("bridge", "slack socket", "slack http"):
        for load in ("recorded", "mixed"):
            assert f"{path} {load}: p99" in stdout, (path, load)
    assert "not acked" not in stdout  # every event reached the bot and was acknowledged


def test_workers_runs_the_load_against_each_worker_count(tmp_path: Path) -> None:
    stdout = run_tiny("workers", tmp_path)
    chosen = cases(Options(tiny=True))
    assert {intake for _, _, intake in chosen} == {"shared", "separate"}
    for case in chosen:
        name = label(*case)
        for figure in ("intake p99", "answered turns/s", "answer p99"):
            assert f"{name}: {figure}" in stdout, (name, figure)
    assert "event(s) not acked" not in stdout  # every event reached a worker and was acknowledged
    # The goal's case: each channel answered after its last mention by whichever worker owns it, every
    # ingress record taken in.
    assert "0 channel(s) unanswered" in stdout and "0 not taken in" in stdout


def test_intake_bounds_runs_each_way_and_times_the_servers_wal_flushes(tmp_path: Path) -> None:
    stdout = run_tiny("intake_bounds", tmp_path)
    for case in CASES:  # the throwaway cluster the benchmark starts lets every way run, the unflushed one too
        for figure in ("intake p99", "WAL flushes", "answered turns/s during the load"):
            assert f"{case.name}: {figure}" in stdout, (case.name, figure)
        # Paused owners are continued after the load: everything is taken in and answered all the same.
        assert f"{case.name}: 0 not taken in, 0 channel(s) unanswered" in stdout, case.name
        # Each way is in effect while its load runs (checked by the benchmark itself, from outside the bots).
        setting = "off" if case.unflushed else "on"
        assert f"{case.name}: 0 not taken in, 0 channel(s) unanswered; synchronous_commit {setting}" in stdout
        assert (
            f"{case.name}: 0 not taken in, 0 channel(s) unanswered; synchronous_commit {setting}; "
            "2 of 2 workers stopped" in stdout
        ) == case.pause_owners, case.name
    assert "no answered turns: answered turns/s during the load" in stdout
    assert "(0 of 0)" in stdout  # no message mentioned the bot in that way
    assert "event(s) not acked" not in stdout


def test_put_order_ab_measures_both_ingress_statements() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.put_order_ab", "4"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for size in (1, 8, 64):
        assert f"{size:3} puts per write: arrival order " in done.stdout, done.stdout
    assert done.stdout.count("key order / arrival order = ") == 3
