"""A background loop with one owner: `start()` creates its task, `stop()` cancels it and waits for it."""

from __future__ import annotations

import asyncio


class OwnedLoop:
    """Subclasses implement `_run()` (a loop that runs until cancelled) and name their task."""

    task_name = "background-loop"
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.task_name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        raise NotImplementedError
