"""Commands that write a file (`backup FILE`, `export --out FILE`) against an unlucky target: a directory, a path
under a regular file, a device or pipe. Each ends with one `durable-bots: …` line and exit code 1, never a
traceback, and never replaces something that is not a regular file."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from bots_cli_support import toml_value

from bots.cli import main
from harness_core.storage import SqliteStorage


@pytest.fixture
def config(tmp_path: Path) -> Path:
    store = tmp_path / "var" / "ops.sqlite"

    async def create() -> None:
        await (await SqliteStorage.open(store)).close()

    asyncio.run(create())
    path = tmp_path / "bot.toml"
    path.write_text(f'[storage]\npath = {toml_value(str(store))}\n[approvals]\napprovers = ["lead"]\n')
    return path


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("durable-bots: "), err
    return lines[0]


def test_backup_into_a_directory_or_under_a_file_is_one_line(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "somedir").mkdir()
    assert main(["backup", "--config", str(config), str(tmp_path / "somedir")]) == 1
    assert "somedir" in one_line_error(capsys)
    assert (tmp_path / "somedir").is_dir() and not list((tmp_path / "somedir").iterdir())
    (tmp_path / "plain").write_text("x")
    assert main(["backup", "--config", str(config), str(tmp_path / "plain" / "copy.sqlite")]) == 1
    assert "plain" in one_line_error(capsys)


def test_backup_never_replaces_a_device_or_pipe(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    assert main(["backup", "--config", str(config), str(pipe)]) == 1
    assert "not a regular file" in one_line_error(capsys)
    assert pipe.is_fifo()


def test_export_under_a_file_or_into_a_directory_is_one_line(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "plain").write_text("x")
    assert main(["export", "--config", str(config), "1", "--out", str(tmp_path / "plain" / "t.jsonl")]) == 1
    assert "plain" in one_line_error(capsys)
    (tmp_path / "somedir").mkdir()
    assert main(["export", "--config", str(config), "1", "--out", str(tmp_path / "somedir")]) == 1
    one_line_error(capsys)
    assert (tmp_path / "somedir").is_dir()


@pytest.mark.parametrize(
    "command",
    [["inspect"], ["tasks"], ["approvals"], ["export", "1"], ["retry", "1"], ["cancel", "1"], ["run"]],
)
def test_a_corrupt_storage_file_is_one_line_with_the_fix_for_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    store = tmp_path / "ops.sqlite"
    store.write_bytes(b"this is not a database, a disk ate it" * 3000)
    config = tmp_path / "bot.toml"
    config.write_text(
        f'[storage]\npath = {toml_value(str(store))}\n[approvals]\napprovers = ["lead"]\n'
        "[adapters.devchat]\nport = 0\n"
    )
    assert main([command[0], "--config", str(config), *command[1:]]) == 4  # EXIT_CORRUPT
    line = one_line_error(capsys)
    assert str(store) in line and "backup" in line, line


def test_a_storage_failure_mid_command_is_one_line(
    config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk or a dropped database connection in the middle of a command (after the storage opened)."""
    from bots import cli
    from harness_core import StorageError

    async def failing(*args: object, **kwargs: object) -> int:
        raise StorageError(
            "storage postgresql://bot:hunter2@db/ops: read tasks failed: connection was closed"
        )

    monkeypatch.setattr(cli, "inspect_command", failing)
    assert main(["inspect", "--config", str(config)]) == 3  # EXIT_STORAGE: the storage cannot be used
    line = one_line_error(capsys)
    assert "connection was closed" in line and "hunter2" not in line, line


@pytest.mark.parametrize(
    "command",
    [
        ["retry", "99999999999999999999"],
        ["cancel", "0"],
        ["export", "99999999999999999999"],
        ["approvals", "decide", "99999999999999999999", "approve", "--as", "x"],
    ],
)
def test_an_id_out_of_range_is_a_usage_error_not_a_traceback(
    config: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    try:
        code = main([command[0], "--config", str(config), *command[1:]])
    except SystemExit as exited:  # argparse's own usage error
        code = int(exited.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "from 1 to 9223372036854775807" in err, err
