"""The Slack HTTP endpoint against hostile requests, with a real bot process serving the fake Slack: unsigned
requests are refused on their headers (the body is never buffered, so 40 unsigned 4 MB POSTs leave the memory
where it was), oversized ones before they are read, signed but malformed payloads never answer 500 (which
would make Slack retry them for an hour), and a message carrying a lone surrogate is answered once, also
across a restart."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, urlsplit

import psutil
import pytest
from slack_e2e import Bots, People, replies_of_bot

from adapters.slack.testing import FakeSlack

HTTP = {"slack": {"mode": "http", "port": 0}}
MB = 1024 * 1024


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(mode="http", ack_timeout=10.0) as running:
        yield running


async def read_status_and_headers(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """The status code and headers of a raw HTTP/1.1 response (the body is not read)."""
    status_line = await asyncio.wait_for(reader.readline(), 10)
    answered: dict[str, str] = {}
    while (line := await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b""):
        key, _, value = line.decode().partition(":")
        answered[key.strip().lower()] = value.strip()
    return int(status_line.split()[1]), answered


async def raw_post(
    url: str, headers: dict[str, str], body: bytes | None, *, length: int | None = None
) -> tuple[int, dict[str, str]]:
    """POST over a bare socket. `body=None` sends the headers only (announcing `length` bytes) and waits for
    the answer: a server that reads the body first never answers."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        size = length if body is None else len(body)
        head = [f"POST {parts.path} HTTP/1.1", f"Host: {parts.netloc}", f"Content-Length: {size}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        if body is not None:
            with contextlib.suppress(ConnectionError):
                for start in range(0, len(body), 256 * 1024):  # like a client streaming its upload
                    writer.write(body[start : start + 256 * 1024])
                    await writer.drain()
        return await read_status_and_headers(reader)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def test_unsigned_and_oversized_requests_are_refused_before_their_body_is_read(
    fake: FakeSlack, people: People, bots: Bots
) -> None:
    general = fake.add_channel("general")
    bot = await bots.start(HTTP)
    url = bot.url
    json_type = {"Content-Type": "application/json"}
    # Headers only, 4 MB announced: the answer comes without a byte of the body.
    status, _ = await raw_post(url, json_type, None, length=4 * MB)
    assert status == 401
    stale = {
        **json_type,
        "X-Slack-Request-Timestamp": str(int(time.time()) - 900),
        "X-Slack-Signature": "v0=" + "0" * 64,
    }
    assert (await raw_post(url, stale, None, length=4 * MB))[0] == 401
    fresh = {
        **json_type,
        "X-Slack-Request-Timestamp": str(int(time.time())),
        "X-Slack-Signature": "v0=" + "0" * 64,
    }
    status, headers = await raw_post(url, fresh, None, length=4 * MB)
    assert status == 413 and headers.get("x-slack-no-retry") == "1"

    process = psutil.Process(bot.pid)
    before = process.memory_info().rss
    junk = b"x" * (4 * MB)
    results = await asyncio.gather(*(raw_post(url, json_type, junk) for _ in range(40)))
    assert {status for status, _ in results} == {401}
    grown = process.memory_info().rss - before
    assert grown < 50 * MB, f"RSS grew by {grown / MB:.0f} MB for 40 unsigned 4 MB POSTs"

    fake.request_url = url
    post = await fake.user_posts(general, people.alice, f"<@{fake.bot_user_id}> still up?")
    await post.wait_acked()
    await fake.wait_for_message(general, contains="still up?", timeout=10)
    await bot.stop()
    assert bot.log().count("missing, stale or invalid signature") == 42
    assert "over 524288 bytes" in bot.log()


def signed_form(fake: FakeSlack, payload: Any) -> bytes:
    return ("payload=" + quote(json.dumps(payload))).encode()


async def test_signed_but_malformed_payloads_are_never_answered_500(
    fake: FakeSlack, people: People, bots: Bots
) -> None:
    general = fake.add_channel("general")
    bot = await bots.start(HTTP)
    fake.request_url = bot.url
    mention = f"<@{fake.bot_user_id}>"
    form = "application/x-www-form-urlencoded"
    cases: list[tuple[str, bytes | dict[str, Any], str]] = [
        ("a JSON array", b'[{"type": "event_callback"}]', "application/json"),
        ("a form payload that is a list", signed_form(fake, [{"type": "block_actions"}]), form),
        (
            "a non-object action",
            signed_form(
                fake, {"type": "block_actions", "user": {"id": people.alice.id}, "actions": ["approve"]}
            ),
            form,
        ),
        ("an action list of numbers", signed_form(fake, {"type": "block_actions", "actions": [1, 2]}), form),
        ("deep nesting", b"[" * 200_000 + b"]" * 200_000, "application/json"),
        ("nesting past the payload limit", ('{"a":' * 100 + "1" + "}" * 100).encode(), "application/json"),
        (
            "authorizations that are a number",
            {"type": "event_callback", "authorizations": 5, "event": {"type": "message"}},
            "application/json",
        ),
        (
            "a team that is an object",
            {"type": "event_callback", "team_id": {"x": 1}, "event": {"type": "x"}},
            "application/json",
        ),
        (
            "a user that is a list",
            {
                "type": "event_callback",
                "event": {"type": "message", "user": [1], "channel": general.id, "ts": "1.2"},
            },
            "application/json",
        ),
        ("an empty body", b"", "application/json"),
        ("a JSON string", b'"hello"', "application/json"),
    ]
    for name, body, content_type in cases:
        result = await fake.post_to_app(body, content_type=content_type)
        assert result.status in (200, 400), (name, result)
        if result.status == 400:
            assert result.headers.get("x-slack-no-retry") == "1", (name, result)

    post = await fake.user_posts(general, people.alice, f"{mention} after the garbage")
    await post.wait_acked()
    await fake.wait_for_message(general, contains="after the garbage", timeout=10)
    await bot.stop()
    assert [e["text"] for e in bot.intakes() if e["outcome"] != "duplicate"] == [
        f"{mention} after the garbage"
    ]
    assert "Traceback" not in bot.log()


async def test_a_message_with_a_lone_surrogate_is_answered_once_and_a_restart_is_clean(
    fake: FakeSlack, people: People, bots: Bots
) -> None:
    general = fake.add_channel("general")
    bot = await bots.start(HTTP)
    fake.request_url = bot.url
    mention = f"<@{fake.bot_user_id}>"
    post = await fake.user_posts(general, people.alice, f"{mention} broken \ud83d emoji")
    assert post.message_delivery is not None
    await post.wait_acked()
    retry = await fake.deliver(post.message_delivery, retry_num=1, retry_reason="http_timeout")
    assert await retry.wait_settled(10) == "acked"
    answer = await fake.wait_for_message(general, contains="broken", timeout=10)
    assert "\ufffd" in answer.text and "\ud83d" not in answer.text
    await bot.stop()

    again = await bots.start(HTTP)  # catch-up reads the same message back from history: still one input
    fake.request_url = again.url
    later = await fake.user_posts(general, people.alice, f"{mention} and now?")
    await later.wait_acked()
    await fake.wait_for_message(general, contains="and now?", timeout=10)
    await again.stop()
    taken = [e["text"] for b in (bot, again) for e in b.intakes() if e["outcome"] not in ("duplicate",)]
    assert taken == [f"{mention} broken \ufffd emoji", f"{mention} and now?"]
    assert len(replies_of_bot(fake, general)) == 2
    assert "Traceback" not in bot.log() + again.log()


async def chunked_post(url: str, headers: dict[str, str], size: int) -> tuple[int, dict[str, str]]:
    """POST `size` bytes with `Transfer-Encoding: chunked` (no Content-Length), as fast as the server takes them."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        head = [f"POST {parts.path} HTTP/1.1", f"Host: {parts.netloc}", "Transfer-Encoding: chunked"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        chunk = b"x" * (64 * 1024)
        with contextlib.suppress(ConnectionError):
            for _ in range(size // len(chunk)):
                writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        return await read_status_and_headers(reader)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def test_a_chunked_body_without_content_length_is_capped_too(
    fake: FakeSlack, people: People, bots: Bots
) -> None:
    """No Content-Length to refuse on: the endpoint stops reading at its limit (413), holding no more than that."""
    general = fake.add_channel("general")
    bot = await bots.start(HTTP)
    fresh = {
        "Content-Type": "application/json",
        "X-Slack-Request-Timestamp": str(int(time.time())),
        "X-Slack-Signature": "v0=" + "0" * 64,
    }
    process = psutil.Process(bot.pid)
    before = process.memory_info().rss
    results = await asyncio.gather(*(chunked_post(bot.url, fresh, 4 * MB) for _ in range(20)))
    assert all(status == 413 and headers.get("x-slack-no-retry") == "1" for status, headers in results), (
        results
    )
    grown = process.memory_info().rss - before
    assert grown < 50 * MB, f"RSS grew by {grown / MB:.0f} MB for 20 chunked 4 MB POSTs"

    fake.request_url = bot.url
    post = await fake.user_posts(general, people.alice, f"<@{fake.bot_user_id}> still up?")
    await post.wait_acked()
    await fake.wait_for_message(general, contains="still up?", timeout=10)
    await bot.stop()
    assert bot.log().count("over 524288 bytes (declared None)") == 20
