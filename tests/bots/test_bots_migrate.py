"""`durable-bots migrate`: a stopped bot's SQLite store copied into PostgreSQL, every record with its id and
every document revision, counts verified; a non-empty target and a running source are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from bots_cli_support import bot_env, cli

from harness_core import AgentChange, Harness, Input, ModelRef, Models
from harness_core.models.faux import FauxProvider, faux_assistant
from harness_core.storage import PostgresStorage, SqliteStorage, Storage

pytestmark = pytest.mark.timeout(90)
MODEL = AgentChange(model=ModelRef(provider="faux", model_id="faux-1"))


async def make_store(path: Path) -> None:
    faux = FauxProvider()
    faux.set_responses([faux_assistant("first answer"), faux_assistant("second answer")])
    harness = await Harness.open(await SqliteStorage.open(path), models=Models(faux))
    root = await harness.root(agent=MODEL)
    harness.resume()
    for n in (1, 2):
        sub = await root.submit(Input(content=f"question {n}", request_id=f"q{n}"))
        assert (await sub.wait()).status == "done"
    await harness.close()


async def everything(storage: Storage) -> dict[str, object]:
    conversations = (await storage.scan_conversations(limit=1000)).items
    tasks = (await storage.scan_tasks(limit=1000)).items
    entries = [e for c in conversations for e in (await storage.scan_entries(c.id, limit=1000)).items]
    docs = [
        d
        for c in conversations
        for d in await storage.scan_documents(scope="conversation", scope_id=c.id, alive_only=False)
    ]
    docs += [
        d for t in tasks for d in await storage.scan_documents(scope="task", scope_id=t.id, alive_only=False)
    ]
    docs += await storage.scan_documents(scope="session", alive_only=False)
    return {
        "conversations": conversations,
        "entries": entries,
        "tasks": tasks,
        "submissions": (await storage.scan_submissions(limit=1000)).items,
        "docs": docs,
        "contents": [await storage.document_contents(d.id) for d in docs],
        "values": [await storage.document(d.id) for d in docs],
    }


async def test_migrate_copies_every_record_with_its_id_and_refuses_a_second_copy(
    tmp_path: Path, pg_url: str
) -> None:
    source = tmp_path / "ops.sqlite"
    await make_store(source)
    env = bot_env(tmp_path)
    done = await cli(
        tmp_path / "unused.toml", "migrate", "--from", f"sqlite:///{source}", "--to", pg_url, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "counts verified" in done.stdout
    assert "entries" in done.stdout

    sqlite = await SqliteStorage.open(source)
    try:
        expected = await everything(sqlite)
        expected_meta = await sqlite.meta()
    finally:
        await sqlite.close()
    postgres = await PostgresStorage.open(pg_url)
    try:
        assert await everything(postgres) == expected
        assert expected["entries"] and expected["docs"]
        meta = await postgres.meta()
        assert meta.next_id >= expected_meta.next_id
        assert meta.last_seq >= expected_meta.last_seq
    finally:
        await postgres.close()

    # The bot carries on over PostgreSQL: same conversation, new ids above the copied ones.
    faux = FauxProvider()
    faux.set_responses([faux_assistant("third answer")])
    harness = await Harness.open(await PostgresStorage.open(pg_url), models=Models(faux))
    try:
        root = await harness.root(agent=MODEL)
        harness.resume()
        sub = await root.submit(Input(content="question 3", request_id="q3"))
        settled = await sub.wait()
        assert settled.status == "done"
        assert settled.answer is not None
        assert settled.answer > max(e.id for e in expected["entries"])  # type: ignore[attr-defined]
    finally:
        await harness.close()

    again = await cli(
        tmp_path / "unused.toml", "migrate", "--from", f"sqlite:///{source}", "--to", pg_url, env=env
    )
    assert again.returncode == 1
    assert "already holds records" in again.stderr
    assert "durable-bots: " in again.stderr


async def test_migrate_refuses_a_running_source_and_bad_urls(tmp_path: Path, pg_url: str) -> None:
    source = tmp_path / "ops.sqlite"
    await make_store(source)
    env = bot_env(tmp_path)
    running = await SqliteStorage.open(source)  # as a running bot holds it
    try:
        held = await cli(
            tmp_path / "x.toml", "migrate", "--from", f"sqlite:///{source}", "--to", pg_url, env=env
        )
    finally:
        await running.close()
    assert held.returncode == 2
    assert "stopped bot" in held.stderr
    wrong = await cli(tmp_path / "x.toml", "migrate", "--from", pg_url, "--to", pg_url, env=env)
    assert wrong.returncode == 1
    assert "--from must name a SQLite store" in wrong.stderr
    missing = await cli(
        tmp_path / "x.toml", "migrate", "--from", f"sqlite:///{tmp_path}/nope.sqlite", "--to", pg_url, env=env
    )
    assert missing.returncode == 1
    assert "there is no SQLite store" in missing.stderr
