"""A throwaway PostgreSQL cluster for the test session, or the server `DURABLE_BOTS_TEST_DATABASE_URL` names.

The cluster lives in a temp dir: `initdb` (trust auth, loopback only), then `pg_ctl start` on a free loopback
port with its socket in the same dir. As root both run as the `postgres` user, which PostgreSQL requires.
`fsync=off`: a test cluster is thrown away, so we trade crash-safety of the *server* for speed; the
harness's own crash tests kill our processes, never the server, so they still test what they claim.
Every test gets a database of its own (`fresh_database`): a copy of a template database the harness's schema
migrations already ran in (made once per session; copying is much faster than migrating), or an empty one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from harness_core.storage._postgres_schema import migrate

ENV_URL = "DURABLE_BOTS_TEST_DATABASE_URL"


def find_bin_dir() -> Path:
    """The directory holding initdb/pg_ctl: PATH first, then Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("initdb")
    if found is not None and shutil.which("pg_ctl") is not None:
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if candidates:
        return Path(candidates[0]).parent
    raise RuntimeError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql/*/bin: "
        f"install the `postgresql` package (.ci/run does) or set {ENV_URL} to an existing server"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


@dataclass
class Cluster:
    """A running server: `url` connects as a superuser to the `postgres` database."""

    url: str
    data_dir: Path | None = None
    bin_dir: Path | None = None
    root: Path | None = None
    template_ready: bool = False

    def database_url(self, name: str) -> str:
        parts = urlsplit(self.url)
        return urlunsplit(parts._replace(path="/" + name))

    def stop(self) -> None:
        if self.data_dir is None or self.bin_dir is None:
            return
        subprocess.run(
            _as_server_user(
                [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "stop"]
            ),
            check=False,
            capture_output=True,
        )
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


def start_cluster() -> Cluster:
    """Use the server the env var names, else initdb and start a private one."""
    if os.environ.get(ENV_URL):
        return Cluster(url=os.environ[ENV_URL])
    bin_dir = find_bin_dir()
    # Not under pytest's tmp dirs: those are 0700 root, and the server runs as `postgres`.
    root = Path(tempfile.mkdtemp(prefix="durable-bots-pg-"))
    data = root / "data"
    user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        os.chown(root, entry.pw_uid, entry.pw_gid)
    port = _free_port()
    subprocess.run(
        _as_server_user(
            [str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", user, "-E", "UTF8", "--no-sync"]
        ),
        check=True,
        capture_output=True,
    )
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root} "
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
    )
    subprocess.run(
        _as_server_user(
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(root / "server.log"),
                "-w",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
    )
    return Cluster(
        url=f"postgresql://{user}@127.0.0.1:{port}/postgres", data_dir=data, bin_dir=bin_dir, root=root
    )


_TEMPLATE = "harness_template"


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


def fresh_database(cluster: Cluster, *, migrated: bool = True) -> tuple[str, str]:
    """Create a database with the harness schema (or an empty one); return (its url, its name).
    Runs its own event loop (sync fixtures)."""
    name = "t_" + uuid.uuid4().hex[:16]
    _run(_create_database(cluster, name, migrated))
    return cluster.database_url(name), name


def drop_database(cluster: Cluster, name: str) -> None:
    with contextlib.suppress(Exception):
        _run(_drop_database(cluster.url, name))
