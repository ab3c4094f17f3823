"""Storage faults at the CLI: every command ends with one `durable-bots: ...` line and a documented exit code
(3 storage unusable, 4 corrupt), never a traceback. Real `python -m bots` processes over real files; the
read-only case runs the command in a private mount namespace where the data directory is bind-mounted
read-only (a real EROFS from the kernel, not a simulation)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from bots_cli_support import REPO, Result, bot_env, cli, write_config

from bots.cli import _guarded
from bots.runtime import EXIT_CORRUPT, EXIT_ERROR, EXIT_STORAGE, storage_exit_code
from harness_core import HarnessClosed, StorageCorrupt, StorageError
from harness_core.records import Conversation, Entry
from harness_core.storage import CommitBatch, SqliteStorage

pytestmark = pytest.mark.slow

COMMANDS = (["run"], ["inspect"], ["tasks"], ["approvals"], ["retry", "1"], ["export", "1"])


def ends_with_one_line(result: Result) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("durable-bots: "), result.stderr
    return last


async def damaged_store(path: Path) -> None:
    storage = await SqliteStorage.open(path)
    entries = [Entry(id=n, conversation_id=1, kind="t.note", data={"t": "x" * 300}) for n in range(2, 200)]
    await storage.commit(
        [CommitBatch(seq=1, next_id=300, conversations=[Conversation(id=1)], entries=entries)]
    )
    await storage.close()
    damage_entries(path)


def damage_entries(path: Path) -> None:
    """Overwrite the entries table's root page header (a table the open itself never reads)."""
    conn = sqlite3.connect(path)
    (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'entries'").fetchone()
    conn.close()
    with open(path, "r+b") as handle:
        handle.seek((root - 1) * 4096)
        handle.write(b"\xff" * 64)


async def test_every_command_on_a_corrupt_store_ends_with_one_line_and_exit_4(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    config = write_config(tmp_path)
    store = tmp_path / "bot.sqlite"
    await damaged_store(store)
    for command in COMMANDS:  # one at a time: each takes the owner lock
        result = await cli(config, *command, env=env)
        assert result.returncode == EXIT_CORRUPT, (command, result.stderr)
        last = ends_with_one_line(result)
        assert str(store) in last and "restore it from a backup" in last, command


async def test_a_zero_length_store_is_refused_by_every_command(tmp_path: Path) -> None:
    env = bot_env(tmp_path)
    config = write_config(tmp_path)
    (tmp_path / "bot.sqlite").touch()
    for command in (["run"], ["inspect"]):
        result = await cli(config, *command, env=env)
        assert result.returncode == EXIT_CORRUPT, (command, result.stderr)
        assert "empty (zero-length) file" in ends_with_one_line(result)
    assert (tmp_path / "bot.sqlite").stat().st_size == 0  # not started as an empty store


def read_only_cli(data: Path, config: Path, *args: str, env: dict[str, str]) -> Result:
    script = f'mount --bind "{data}" "{data}" && mount -o remount,bind,ro "{data}" && exec "$@"'
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0:
        unshare.append("--map-root-user")  # unprivileged: a user namespace grants the mount
    done = subprocess.run(
        [*unshare, "sh", "-c", script, "sh", sys.executable, "-m", "bots", *args, "--config", str(config)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return Result(done.returncode, done.stdout, done.stderr)


async def test_a_read_only_file_system_ends_with_one_line_and_exit_3(tmp_path: Path) -> None:
    assert shutil.which("unshare") is not None, "the read-only test needs util-linux unshare"
    data = tmp_path / "data"
    data.mkdir()
    env = bot_env(tmp_path)
    config = write_config(data)
    storage = await SqliteStorage.open(data / "bot.sqlite")  # a healthy store, then the disk turns read-only
    await storage.close()
    for command in (["run"], ["inspect"], ["export", "1", "--out", str(data / "out.jsonl")]):
        result = read_only_cli(data, config, *command, env=env)
        assert result.returncode == EXIT_STORAGE, (command, result.stderr)
        last = ends_with_one_line(result)
        assert "Read-only file system" in last, command
        if command[0] != "export":  # export names the file it could not write, not the storage
            assert "make the storage directory writable" in last, command


def test_a_storage_failure_under_a_running_command_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def corrupt_mid_command() -> int:
        raise HarnessClosed("failed", StorageCorrupt("storage /x.db holds an unreadable entries row"))

    def io_error() -> int:
        raise StorageError("storage /x.db: commit failed: disk I/O error")

    assert _guarded(corrupt_mid_command) == EXIT_CORRUPT
    assert _guarded(io_error) == EXIT_STORAGE
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "durable-bots: storage /x.db holds an unreadable entries row",
        "durable-bots: storage /x.db: commit failed: disk I/O error",
    ]


def test_a_run_stopped_by_its_storage_exits_with_the_storage_codes() -> None:
    assert storage_exit_code(StorageCorrupt("storage /x.db holds an unreadable entries row")) == EXIT_CORRUPT
    assert storage_exit_code(StorageError("storage /x.db: commit failed: disk I/O error")) == EXIT_STORAGE
    assert storage_exit_code(RuntimeError("a bug")) == EXIT_ERROR
