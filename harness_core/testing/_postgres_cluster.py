"""`TemporaryPostgres`: a throwaway PostgreSQL server for tests and benchmarks of code on `PostgresStorage`.

`start_cluster()` runs `initdb` (trust auth, loopback only) into a new temp dir and `pg_ctl start` on a free
loopback port with its socket in the same dir; as root both run as the `postgres` user, which PostgreSQL
requires. By default `fsync=off`: a throwaway server trades its own crash-safety for speed (kill your
processes in crash tests, never the server); `start_cluster(durable=True)` keeps PostgreSQL's defaults
(benchmarks). `stop()` shuts it down and removes the dir.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit


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
        "install the `postgresql` package"
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
class TemporaryPostgres:
    """A running server: `url` connects as a superuser to the `postgres` database."""

    url: str
    data_dir: Path | None = None
    bin_dir: Path | None = None
    root: Path | None = None

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


def start_cluster(*, durable: bool = False) -> TemporaryPostgres:
    """initdb and start a private server (the binaries from PATH or /usr/lib/postgresql/*/bin); `durable`
    keeps fsync and synchronous commits on."""
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
        "-c max_connections=200"
    )
    if not durable:
        options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
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
    return TemporaryPostgres(
        url=f"postgresql://{user}@127.0.0.1:{port}/postgres", data_dir=data, bin_dir=bin_dir, root=root
    )
