"""The coalescing of ingress wake-ups (`Waker`), without a database: puts marked within a window share one
send, a failed send is dropped (the owners poll) and does not stop the next, `close` sends what is left."""

from __future__ import annotations

import asyncio

from harness_core.storage._postgres_wake import Waker


async def test_marks_within_a_window_are_sent_once_each_partition_once() -> None:
    sent: list[list[int]] = []

    async def send(partitions: list[int]) -> None:
        sent.append(partitions)

    waker = Waker(send, window=0.05)
    for partition in (3, 3, 1, 3, 1):
        waker.mark(partition)
    await asyncio.sleep(0.2)
    assert sent == [[1, 3]]
    waker.mark(2)
    await asyncio.sleep(0.2)
    assert sent == [[1, 3], [2]] and waker.sent == 2
    await waker.close()


async def test_a_failed_send_is_dropped_and_the_next_goes_out() -> None:
    sent: list[list[int]] = []
    failures = [RuntimeError("connection lost")]

    async def send(partitions: list[int]) -> None:
        if failures:
            raise failures.pop()
        sent.append(partitions)

    waker = Waker(send, window=0.01)
    waker.mark(4)
    await asyncio.sleep(0.1)
    waker.mark(5)
    await asyncio.sleep(0.1)
    assert sent == [[5]]
    await waker.close()


async def test_close_sends_what_is_marked_and_later_marks_are_ignored() -> None:
    sent: list[list[int]] = []

    async def send(partitions: list[int]) -> None:
        sent.append(partitions)

    waker = Waker(send, window=60)
    waker.mark(7)
    await waker.close()
    assert sent == [[7]]
    waker.mark(8)
    await asyncio.sleep(0.05)
    assert sent == [[7]]
