"""A storage shared by processes may pass to another owner between a tool's intent commit and its execution:
the harness asks the storage's `check_owner()` right before executing, so an ex-owner causes no tool effect."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from harness_core import Input, LeaseLost, tool
from harness_core.models.faux import faux_assistant, faux_tool_call
from harness_core.storage import CommitBatch, MemoryStorage

from .helpers import FAUX, open_harness


class HandedOverStorage(MemoryStorage):
    """Memory storage that 'loses its lease' once a tool task is stored (as if another process took over)."""

    lost = False
    checks = 0

    def check_owner(self) -> None:
        self.checks += 1
        if self.lost:
            raise LeaseLost("the lease was taken over by pid 2 on elsewhere")

    async def commit(self, batches: Sequence[CommitBatch]) -> None:
        await super().commit(batches)
        if any(t.kind == "core.tool" for b in batches for t in b.tasks):
            self.lost = True


async def test_no_tool_effect_after_the_store_passed_to_another_owner() -> None:
    ran: list[str] = []

    @tool
    def deploy(service: str) -> str:
        """Deploy a service."""
        ran.append(service)
        return "deployed"

    storage = HandedOverStorage()
    harness, _ = await open_harness(
        storage=storage,
        tools=[deploy],
        responses=[
            faux_assistant([faux_tool_call("deploy", {"service": "api"}, id="c1")], stop_reason="toolUse")
        ],
    )
    try:
        root = await harness.root(agent=FAUX)
        harness.resume()
        await root.submit(Input(content="deploy api", request_id="r1"))
        for _ in range(100):
            if storage.checks:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        assert storage.checks >= 1
        assert ran == []
    finally:
        await harness.close()


async def test_an_owning_storage_lets_the_tool_run() -> None:
    ran: list[str] = []

    @tool
    def deploy(service: str) -> str:
        """Deploy a service."""
        ran.append(service)
        return "deployed"

    storage = HandedOverStorage()
    storage.commit = MemoryStorage.commit.__get__(storage)  # type: ignore[method-assign]  # never loses it
    harness, _ = await open_harness(
        storage=storage,
        tools=[deploy],
        responses=[
            faux_assistant([faux_tool_call("deploy", {"service": "api"}, id="c1")], stop_reason="toolUse"),
            faux_assistant("done"),
        ],
    )
    try:
        root = await harness.root(agent=FAUX)
        harness.resume()
        sub = await root.submit(Input(content="deploy api", request_id="r1"))
        assert (await sub.wait()).status == "done"
        assert ran == ["api"]
        assert storage.checks >= 1
    finally:
        await harness.close()
