"""Small builders shared by the core tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from harness_core import (
    AgentChange,
    Extension,
    Harness,
    HarnessSettings,
    ModelRef,
    Models,
    Registry,
    ToolSpec,
)
from harness_core.messages import AssistantMessage
from harness_core.models import ModelRequest
from harness_core.models.faux import FauxProvider
from harness_core.storage import MemoryStorage, Storage

FAUX = AgentChange(model=ModelRef(provider="faux", model_id="faux-1"))


async def open_harness(
    *,
    storage: Storage | None = None,
    responder: Callable[[ModelRequest], AssistantMessage] | None = None,
    responses: Sequence[Any] = (),
    tools: Sequence[ToolSpec] = (),
    extensions: Sequence[Extension] = (),
    settings: HarnessSettings | None = None,
    faux: FauxProvider | None = None,
    reports: list[BaseException] | None = None,
    now: Callable[[], int] | None = None,
) -> tuple[Harness, FauxProvider]:
    faux = faux or FauxProvider()
    if responses:
        faux.set_responses(list(responses))
    if responder is not None:
        faux.set_responder(responder)
    models = Models(faux)
    registry = Registry()
    if tools:
        registry.install(Extension("test-tools", tools=list(tools)))
    for extension in extensions:
        registry.install(extension)
    harness = await Harness.open(
        storage or await MemoryStorage.open(),
        models=models,
        registry=registry,
        settings=settings,
        on_report=reports.append if reports is not None else None,
        now=now,
    )
    return harness, faux


async def eventually(predicate: Callable[[], Any], timeout: float = 5.0) -> None:
    """Poll an async or sync predicate until it is truthy (for conditions with no event to await)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def task_reaches(harness: Harness, task_id: int, status: str) -> Any:
    """Wait until the task's committed state has `status`; return the record."""
    found: list[Any] = []

    async def check() -> bool:
        task = await harness.get_task(task_id)
        if task is not None and task.state.status == status:
            found.append(task)
            return True
        return False

    await eventually(check)
    return found[0]
