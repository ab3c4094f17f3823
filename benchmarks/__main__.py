"""The runner: `python -m benchmarks [name ...] [--quick] [--dir DIR] [--durability normal|full] [--json PATH]`.

Runs the named benchmarks (all by default) in order, prints each report as it finishes, then a summary of the
goals. `--quick` uses smaller sizes so the whole set runs in a couple of minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import BENCHMARKS
from benchmarks._env import REPO, Options, machine
from benchmarks._report import Report


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"benchmarks to run (default: all): {', '.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (the whole set in a few minutes)")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # smoke tests only
    parser.add_argument(
        "--dir", type=Path, default=REPO / "var" / "bench", help="scratch and cache directory"
    )
    parser.add_argument(
        "--durability", choices=("normal", "full"), default="normal", help="SQLite sync level"
    )
    parser.add_argument("--json", type=Path, help="also write the reports as JSON to this file")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    return args


async def run_one(name: str, options: Options) -> Report:
    module: Any = importlib.import_module(BENCHMARKS[name])
    started = time.perf_counter()
    report: Report = await module.run(options)
    report.note(f"benchmark wall time {time.perf_counter() - started:.1f} s")
    return report


async def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.list:
        for name, path in BENCHMARKS.items():
            print(f"{name:16} {importlib.import_module(path).TITLE}")
        return 0
    options = Options(quick=args.quick, tiny=args.tiny, workdir=args.dir, durability=args.durability)
    info = machine()
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    print(f"# machine: {json.dumps(info)}")
    print(f"# command: python -m benchmarks {' '.join(argv)}  (mode {mode})", flush=True)
    reports: list[Report] = []
    for name in args.names or list(BENCHMARKS):
        report = await run_one(name, options)
        reports.append(report)
        print(report.render(), flush=True)
    print("== goals")
    for report in reports:
        for goal in report.goals:
            mark = "n/a " if goal.met is None else ("MET " if goal.met else "MISS")
            print(f"   [{mark}] {report.name}: {goal.text} ({goal.detail})")
        if not report.available:
            print(f"   [n/a ] {report.name}: not yet available")
    if args.json is not None:
        payload = {"machine": info, "mode": mode, "argv": argv, "reports": [r.as_dict() for r in reports]}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
