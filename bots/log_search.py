"""The log search behind `search_logs`: a model-written pattern over files of any size, in bounded work.

Rules (each is a way a model's pattern or a big log could otherwise freeze or exhaust the bot):

- The pattern runs on RE2 (`google-re2`), whose matching time is linear in the text: no catastrophic
  backtracking (`(\\S+\\s*)+!` costs what `ERROR` costs). RE2 lacks backreferences, lookaround, atomic groups,
  possessive quantifiers, conditionals and `\\Z` (write `\\z` or `$`); a pattern using one gets an error naming
  it. Text that is no regular expression at all (`statement timeout (`) is searched literally.
- Patterns are at most `MAX_PATTERN` characters and `MAX_PROGRAM` compiled RE2 steps, and each line is
  searched in its first `MAX_LINE` bytes only, so one line costs bounded time.
- Files are read line by line in binary (never whole), in a worker thread: the event loop never waits for a
  read or a match. RE2 releases the GIL while matching.
- `stop` (set when the tool is cancelled: its time limit, an abort, shutdown) and `deadline` are checked
  before every line, so an abandoned search ends within one line's work; at `deadline` the search returns
  what it found so far, saying it stopped early.
- The result holds at most `limit` matching lines of at most `SHOWN_LINE` characters each; the total count
  keeps going.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import re2

from harness_core import ToolResult

MAX_PATTERN = 1_000  # characters
MAX_PROGRAM = 5_000  # RE2 program size: bounds the per-byte cost of the slowest (NFA) matching
MAX_LINE = 32 * 1024  # bytes of a line that are searched; the rest of a longer line is skipped
SHOWN_LINE = 300  # characters of a matching line shown in the result

# What RE2 says (its error text starts with one of these) -> what the model wrote, in its words.
_UNSUPPORTED = (
    ("invalid perl operator: (?=", "a lookahead `(?=...)`"),
    ("invalid perl operator: (?!", "a negative lookahead `(?!...)`"),
    ("invalid perl operator: (?<=", "a lookbehind `(?<=...)`"),
    ("invalid perl operator: (?<!", "a negative lookbehind `(?<!...)`"),
    ("invalid perl operator: (?>", "an atomic group `(?>...)`"),
    ("invalid perl operator: (?(", "a conditional `(?(...)...)`"),
    ("invalid perl operator: (?P", "a named backreference `(?P=name)`"),  # `(?P<name>...)` itself is fine
    *((f"invalid escape sequence: \\{digit}", f"a backreference `\\{digit}`") for digit in "123456789"),
    ("invalid escape sequence: \\Z", "`\\Z` (write `\\z` or `$` instead)"),
    ("invalid escape sequence: \\", "an escape sequence RE2 does not know"),
    ("bad repetition operator: *+", "a possessive quantifier (`*+`, `++`, `?+`)"),
    ("bad repetition operator: ++", "a possessive quantifier (`*+`, `++`, `?+`)"),
    ("bad repetition operator: ?+", "a possessive quantifier (`*+`, `++`, `?+`)"),
    ("invalid repetition size", "a repetition count over 1000 (`{n}`, nested counts multiplied)"),
    ("pattern too large", "more than the engine's size limit"),
)

log = logging.getLogger("bots.ops")


class PatternRefused(ValueError):
    """The pattern cannot be searched with; the message is meant for the model."""


def _options(*, literal: bool = False) -> Any:
    options = re2.Options()
    options.case_sensitive = False
    options.never_capture = True  # only "does the line match": no group bookkeeping
    options.log_errors = False  # a bad pattern is the model's problem, reported in the result, not stderr
    options.literal = literal
    return options


def compile_pattern(pattern: str) -> Any:
    """An RE2 regex for `pattern` (case-insensitive); raises `PatternRefused` saying why it cannot be used."""
    if not pattern.strip():
        raise PatternRefused("Give a non-empty pattern.")
    if len(pattern) > MAX_PATTERN:
        raise PatternRefused(f"The pattern is {len(pattern)} characters long; use at most {MAX_PATTERN}.")
    try:
        regex = re2.compile(pattern, _options())
    except re2.error as exc:
        raw = exc.args[0] if exc.args else b""
        reason = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        if not _python_regex(pattern):  # plain text (`timeout (`): find it as written
            return re2.compile(pattern, _options(literal=True))
        raise PatternRefused(_unsupported(reason)) from None
    finally:
        re2.purge()  # its cache would keep up to 128 model-written regexes alive (each up to 8 MiB)
    size = regex._regexp.ProgramSize()  # the bound that matters: the NFA's cost per byte
    if size > MAX_PROGRAM:
        raise PatternRefused(
            f"The pattern is too complex to search with ({size} RE2 steps, at most {MAX_PROGRAM}): use "
            "fewer or smaller {n} repetitions."
        )
    return regex


def _python_regex(pattern: str) -> bool:
    """Whether Python's `re` would take it: RE2 refusing a valid regex means an unsupported construct, and
    refusing an invalid one means the model wrote plain text. Compiling is bounded; nothing is matched."""
    try:
        with warnings.catch_warnings():
            # `re` warns about some valid patterns (a possible nested set): only whether it compiles matters
            # here, and a process run with warnings as errors would otherwise fail the search.
            warnings.simplefilter("ignore")
            re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return False
    return True


def _unsupported(reason: str) -> str:
    what = next((name for prefix, name in _UNSUPPORTED if reason.startswith(prefix)), None)
    engine = (
        "The log search uses RE2, a linear-time regex engine without backreferences, lookaround, atomic "
        "groups or possessive quantifiers"
    )
    if what is None:
        return f"{engine}, and it cannot use this pattern ({reason}). Rewrite it in plainer syntax."
    return f"{engine}. This pattern uses {what} ({reason}): rewrite it without that."


def log_files(root: Path) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    for path in sorted(root.rglob("*")):
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(root).parts):
            yield path


class _Budget:
    def __init__(self, stop: threading.Event | None, deadline: float | None) -> None:
        self.stop = stop
        self.deadline = deadline
        self.why: str | None = None

    def over(self) -> bool:
        if self.stop is not None and self.stop.is_set():
            self.why = "it was stopped"
        elif self.deadline is not None and time.monotonic() >= self.deadline:
            self.why = "it ran out of time"
        return self.why is not None


def search_log_files(
    root: Path,
    pattern: str,
    limit: int,
    *,
    stop: threading.Event | None = None,
    deadline: float | None = None,
) -> ToolResult:
    """Search every log file under `root` (or the file `root`) for lines matching `pattern`. Blocking: run it
    in a worker thread. `deadline` is on the `time.monotonic()` clock."""
    if not root.exists():
        log.warning("search_logs: the configured logs.path %s does not exist", root)  # the path: log only
        return ToolResult(
            "The configured log location (logs.path) does not exist; the operator can see which path in the "
            "bot's log.",
            is_error=True,
        )
    try:
        regex = compile_pattern(pattern)
    except PatternRefused as exc:
        return ToolResult(str(exc), is_error=True)
    budget = _Budget(stop, deadline)
    matches: list[str] = []
    total = 0
    files = 0
    for path in log_files(root):
        if budget.over():
            break
        label = path.name if root.is_file() else str(path.relative_to(root))
        try:
            with path.open("rb") as handle:
                if b"\0" in handle.read(1024):
                    continue  # binary
                handle.seek(0)
                files += 1
                for number, line in _lines(handle, budget):
                    if regex.search(line) is not None:
                        total += 1
                        if len(matches) < limit:
                            matches.append(f"{label}:{number}: {_shown(line)}")
        except OSError:
            continue
        if budget.why is not None:
            break
    where = f"in {files} log file(s)"
    if budget.why is not None:
        where += f" (the search stopped early: {budget.why}; narrow the pattern or logs.path)"
    if total == 0:
        return ToolResult(f"No matches for /{pattern}/ {where}.", details={"matches": 0})
    head = f"{total} match(es) for /{pattern}/ {where}"
    if total > len(matches):
        head += f" (showing the first {len(matches)})"
    return ToolResult(head + ":\n" + "\n".join(matches), details={"matches": total})


def _lines(handle: BinaryIO, budget: _Budget) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its ending) with at most MAX_LINE bytes each, until the budget is over."""
    number = 0
    rest_of_long_line = False
    while not budget.over():
        piece = handle.readline(MAX_LINE)
        if not piece:
            return
        complete = piece.endswith(b"\n")
        if rest_of_long_line:  # its head was searched already
            rest_of_long_line = not complete
            continue
        number += 1
        rest_of_long_line = not complete
        yield number, piece.rstrip(b"\r\n")


def _shown(line: bytes) -> str:
    text = line[: SHOWN_LINE * 4].decode("utf-8", errors="replace").rstrip()
    return text if len(text) <= SHOWN_LINE else text[: SHOWN_LINE - 1] + "…"
