"""`run_bot` in process, for what a subprocess cannot show: the state of the interpreter once the bot is ready."""

from __future__ import annotations

import asyncio
import gc
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from bots_cli_support import bot_env, toml_value, write_config

from bots.config import load_config
from bots.runtime import Console, run_bot


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session keeps its normal collector


@pytest.mark.parametrize("store", ["sqlite", "workers"])
async def test_once_ready_the_startup_heap_is_out_of_the_collectors_full_passes(
    tmp_path: Path, unfrozen: None, store: str, request: pytest.FixtureRequest
) -> None:
    path = write_config(tmp_path)
    if store == "workers":  # a worker over a PostgreSQL store split into partitions: the same once ready
        url: str = request.getfixturevalue("pg_url")
        text = path.read_text().replace(
            f"path = {toml_value(str(tmp_path / 'bot.sqlite'))}",
            f"url = {toml_value(url)}\npartitions = 4\nlease_ttl = 2",
        )
        path.write_text(text)
    config = load_config(path)
    out = io.StringIO()
    stop = asyncio.Event()
    assert gc.get_freeze_count() == 0
    running = asyncio.create_task(run_bot(config, [], bot_env(tmp_path), console=Console(out), stop=stop))
    try:
        for _ in range(500):
            if "durable-bots: ready" in out.getvalue() or running.done():
                break
            await asyncio.sleep(0.02)
        assert "durable-bots: ready" in out.getvalue(), out.getvalue()
        # imported modules, config, harness and adapters: far more than a bare interpreter's few thousand
        assert gc.get_freeze_count() > 20_000, out.getvalue()
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0, out.getvalue()
