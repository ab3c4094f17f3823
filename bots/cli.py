"""`durable-bots` / `python -m bots`: run the bot and the commands an operator needs at 3 a.m.

Exit codes: 0 success; 1 a problem (bad config, unknown task, failed retry, a lost PostgreSQL lease); 2 the
storage is held by another process (the running bot; on PostgreSQL `run` waits as a standby instead unless
`--no-standby`) or the command line is wrong; 3 the storage cannot be used (an I/O error, a read-only file
system, a full disk); 4 the storage is corrupt (restore it from a backup); 130 interrupted.

Every command ends with one `durable-bots: ...` line on stderr when it fails, never a traceback: `main` runs
each command inside `_guarded`, so a command added to `_dispatch` is covered without doing anything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from adapters.redact import redact_text
from bots.backup import backup_storage, check_target, sqlite_source, target_error
from bots.config import BotConfig, ConfigError, load_config
from bots.doctor import doctor_command
from bots.logs import setup_logging
from bots.migrate import migrate_command
from bots.operator import (
    approvals_command,
    cancel_command,
    check_config_command,
    decide_command,
    export_command,
    inspect_command,
    retry_command,
)
from bots.runtime import EXIT_CORRUPT, EXIT_ERROR, EXIT_OK, EXIT_STORAGE, BotError, run_bot
from harness_core import HarnessClosed, StorageCorrupt, StorageError

READ_ONLY_HINT = (
    "the file system is read-only: make the storage directory writable "
    "(the bot writes the database, its -wal file and its lock file there)"
)
log = logging.getLogger("bots.cli")

DEFAULT_CONFIG = "config/ops.toml"
EXIT_USAGE = 2


MAX_ID = 2**63 - 1  # ids are 64-bit integers in both backends


def record_id(text: str) -> int:
    """A task, conversation or gate id on the command line: a bigger number cannot exist, and passed on it
    would fail deep in the storage driver instead of saying what is wrong."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_ID:
        raise argparse.ArgumentTypeError(f"{text!r} is not an id (a whole number from 1 to {MAX_ID})")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        "-c",
        default=os.environ.get("DURABLE_BOTS_CONFIG", DEFAULT_CONFIG),
        help=f"the TOML config (default: $DURABLE_BOTS_CONFIG or {DEFAULT_CONFIG})",
    )
    common.add_argument(
        "--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="stderr logging"
    )
    common.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="stderr logging as text or one JSON object per line (default: [logging] format, else text)",
    )
    parser = argparse.ArgumentParser(
        prog="durable-bots",
        description="Chat agents that survive restarts with nothing lost and nothing done twice.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", parents=[common], help="run the bot on one or more adapters")
    run.add_argument(
        "--adapter",
        "-a",
        action="append",
        default=[],
        metavar="NAME",
        help="slack, discord or devchat; repeat for several (default: every [adapters.<name>] table)",
    )
    run.add_argument("--role", choices=["worker", "intake"], default="worker", help=argparse.SUPPRESS)
    run.add_argument(
        "--no-standby",
        action="store_true",
        help="PostgreSQL: exit with code 2 when another process owns the store, instead of waiting as its standby",
    )

    inspect = sub.add_parser(
        "inspect",
        parents=[common],
        help="conversations, tasks (running/waiting/parked/blocked), approvals, usage",
    )
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    tasks = sub.add_parser("tasks", parents=[common], help="live tasks only")
    tasks.add_argument("--json", action="store_true", help="machine-readable output")

    retry = sub.add_parser("retry", parents=[common], help="clear a parked task and run it")
    retry.add_argument("task", type=record_id, metavar="TASK", help="the task id (see `inspect`)")
    retry.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for it (default 120)")

    cancel = sub.add_parser("cancel", parents=[common], help="abort a live task (in the running bot too)")
    cancel.add_argument("task", type=record_id, metavar="TASK", help="the task id (see `inspect`)")

    approvals = sub.add_parser(
        "approvals",
        parents=[common],
        help="pending and decided approval requests; `approvals decide GATE approve|deny --as NAME`",
    )
    approvals.add_argument(
        "decision",
        nargs="*",
        metavar="decide GATE approve|deny",
        help="decide a pending request as an operator (an override of the approver list, recorded as such)",
    )
    approvals.add_argument("--as", dest="as_name", metavar="NAME", help="who decides (with `decide`)")
    approvals.add_argument("--pending", action="store_true", help="only pending requests")
    approvals.add_argument("--json", action="store_true", help="machine-readable output")

    export = sub.add_parser("export", parents=[common], help="a conversation's transcript as JSONL")
    export.add_argument("conversation", type=record_id, metavar="CONVERSATION", help="the conversation id")
    export.add_argument("--out", "-o", type=Path, help="write to this file instead of stdout")

    migrate = sub.add_parser(
        "migrate",
        parents=[common],
        help="copy a stopped bot's SQLite store into an empty PostgreSQL database",
    )
    migrate.add_argument(
        "--from", dest="source", required=True, metavar="URL", help="sqlite:///var/ops.sqlite"
    )
    migrate.add_argument(
        "--to", dest="target", metavar="URL", help="postgresql://user@host/db (default: $DATABASE_URL)"
    )

    backup = sub.add_parser(
        "backup",
        parents=[common],
        help="a consistent copy of the storage (safe while the bot runs), mode 0600",
    )
    backup.add_argument("file", type=Path, metavar="FILE", help="where to write the copy")

    sub.add_parser("check-config", parents=[common], help="validate the config and summarize it")
    sub.add_parser(
        "doctor",
        parents=[common],
        help="check config, storage, platform tokens and scopes, the model and the deploy webhook",
    )
    return parser


async def _dispatch(args: argparse.Namespace, config: BotConfig) -> int:
    env = dict(os.environ)
    out = sys.stdout
    if args.command == "run":
        # What a worker repeats for its separate intake process (`[workers] intake = "separate"`).
        cli_args = [f"--config={args.config}", f"--log-level={args.log_level}"]
        if args.log_format:
            cli_args.append(f"--log-format={args.log_format}")
        return await run_bot(
            config, args.adapter, env, standby=not args.no_standby, role=args.role, cli_args=cli_args
        )
    if args.command in ("inspect", "tasks"):
        return await inspect_command(config, env, out, as_json=args.json, only_tasks=args.command == "tasks")
    if args.command == "retry":
        return await retry_command(config, env, out, args.task, timeout=args.timeout)
    if args.command == "doctor":
        return await doctor_command(config, env, out)
    if args.command == "cancel":
        return await cancel_command(config, env, out, args.task)
    if args.command == "approvals" and args.decision:
        gate, approve = _decision(args)
        return await decide_command(config, env, out, gate, approve=approve, name=args.as_name)
    if args.command == "approvals":
        return await approvals_command(config, env, out, as_json=args.json, pending_only=args.pending)
    if args.command == "export":
        code, _ = await export_command(config, env, out, args.conversation)
        return code
    raise BotError(f"unknown command {args.command}")


def _decision(args: argparse.Namespace) -> tuple[int, bool]:
    words = list(args.decision)
    usage = "usage: durable-bots approvals decide GATE approve|deny --as NAME"
    if len(words) != 3 or words[0] != "decide" or words[2] not in ("approve", "deny"):
        raise BotError(f"{usage} (got {' '.join(words)!r})", EXIT_USAGE)
    try:
        gate = record_id(words[1])
    except argparse.ArgumentTypeError as exc:
        raise BotError(f"{usage}: GATE {exc}", EXIT_USAGE) from None
    if not args.as_name:
        raise BotError(f"{usage}: --as NAME says who decides (recorded with the decision)", EXIT_USAGE)
    return gate, words[2] == "approve"


def _export_to_file(args: argparse.Namespace, config: BotConfig) -> int:
    """Export into a temporary file renamed into place, so a failed export leaves no half file."""
    target: Path = args.out
    check_target(target)
    tmp = target.with_name(target.name + ".part")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # 0600 like every file the bot writes: a transcript is as private as the storage it comes from.
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "w", encoding="utf-8") as handle:
            code, written = asyncio.run(export_command(config, dict(os.environ), handle, args.conversation))
        tmp.replace(target)
    except OSError as exc:  # a missing or unwritable folder, a full disk: one line, not a traceback
        raise target_error(target, exc) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    print(f"wrote {written} entries of conversation {args.conversation} to {target}", file=sys.stderr)
    return code


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in found:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _read_only(exc: BaseException) -> bool:
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno == errno.EROFS:
            return True
        if isinstance(link, sqlite3.Error) and "readonly" in (getattr(link, "sqlite_errorname", "") or ""):
            return True
    return False


def _fail(message: str, code: int) -> int:
    print(redact_text(f"durable-bots: {message}"), file=sys.stderr)  # a URL in an error may carry credentials
    return code


def _guarded(command: Callable[[], int]) -> int:
    """Run one command; turn every failure into one `durable-bots: ...` line and its exit code."""
    try:
        return command()
    except BotError as exc:
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return 130
    except HarnessClosed as exc:  # the storage failed under a running command
        cause = exc.cause if exc.cause is not None else exc
        return _guarded(lambda: _reraise(cause))
    except StorageCorrupt as exc:
        return _fail(str(exc), EXIT_CORRUPT)
    except StorageError as exc:
        detail = f"{exc}; {READ_ONLY_HINT}" if _read_only(exc) else str(exc)
        return _fail(detail, EXIT_STORAGE)
    except OSError as exc:
        if _read_only(exc):
            return _fail(f"{exc}; {READ_ONLY_HINT}", EXIT_STORAGE)
        return _fail(str(exc), EXIT_ERROR)
    except Exception as exc:  # a bug: the detail goes to the log, the command still ends with one line
        log.error("unexpected error", exc_info=exc)
        return _fail(
            f"unexpected error ({type(exc).__name__}: {exc}); the log above has the details", EXIT_ERROR
        )


def _reraise(exc: BaseException) -> int:
    raise exc


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format or "text")
    if args.command == "migrate":  # needs no config: both stores are named on the command line
        return _guarded(
            lambda: asyncio.run(migrate_command(args.source, args.target, dict(os.environ), sys.stdout))
        )
    return _guarded(lambda: _command(args))


def _command(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_ERROR
    if args.log_format is None and config.logging.format != "text":
        setup_logging(args.log_level, config.logging.format)
    if args.command == "check-config":
        return check_config_command(config, dict(os.environ), sys.stdout, sys.stderr)
    if args.command == "backup":
        source = sqlite_source(config, dict(os.environ))
        size = backup_storage(source, args.file)
        print(f"backed up {source} to {args.file} ({size} bytes, mode 0600)")
        return EXIT_OK
    if args.command == "export" and args.out is not None:
        return _export_to_file(args, config)
    return asyncio.run(_dispatch(args, config))
