"""The PostgreSQL server of the test session: a throwaway cluster (`harness_core.testing.TemporaryPostgres`:
initdb + pg_ctl in a temp dir, as the `postgres` user when root, fsync off), or the existing server
`DURABLE_BOTS_TEST_DATABASE_URL` names.

Every test gets a database of its own (`fresh_database`): a copy of a template database the harness's schema
migrations already ran in (made once per session; copying is much faster than migrating), or an empty one.
The next copy is made in the background while a test runs (a copy takes ~0.3 s; most tests mostly wait), so a
test that asks for one usually finds it ready.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from harness_core.storage._postgres_schema import migrate
from harness_core.testing import TemporaryPostgres
from harness_core.testing import start_cluster as start_temporary

ENV_URL = "DURABLE_BOTS_TEST_DATABASE_URL"


@dataclass
class Cluster:
    """The session's server (`url` connects as a superuser to the `postgres` database)."""

    server: TemporaryPostgres
    template_ready: bool = False
    # The migrated database made ahead for the next test (its name), on a thread of its own.
    _spare: concurrent.futures.Future[str] | None = None
    _maker: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(max_workers=1)
    )

    @property
    def url(self) -> str:
        return self.server.url

    def database_url(self, name: str) -> str:
        return self.server.database_url(name)

    def stop(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            with contextlib.suppress(Exception):
                drop_database(self, spare.result())
        self._maker.shutdown()
        self.server.stop()


def start_cluster() -> Cluster:
    """Use the server the env var names, else start a private one."""
    if os.environ.get(ENV_URL):
        return Cluster(TemporaryPostgres(url=os.environ[ENV_URL]))
    return Cluster(start_temporary())


# One template per pytest-xdist worker: on a shared server (DURABLE_BOTS_TEST_DATABASE_URL) two workers must not
# drop or copy each other's half-migrated template.
_TEMPLATE = f"harness_template_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


async def _create_database(cluster: Cluster, name: str, migrated: bool) -> None:
    conn = await asyncpg.connect(cluster.url)
    try:
        template = "template0"
        if migrated:
            if not cluster.template_ready:
                await conn.execute(f'DROP DATABASE IF EXISTS "{_TEMPLATE}"')
                await conn.execute(f'CREATE DATABASE "{_TEMPLATE}" TEMPLATE template0')
                target = await asyncpg.connect(cluster.database_url(_TEMPLATE))
                try:
                    await migrate(target, _TEMPLATE)
                finally:
                    await target.close()
                cluster.template_ready = True
            template = _TEMPLATE
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    finally:
        await conn.close()


async def _drop_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def _run(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine to completion on a loop of its own, in a thread: fixtures may be asked for from inside
    a running test loop (request.getfixturevalue), where asyncio.run() refuses to start."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, coro).result()


def _new_database(cluster: Cluster, migrated: bool) -> str:
    name = "t_" + uuid.uuid4().hex[:16]
    _run(_create_database(cluster, name, migrated))
    return name


def fresh_database(cluster: Cluster, *, migrated: bool = True) -> tuple[str, str]:
    """Create a database with the harness schema (or an empty one); return (its url, its name).
    Runs its own event loop (sync fixtures). A migrated one is the spare made ahead when there is one (made
    from the same template, never used before), and the next spare is started."""
    if not migrated:
        name = _new_database(cluster, migrated=False)
        return cluster.database_url(name), name
    spare, cluster._spare = cluster._spare, None
    name = ""
    if spare is not None:
        with contextlib.suppress(Exception):  # a failed spare: make one here, where an error is seen
            name = spare.result()
    if not name:
        name = _new_database(cluster, migrated=True)  # also makes the template, once
    cluster._spare = cluster._maker.submit(_new_database, cluster, True)
    return cluster.database_url(name), name


def drop_database(cluster: Cluster, name: str) -> None:
    with contextlib.suppress(Exception):
        _run(_drop_database(cluster.url, name))
