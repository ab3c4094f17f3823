"""Fixtures of the devchat tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from .support import Rig, make_rig


@pytest.fixture
async def rig_factory(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Rig]]]:
    rigs: list[Rig] = []

    async def make(**options: Any) -> Rig:
        rig = await make_rig(tmp_path / f"rig{len(rigs)}", **options)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        await rig.close()


@pytest.fixture
async def rig(rig_factory: Callable[..., Awaitable[Rig]]) -> Rig:
    """Harness + bridge + devchat adapter started in the order the `bots` runtime uses (bridge first)."""
    made = await rig_factory()
    await made.bridge.start()
    await made.start_adapter()
    made.harness.resume()
    return made
