"""`search_logs` on RE2: model-written patterns cost linear time, unsupported syntax gets a clear error, big
files and long lines are read in bounded pieces off the event loop, and a search can be stopped."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bots.log_search import MAX_LINE, MAX_PATTERN, SHOWN_LINE, search_log_files

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "config" / "sample-logs"
CATASTROPHIC = r"(\S+\s*)+!"  # exponential for a backtracking engine on any line with a few words


def big_log(path: Path, lines: int) -> Path:
    row = b"2025-11-29T02:58:11Z checkout ERROR OrderService: NullPointerException at checkout.Cart.total\n"
    with path.open("wb") as handle:
        for _ in range(lines // 1000):
            handle.write(row * 1000)
    return path


def test_a_catastrophic_pattern_costs_what_any_pattern_costs() -> None:
    # With `re` this never ends (seconds to ages per line, the GIL held throughout).
    found = search_log_files(LOGS, CATASTROPHIC, 50)
    assert not found.is_error
    assert str(found.content) == f"No matches for /{CATASTROPHIC}/ in 4 log file(s)."


@pytest.mark.parametrize(
    ("pattern", "named"),
    [
        (r"(error)\1", r"a backreference `\1`"),
        (r"(?P<svc>\w+) (?P=svc)", "a named backreference `(?P=name)`"),
        (r"checkout(?=ERROR)", "a lookahead `(?=...)`"),
        (r"checkout(?!ERROR)", "a negative lookahead `(?!...)`"),
        (r"(?<=checkout )ERROR", "a lookbehind `(?<=...)`"),
        (r"(?<!checkout )ERROR", "a negative lookbehind `(?<!...)`"),
        (r"(?>ERROR)", "an atomic group `(?>...)`"),
        (r"ERROR++", "a possessive quantifier"),
        (r"timeout\Z", r"`\Z` (write `\z` or `$` instead)"),
        (r"a{1001}", "a repetition count over 1000"),
    ],
)
def test_syntax_re2_lacks_gets_an_error_naming_the_construct(pattern: str, named: str) -> None:
    found = search_log_files(LOGS, pattern, 50)
    assert found.is_error
    text = str(found.content)
    assert "RE2, a linear-time regex engine" in text
    assert f"This pattern uses {named}" in text, text
    assert "Traceback" not in text and "re2.error" not in text


def test_text_that_is_no_regex_is_searched_as_written_and_anchors_work_per_line() -> None:
    literal = search_log_files(LOGS, "statement timeout (", 50)
    assert str(literal.content).startswith("No matches")
    anchored = search_log_files(LOGS, r"version=1\.4\.2\)$", 50)
    assert str(anchored.content).startswith("4 match(es)"), "the line ending is not part of the line"


def test_oversized_patterns_are_refused_with_the_bound() -> None:
    long = search_log_files(LOGS, "a" * (MAX_PATTERN + 1), 50)
    assert long.is_error and f"use at most {MAX_PATTERN}" in str(long.content)
    complex_ = search_log_files(LOGS, r"(\S*\s*){1000}!", 50)
    assert complex_.is_error and "too complex to search with" in str(complex_.content)
    assert search_log_files(LOGS, "   ", 50).is_error


def test_a_huge_line_is_searched_in_its_head_and_line_numbers_stay_right(tmp_path: Path) -> None:
    log = tmp_path / "one.log"
    with log.open("wb") as handle:
        handle.write(b"needle-head " + b"x" * (4 * 1024 * 1024) + b" needle-tail\n")
        handle.write(b"second line with a needle\n")
    head = search_log_files(log, "needle-head", 50)
    assert str(head.content).startswith("1 match(es)")
    (shown,) = str(head.content).splitlines()[1:]
    assert shown.startswith("one.log:1: needle-head xxx") and len(shown) < SHOWN_LINE + 20
    tail = search_log_files(log, "needle-tail", 50)
    assert str(tail.content).startswith("No matches"), f"only the first {MAX_LINE} bytes of a line count"
    second = search_log_files(log, "second line", 50)
    assert "one.log:2: second line with a needle" in str(second.content)


def test_a_pattern_matching_everything_gives_a_bounded_result(tmp_path: Path) -> None:
    log = big_log(tmp_path / "big.log", 50_000)
    found = search_log_files(log, ".", 20)
    text = str(found.content)
    assert text.startswith("50000 match(es) for /./ in 1 log file(s) (showing the first 20):")
    assert len(text.splitlines()) == 21 and len(text) < 21 * (SHOWN_LINE + 40)


def test_a_stopped_search_ends_at_once_with_what_it_found(tmp_path: Path) -> None:
    log = big_log(tmp_path / "big.log", 200_000)
    stop = threading.Event()
    stop.set()
    stopped = search_log_files(log, "ERROR", 50, stop=stop)
    assert "the search stopped early: it was stopped" in str(stopped.content)
    late = search_log_files(log, "ERROR", 50, deadline=time.monotonic())
    assert "the search stopped early: it ran out of time" in str(late.content)


async def test_the_event_loop_keeps_running_while_a_long_search_runs(tmp_path: Path) -> None:
    log = big_log(tmp_path / "big.log", 300_000)
    stop = threading.Event()
    lags: list[float] = []

    async def tick() -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - before - 0.01)

    ticker = asyncio.get_running_loop().create_task(tick())
    try:
        search = asyncio.ensure_future(asyncio.to_thread(search_log_files, log, CATASTROPHIC, 50, stop=stop))
        await asyncio.sleep(0.3)
        stop.set()  # what the tool does when it is cancelled
        result = await asyncio.wait_for(search, 10)
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
    # It ticked while the search ran (no bound on how late: the suite asserts no timings; a search holding the
    # loop would let it tick about once).
    assert len(lags) > 5, "the loop ran meanwhile"
    assert "stopped early" in str(result.content) or str(result.content).startswith("No matches")


PATTERN_TEXT = st.text(alphabet="()[]{}*+?|\\^$.:=<>!PZzbBdDsSwW0123456789 aeErRoO-,", max_size=40)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=st.one_of(PATTERN_TEXT, st.text(max_size=40)))
@example(pattern="a(?=b)[[x]")  # RE2 refuses the lookahead; Python's `re` warns of a possible nested set
def test_any_pattern_gets_a_result_never_an_exception(pattern: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a process run with -W error: no warning may end the search either
        found = search_log_files(LOGS, pattern, 50)
    assert isinstance(found.content, str) and found.content
    if found.is_error:
        assert "Traceback" not in found.content
