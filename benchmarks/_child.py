"""Entry point of benchmark child processes: `python -m benchmarks._child MODULE FUNCTION JSON`.

Runs `benchmarks.MODULE.FUNCTION(args)` (a coroutine function) and prints its JSON result as the last line.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys


def main() -> None:
    module, function, payload = sys.argv[1:4]
    target = getattr(importlib.import_module(f"benchmarks.{module}"), function)
    result = asyncio.run(target(json.loads(payload)))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
