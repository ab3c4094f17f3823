"""The Slack side of `intake_latency`'s Slack scenario, in its own process: the loopback fake Slack (Web API +
HTTP Events API) and an open-loop load of user posts, so the bot's process holds only the bot.

    python -m benchmarks._slack_load MODE COUNT RATE CHANNELS MENTION_EVERY

MODE is `http` (the fake POSTs signed Events API requests) or `socket` (Socket Mode envelopes over the bot's
WebSocket). Speaks JSON lines: prints `{"env": ...}` (what points the Slack adapter at this fake); reads
`{"url": ...}` (HTTP: the adapter's Request URL; Socket Mode: null, once the bot is connected), posts one warm-up message per channel (from every user in turn), prints `{"warmed": true}`; reads
`{"go": true}`, posts COUNT messages (message n at n / RATE s on channel n mod CHANNELS, whether or not
earlier ones were acknowledged; one in MENTION_EVERY mentions the bot, spread over the channels), and prints `{"latencies": [...],
"failed": ...}`: per event delivered, seconds from the post's scheduled time to the bot's ack (HTTP 200, or
the envelope ack in Socket Mode). Then it
keeps serving the Web API (the bot's answers) until its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from adapters.slack.testing import FakeSlack

USERS = 40


async def read(reader: asyncio.StreamReader) -> dict[str, Any]:
    line = await reader.readline()
    if not line:
        raise SystemExit(0)
    value: dict[str, Any] = json.loads(line)
    return value


def mentions_bot(n: int, every: int, channels: int) -> bool:
    """Whether message n (on channel n mod `channels`) addresses the bot: one in `every`, spread so that every
    channel gets its share (a plain `n % every == 0` would put all of them on the channels divisible by
    `every`, which then hold more answers than a platform lets a bot write into one channel)."""
    return every > 0 and (n // channels) % every == (n % channels) % every


async def open_loop(
    count: int, rate: float, send: Callable[[int, float], Coroutine[Any, Any, None]]
) -> float:
    """Start `send(n, arrival)` for message n at its arrival time (`start + n / rate`, on the loop's clock)
    whether or not earlier ones finished; return `start` once every send is done."""
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05
    async with asyncio.TaskGroup() as group:
        for n in range(count):
            arrival = start + n / rate
            delay = arrival - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            group.create_task(send(n, arrival))
    return start


def say(value: dict[str, Any]) -> None:
    print(json.dumps(value), flush=True)


async def main(mode: str, count: int, rate: float, channels: int, mention_every: int) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with FakeSlack(mode="socket" if mode == "socket" else "http", ack_timeout=10.0) as fake:
        places = [fake.add_channel(f"bench-{n}") for n in range(channels)]
        users = [fake.add_user(f"U{n:03d}", name=f"user{n}") for n in range(USERS)]
        say({"env": fake.env})
        url = (await read(reader))["url"]
        if url is None:
            await fake.wait_for_connection()
        else:
            fake.request_url = str(url)
        # Each channel's conversation exists and each user's name is cached before the clock starts.
        for n, place in enumerate(places):
            await (await fake.user_posts(place, users[n % USERS], f"hello from channel {n}")).wait_acked(30)
        say({"warmed": True})
        await read(reader)

        latencies: list[float] = []
        failed: list[str] = []
        mention = f"<@{fake.bot_user_id}> "

        async def post(n: int, arrival: float) -> None:
            text = f"{mention if mentions_bot(n, mention_every, channels) else ''}message {n}: all fine"
            sent = await fake.user_posts(places[n % channels], users[n % USERS], text)
            for delivery in sent.deliveries:
                attempt = delivery.attempts[0]
                outcome = await attempt.wait_settled(30)
                if outcome == "acked" and attempt.acked_at is not None:
                    latencies.append(attempt.acked_at - arrival)
                else:
                    failed.append(f"{delivery.event_type} {n}: {outcome} {attempt.http_status}")

        # loop.time() is time.monotonic(), the clock of the fake's acked_at
        start = await open_loop(count, rate, post)
        say({"latencies": latencies, "failed": failed, "seconds": loop.time() - start})
        while await reader.readline():  # serve the bot's answers until the parent is done
            pass


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
