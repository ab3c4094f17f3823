"""A runaway `search_logs` in a real `python -m bots run` process on devchat (the shipped config): while it
runs, another channel is answered and `/healthz` answers within a second, and the search itself ends (a
result or a time-limit error) within the tool's time limit.

With the old `re` search, `(\\S+\\s*)+!` held the GIL for seconds per line: nothing else in the process ran,
so these deadlines failed (and SIGTERM waited for the search too).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from bots_cli_support import BotProcess, bot_env, shipped_config_in, toml_value

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CATASTROPHIC = r"(\S+\s*)+!"
SLOW_FOR_RE2 = r"(\S+\s*){300}!"  # linear, but on long varied lines RE2 leaves its DFA for the slower NFA
ANSWERED_WITHIN = 1.0  # seconds: what "the other channels are answered while it runs" means here


class Chat:
    """One devchat page: post into channels, note when each bot answer became final."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.final: dict[str, tuple[float, str]] = {}  # channel -> (monotonic time, text) of the first answer
        self.reader = asyncio.get_running_loop().create_task(self.read())

    async def read(self) -> None:
        async for frame in self.ws:
            payload = json.loads(frame.data)
            messages = (
                [e.get("message") or {} for e in payload.get("events", [])]
                if payload["type"] == "events"
                else []
            )
            messages += payload.get("messages", []) if payload["type"] == "snapshot" else []
            for message in messages:
                if message.get("kind") == "bot" and message.get("final"):
                    self.final.setdefault(message["channel"], (time.monotonic(), message["text"]))

    async def post(self, channel: str, text: str, client_id: str) -> float:
        await self.ws.send_json(
            {
                "type": "post",
                "name": "carol",
                "channel": channel,
                "thread": None,
                "text": text,
                "client_id": client_id,
            }
        )
        return time.monotonic()

    async def answer(self, channel: str, timeout: float) -> tuple[float, str]:
        deadline = time.monotonic() + timeout
        while channel not in self.final:
            assert time.monotonic() < deadline, f"no answer in #{channel} within {timeout} s"
            await asyncio.sleep(0.01)
        return self.final[channel]

    async def close(self) -> None:
        await self.ws.close()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)


async def healthz_seconds(session: aiohttp.ClientSession, url: str) -> float:
    started = time.monotonic()
    async with session.get(url + "healthz", timeout=aiohttp.ClientTimeout(total=10)) as response:
        assert response.status == 200
    return time.monotonic() - started


def random_log(workdir: Path) -> Path:
    """400 lines of 32,000 random letters and spaces: minutes of `re` backtracking per line for SLOW_FOR_RE2,
    and seconds in all for RE2."""
    logs = workdir / "logs"
    logs.mkdir()
    letters = bytes(b"abcdefghijklmnopqrstuvwxyz "[i % 27] for i in range(256))
    text = random.Random(7).randbytes(400 * 32_000).translate(letters)
    (logs / "big.log").write_bytes(b"\n".join(text[i : i + 32_000] for i in range(0, len(text), 32_000)))
    return logs


async def start_bot(workdir: Path, *, time_limit: float, logs: Path | None) -> tuple[BotProcess, str]:
    """The shipped config (devchat), `search_logs` limited to `time_limit` s, over `logs` if given."""
    replace = {'path = "config/sample-logs"': f"path = {toml_value(str(logs))}"} if logs is not None else None
    config = shipped_config_in(
        workdir, replace=replace, append=f"\n[tools.timeouts]\nsearch_logs = {time_limit}\n"
    )
    bot = await BotProcess.start(config, "--adapter", "devchat", env=bot_env(workdir))
    ready = await bot.wait_for(lambda line: line.startswith("durable-bots: ready"), 60)
    assert ready is not None, f"{bot.output()}\n{await bot.stderr()}"
    (url,) = [line.split()[1] for line in bot.lines if line.startswith("devchat: http://")]
    return bot, url


def search_call(pattern: str) -> str:
    return f"/call search_logs {json.dumps({'pattern': pattern})}"


async def run_search(
    workdir: Path, pattern: str, *, time_limit: float, logs: Path | None = None
) -> dict[str, Any]:
    """Start the bot, ask #ops for the search and #general a plain question right after; return timings."""
    bot, url = await start_bot(workdir, time_limit=time_limit, logs=logs)
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(url + "ws") as ws:
            await ws.send_json({"type": "hello", "cursor": None, "epoch": None})
            chat = Chat(ws)
            try:
                search_posted = await chat.post("ops", search_call(pattern), "runaway-search-0001")
                await asyncio.sleep(0.2)  # the search is under way
                hello_posted = await chat.post("general", "hello", "runaway-hello-0001")
                health = await healthz_seconds(session, url)
                hello_at, hello = await chat.answer("general", 30)
                search_at, search = await chat.answer("ops", time_limit + 30)
            finally:
                await chat.close()
        assert await bot.terminate() == 0, await bot.stderr()
    finally:
        await bot.kill()
    return {
        "hello": hello,
        "hello_seconds": hello_at - hello_posted,
        "health_seconds": health,
        "search": search,
        "search_seconds": search_at - search_posted,
        "search_running_when_answered": search_at > hello_at,
    }


async def test_a_catastrophic_pattern_on_the_sample_logs_stalls_nothing(tmp_path: Path) -> None:
    seen = await run_search(tmp_path, CATASTROPHIC, time_limit=5)
    assert seen["hello"].startswith("Hi carol! I am the ops bot"), seen
    assert seen["hello_seconds"] < ANSWERED_WITHIN, seen
    assert seen["health_seconds"] < ANSWERED_WITHIN, seen
    assert seen["search_seconds"] < 5, seen
    assert seen["search"].startswith(
        "`search_logs` returned:\nNo matches for /(\\S+\\s*)+!/ in 4 log file(s)."
    ), seen


async def test_a_search_longer_than_its_time_limit_ends_within_it_and_the_rest_stays_answered(
    tmp_path: Path,
) -> None:
    logs = random_log(tmp_path)
    seen = await run_search(tmp_path, SLOW_FOR_RE2, time_limit=3, logs=logs)
    assert seen["search_running_when_answered"], seen
    assert seen["hello"].startswith("Hi carol! I am the ops bot"), seen
    assert seen["hello_seconds"] < ANSWERED_WITHIN, seen
    assert seen["health_seconds"] < ANSWERED_WITHIN, seen
    # The search stops itself before the limit with what it has (or the harness stops it at the limit).
    assert seen["search_seconds"] < 3 + 1.5, seen
    assert (
        "the search stopped early: it ran out of time" in seen["search"]
        or "did not finish within its time limit of 3 s" in seen["search"]
    ), seen


async def test_sigterm_during_a_long_search_stops_the_bot_at_once(tmp_path: Path) -> None:
    bot, url = await start_bot(tmp_path, time_limit=60, logs=random_log(tmp_path))
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(url + "ws") as ws:
            await ws.send_json({"type": "hello", "cursor": None, "epoch": None})
            chat = Chat(ws)
            try:
                await chat.post("ops", search_call(SLOW_FOR_RE2), "runaway-search-0002")
                await asyncio.sleep(0.5)  # the search is under way (it needs seconds)
                assert "ops" not in chat.final
            finally:
                await chat.close()
        asked = time.monotonic()
        assert await bot.terminate(timeout=30) == 0, await bot.stderr()
        stopped_after = time.monotonic() - asked
    finally:
        await bot.kill()
    assert stopped_after < 5, f"the running search held up the shutdown for {stopped_after:.1f} s"
    assert "durable-bots: stopped cleanly" in bot.output()


async def test_after_a_sigkill_mid_search_the_replayed_search_ends_within_its_limit(tmp_path: Path) -> None:
    logs = random_log(tmp_path)
    bot, url = await start_bot(tmp_path, time_limit=3, logs=logs)
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(url + "ws") as ws:
            await ws.send_json({"type": "hello", "cursor": None, "epoch": None})
            chat = Chat(ws)
            try:
                await chat.post("ops", search_call(SLOW_FOR_RE2), "runaway-search-0003")
                await asyncio.sleep(0.5)
                assert "ops" not in chat.final
            finally:
                await chat.close()
    finally:
        await bot.kill()  # SIGKILL mid-search
    # search_logs is replay-safe: the restarted bot runs it again, and again it ends within its limit.
    restarted_at = time.monotonic()
    bot, url = await start_bot(tmp_path, time_limit=3, logs=logs)
    try:
        async with aiohttp.ClientSession() as session, session.ws_connect(url + "ws") as ws:
            await ws.send_json({"type": "hello", "cursor": None, "epoch": None})
            chat = Chat(ws)
            try:
                answered_at, answer = await chat.answer("ops", 60)
                assert await healthz_seconds(session, url) < ANSWERED_WITHIN
            finally:
                await chat.close()
        assert await bot.terminate() == 0, await bot.stderr()
    finally:
        await bot.kill()
    assert "the search stopped early: it ran out of time" in answer or "time limit of 3 s" in answer, answer
    assert answered_at - restarted_at < 30, "start-up plus at most one time limit, not an endless replay"
