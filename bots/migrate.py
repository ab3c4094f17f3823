"""`durable-bots migrate --from sqlite:///var/ops.sqlite --to postgresql://…`: move a stopped bot's store to
PostgreSQL, every record with its id, then verify the counts. The target must be empty."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TextIO

from bots.config import storage_target_of, storage_url_problem
from bots.runtime import EXIT_LOCKED, EXIT_OK, BotError
from harness_core import StorageError, StorageLocked
from harness_core.storage import copy_sqlite_to_postgres


async def migrate_command(source: str, target: str | None, env: Mapping[str, str], out: TextIO) -> int:
    target = target or env.get("DATABASE_URL")
    if not target:
        raise BotError("migrate needs --to postgresql://… (or DATABASE_URL set)")
    for flag, url in (("--from", source), ("--to", target)):
        problem = storage_url_problem(url)
        if problem is not None:
            raise BotError(f"{flag}: {problem}")
    origin = storage_target_of(source, "--from")
    destination = storage_target_of(target, "--to")
    if origin.kind != "sqlite" or origin.path is None:
        raise BotError("--from must name a SQLite store (sqlite:///var/ops.sqlite)")
    if destination.kind != "postgres" or destination.url is None:
        raise BotError("--to must name a PostgreSQL database (postgresql://user@host/db)")
    try:
        report = await copy_sqlite_to_postgres(origin.path, destination.url)
    except StorageLocked as exc:
        raise BotError(f"{exc}; migrate copies a stopped bot's store", EXIT_LOCKED) from None
    except StorageError as exc:
        raise BotError(str(exc)) from None
    print(f"durable-bots: {report.summary()}", file=out)
    print(
        f"durable-bots: ids continue from {report.next_id}; point the bot at it with [storage] url or "
        "DATABASE_URL",
        file=out,
    )
    return EXIT_OK
