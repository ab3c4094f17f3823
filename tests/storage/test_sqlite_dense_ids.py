"""Ids people see (task #38, gate #38, deploy-38, conversation #3) stay small and dense across restarts of
any kind: a process SIGKILLed after its commits does not make the next one jump to the meta row's
reservation (4,096 ids above)."""

from __future__ import annotations

import asyncio
import itertools
import sys
from pathlib import Path

from harness_core.storage import SqliteStorage

# Opens a harness on the file, submits one input (an id for the submission, one for its entry...), prints the
# submission's id, and SIGKILLs itself without closing.
WORKER = """
import asyncio, os, signal, sys
from harness_core import Harness, Input

async def main(path, n):
    from harness_core.storage import SqliteStorage
    harness = await Harness.open(await SqliteStorage.open(path))
    root = await harness.root()
    sub = await root.submit(Input(content=f"note {n}", request_id=f"note-{n}"))
    print(sub.id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def submit_and_die(path: Path, n: int) -> int:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WORKER, str(path), str(n), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == -9
    return int(out.decode().split()[0])


async def test_ids_stay_dense_after_every_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "ids.sqlite"
    ids = [await submit_and_die(path, n) for n in range(4)]
    steps = [b - a for a, b in itertools.pairwise(ids)]
    assert all(0 < step < 20 for step in steps), ids  # a few ids per process, never a block of 4,096
    storage = await SqliteStorage.open(path)
    try:
        assert (await storage.meta()).next_id < 100
    finally:
        await storage.close()
