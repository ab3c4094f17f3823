"""Fixtures for the harness-level provider tests (`test_harness_*.py`): `dialect` runs a test once per HTTP
provider, `script` answers its respx-mocked endpoint, `open_rig` opens harnesses over it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import respx

from .harness_support import DIALECTS, Dialect, Rigs, Script


@pytest.fixture(params=DIALECTS, ids=lambda d: d.name)
def dialect(request: pytest.FixtureRequest) -> Dialect:
    value: Dialect = request.param
    return value


@pytest.fixture
def script(dialect: Dialect) -> Iterator[Script]:
    script = Script()
    with respx.mock(assert_all_called=False) as router:
        router.post(dialect.url).mock(side_effect=script)
        yield script


@pytest.fixture
async def open_rig(dialect: Dialect, script: Script) -> AsyncIterator[Rigs]:
    rigs = Rigs(dialect, script)
    yield rigs
    await rigs.aclose()
