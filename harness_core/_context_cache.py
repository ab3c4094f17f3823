"""A bounded cache of each conversation's active range (the newest head marker and the visible entries from
its `head` on), so preparing a request costs O(new entries) instead of re-reading and re-parsing the whole
active context every time.

Entries are immutable and only ever appended, so a cached range stays right as long as new entries of the
conversation are appended to it; a new head marker (reset, compaction) changes the range, so it drops the
range. The cache is filled from storage; commits published while it is being read are buffered and merged by
id, so none is missed or doubled. Cached entries are shared: callers must not mutate them.

Bounds: at most `capacity` conversations (default 512) and `max_bytes` of entries (default `MAX_BYTES`, 8 MiB,
counted as each entry's serialized JSON size; in memory an entry with its parsed models and its share of the
derived prompt view takes 10-11 times that, measured by walking the cached objects after `benchmarks/memory_growth.py`,
so the full default holds 80-90 MB). The least recently used ranges leave first; a range bigger than the whole
budget is used once and not kept. Nothing is lost by leaving: the next `get` reads the range from storage again.

A range is in use while a view `derived` handed out for it is alive (`load_context` callers: a generation step
holds its context only while it uses it, e.g. during the model call, and lets it go before it waits for a commit).
Dropping a range in use frees nothing until its users let go, and its next `get` would read it again: so eviction
skips ranges in use (the least recently used idle ranges leave first), and a range dropped while in use (a new
head marker, a re-read) keeps counting against `max_bytes` until its last view is gone. What the cache keeps
alive is then at most the larger of `max_bytes` and what the steps in flight hold, instead of their sum: under a
load that visits more conversations than fit, the sum grows with the contexts, and each new high-water mark is
memory the allocator keeps (issue 12's `memory_growth` steps). When views of ranges in use are let go with the
cache over its bounds, it shrinks on the event loop's next turn.

Misses are admitted within a budget. Under a load that visits more conversations than fit, most steps miss, and
the steps woken by one commit run as a cohort: each reads its whole context and holds it while the model answers,
so dozens of whole contexts can be alive at once beyond what the cache keeps, a peak the allocator keeps too. So
ranges read on a miss and still in use (being read, or with a view alive) may hold at most `miss_bytes` (default
`MISS_BYTES`, 1 MiB of entries, counted as above; a range not counted before is reckoned at `MISS_GUESS`, 16 KiB);
a miss beyond that waits, first come first served, until one is let go. One is always admitted, so a range bigger
than the budget is read. The wait is bounded (`admit_wait`, default 2 s): a step that holds one context and asks
for another could otherwise wait for itself; past it the miss goes over the budget (counted in
`admit_timeouts`). Hits never wait.

Counting a range read back costs a serialization per entry (as much CPU as parsing it again), so the cache keeps
the count of the last `SIZE_MEMO` (4,096) ranges it let go: (head id, entry count, newest id, bytes), ~200 bytes
each. A range read back with the same head and that prefix only counts its newer entries.
"""

from __future__ import annotations

import asyncio
import bisect
import weakref
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from harness_core._session import Publication
from harness_core.context import ContextView
from harness_core.records import Entry

Loader = Callable[[], Awaitable[tuple[Entry | None, list[Entry]]]]
MAX_BYTES = 8 * 2**20
SIZE_MEMO = 4096
MISS_BYTES = 2**20
MISS_GUESS = 16 * 2**10
ADMIT_WAIT = 2.0


def entry_bytes(entry: Entry) -> int:
    """What an entry counts against the byte budget: its JSON size as stored."""
    return len(entry.model_dump_json(exclude_none=True))


@dataclass
class _Range:
    head: Entry | None
    entries: list[Entry]
    ids: list[int] = field(default_factory=list)
    ready: bool = False
    pending: list[Entry] = field(default_factory=list)  # published while the range was being read
    stale: bool = False
    derived: tuple[tuple[int, int], Any] | None = None  # ((entry count, newest id), derived view)
    size: int = 0  # bytes of the entries (see `entry_bytes`)
    # Views handed out and still alive, by the id of their weak reference (a view is not hashable).
    lent: dict[int, weakref.ref[ContextView]] = field(default_factory=dict)
    dropped: bool = False  # left the cache; counted in `ContextCache._held` while lent
    admitted: int = 0  # bytes of the miss budget this range holds (read on a miss and still in use), else 0
    admitted_any: bool = False  # holds a share of the miss budget (its bytes may be 0)

    @property
    def idle(self) -> bool:
        """Ready and with no view of it alive: dropping it frees its memory now."""
        return self.ready and not self.lent

    def add(self, entry: Entry) -> int:
        """Add a published entry; the bytes it adds (0 when it was already there)."""
        # `derived` is kept: its key (entry count, newest id) names one prefix state (entries are only ever
        # added, and ids are unique and sorted), so `ContextCache.derived` can extend it or tell it is stale.
        if self.ids and entry.id <= self.ids[-1]:
            index = bisect.bisect_left(self.ids, entry.id)
            if index < len(self.ids) and self.ids[index] == entry.id:
                return 0
            self.ids.insert(index, entry.id)
            self.entries.insert(index, entry)
        else:
            self.ids.append(entry.id)
            self.entries.append(entry)
        added = entry_bytes(entry)
        self.size += added
        return added


class ContextCache:
    def __init__(
        self,
        capacity: int = 512,
        max_bytes: int = MAX_BYTES,
        miss_bytes: int = MISS_BYTES,
        admit_wait: float = ADMIT_WAIT,
    ) -> None:
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._miss_bytes = miss_bytes
        self._admit_wait = admit_wait
        self.gets = 0  # for benchmarks and tests: ranges asked for,
        self.reads = 0  # and of those read from storage (misses),
        self.admit_waits = 0  # misses that waited for the miss budget,
        self.admit_timeouts = 0  # and of those went over it after `admit_wait`
        self.missing_peak = 0  # the most ranges holding the miss budget at once (a benchmark may reset it)
        self._missing = 0  # bytes of the miss budget held (see the module docstring)
        self._missing_ranges = 0  # and by how many ranges
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._wake_scheduled = False
        self._ranges: OrderedDict[int, _Range] = OrderedDict()
        self._bytes = 0  # sum of the sizes of the ranges held
        self._held = 0  # sum of the sizes of ranges dropped while in use (still alive through their views)
        self._held_ranges = 0  # and how many
        self._shrink_scheduled = False
        # conversation -> (head id, entry count, newest id, bytes) of a range let go (see the module docstring)
        self._sizes: OrderedDict[int, tuple[int | None, int, int, int]] = OrderedDict()

    @property
    def size(self) -> tuple[int, int]:
        """(conversations, bytes) held: the cached ranges, plus the bytes of ranges dropped while in use."""
        return len(self._ranges), self._bytes + self._held

    @property
    def in_use(self) -> int:
        """Ranges with a view alive (cached or dropped)."""
        return sum(1 for cached in self._ranges.values() if cached.lent) + self._held_ranges

    def _drop(self, conversation_id: int) -> None:
        dropped = self._ranges.pop(conversation_id, None)
        if dropped is not None:
            self._bytes -= dropped.size
            dropped.dropped = True
            if dropped.lent:
                self._held += dropped.size
                self._held_ranges += 1
            if dropped.ready and not dropped.stale and dropped.entries:
                head_id = dropped.head.id if dropped.head is not None else None
                self._sizes[conversation_id] = (head_id, len(dropped.entries), dropped.ids[-1], dropped.size)
                self._sizes.move_to_end(conversation_id)
                if len(self._sizes) > SIZE_MEMO:
                    self._sizes.popitem(last=False)

    def _count(self, conversation_id: int, head: Entry | None, entries: list[Entry]) -> int:
        """The bytes of a range just read: from the memo plus its newer entries when it still holds, else all."""
        known = self._sizes.pop(conversation_id, None)
        if known is not None:
            head_id, count, newest, size = known
            # The same prefix iff the same head and the count-th entry is the same one (entries are only added and
            # ids are unique and sorted, see `derived`).
            same_head = head_id == (head.id if head is not None else None)
            if same_head and 0 < count <= len(entries) and entries[count - 1].id == newest:
                return size + sum(entry_bytes(e) for e in entries[count:])
        return sum(entry_bytes(e) for e in entries)

    def _over(self) -> bool:
        return len(self._ranges) > self._capacity or self._bytes + self._held > self._max_bytes

    def _shrink(self) -> None:
        """Drop idle ranges, least recently used first, until within bounds (ranges in use stay, see above)."""
        if not self._over():
            return
        for conversation_id, cached in list(self._ranges.items()):
            if cached.idle:
                self._drop(conversation_id)
                if not self._over():
                    return

    def _shrink_soon(self) -> None:
        self._shrink_scheduled = False
        self._shrink()

    def _release(self, cached: _Range, ref: weakref.ref[ContextView]) -> None:
        """A view of `cached` is gone. Runs whenever the last reference goes (even inside other code, e.g. a
        collection), so it only counts; the cache shrinks on the next turn of the loop."""
        cached.lent.pop(id(ref), None)
        if cached.lent:
            return
        self._unadmit(cached)
        if cached.dropped:
            self._held -= cached.size
            self._held_ranges -= 1
        if not self._shrink_scheduled and self._over():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop (closing): the next get or publication shrinks
            self._shrink_scheduled = True
            loop.call_soon(self._shrink_soon)

    @property
    def missing(self) -> tuple[int, int]:
        """(ranges, bytes) of the miss budget held: ranges read on a miss, being read or in use."""
        return self._missing_ranges, self._missing

    def _fits(self, need: int) -> bool:
        return self._missing_ranges == 0 or self._missing + need <= self._miss_bytes

    def _take(self, need: int) -> None:
        self._missing += need
        self._missing_ranges += 1
        self.missing_peak = max(self.missing_peak, self._missing_ranges)

    def _give_back(self, share: int) -> None:
        self._missing -= share
        self._missing_ranges -= 1
        self._wake_soon()

    def _wake_soon(self) -> None:
        if self._waiters and not self._wake_scheduled:
            # May run inside a weak reference's callback (any code, e.g. a collection): wake on the loop's turn.
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._wake_scheduled = True
            loop.call_soon(self._wake)

    def _wake(self) -> None:
        """Hand shares of the miss budget to waiters, in order, while the first one fits."""
        self._wake_scheduled = False
        while self._waiters:
            need, waiter = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if not self._fits(need):
                return
            self._waiters.popleft()
            self._take(need)
            waiter.set_result(None)

    async def _admit(self, need: int) -> None:
        """Take `need` bytes of the miss budget, waiting (at most `admit_wait`) while it is spent."""
        if not self._waiters and self._fits(need):
            self._take(need)
            return
        self.admit_waits += 1
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        item = (need, waiter)
        self._waiters.append(item)
        try:
            async with asyncio.timeout(self._admit_wait):
                await waiter
        except TimeoutError:
            handed = waiter.done() and not waiter.cancelled() and waiter.exception() is None
            if not handed:  # go over the budget rather than stall (see the module docstring)
                self.admit_timeouts += 1
                self._take(need)
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._give_back(need)  # handed a share just as we were cancelled: pass it on
            raise
        finally:
            if item in self._waiters:
                self._waiters.remove(item)

    def _unadmit(self, cached: _Range) -> None:
        """`cached` no longer needs its share of the miss budget (let go, or read in vain)."""
        if cached.admitted_any:
            cached.admitted_any = False
            self._give_back(cached.admitted)
            cached.admitted = 0

    def _settle(self, cached: _Range) -> None:
        """A loop turn after a miss was read: its caller took a view by now, or none (a range bigger than the
        budget, an earlier cutoff); without one, its share goes back."""
        if not cached.lent:
            self._unadmit(cached)

    def on_publication(self, publication: Publication) -> None:
        if not self._ranges:
            return
        for entry in publication.entries:
            cached = self._ranges.get(entry.conversation_id)
            if cached is None:
                continue
            if entry.head is not None:
                cached.stale = True  # a new marker moves the range start: read it again next time
            elif cached.ready:
                self._bytes += cached.add(entry)
            else:
                cached.pending.append(entry)
        self._shrink()

    async def get(
        self, conversation_id: int, cutoff: int | None, load: Loader
    ) -> tuple[Entry | None, list[Entry]]:
        self.gets += 1
        need: int | None = None  # the share of the miss budget taken, once admitted
        while True:
            cached = self._ranges.get(conversation_id)
            if cached is not None and cached.ready and not cached.stale:
                if need is not None:  # read by another step while this one waited
                    self._give_back(need)
                self._ranges.move_to_end(conversation_id)
                if cutoff is None:
                    return cached.head, list(cached.entries)
                return cached.head, cached.entries[: bisect.bisect_right(cached.ids, cutoff)]
            if need is not None:
                break
            known = self._sizes.get(conversation_id)
            if cached is not None and cached.ready:
                need = cached.size
            else:
                need = known[3] if known is not None else MISS_GUESS
            await self._admit(need)
        self._drop(conversation_id)
        fresh = _Range(head=None, entries=[], admitted=need, admitted_any=True)
        self._ranges[conversation_id] = fresh  # buffer what is published while we read
        self._ranges.move_to_end(conversation_id)
        self.reads += 1
        try:
            head, entries = await load()
        except BaseException:
            if self._ranges.get(conversation_id) is fresh:
                del self._ranges[conversation_id]
            self._unadmit(fresh)
            raise
        if self._ranges.get(conversation_id) is fresh and not fresh.stale:
            fresh.head = head
            fresh.entries = list(entries)
            fresh.ids = [e.id for e in entries]
            fresh.size = self._count(conversation_id, head, fresh.entries)
            for entry in fresh.pending:
                fresh.add(entry)
            fresh.pending = []
            fresh.ready = True
            self._bytes += fresh.size
            self._missing += fresh.size - fresh.admitted  # its share is now what it really holds
            if fresh.size < fresh.admitted:
                self._wake_soon()  # reckoned bigger than it is: room for a waiter
            fresh.admitted = fresh.size
            # The caller takes its view right after this returns (no await between); see `_settle`.
            asyncio.get_running_loop().call_soon(self._settle, fresh)
            self._shrink()
        else:
            if self._ranges.get(conversation_id) is fresh:
                del self._ranges[conversation_id]
            self._unadmit(fresh)  # not kept, so not watched: its caller's use is not counted
        if cutoff is None:
            return head, entries
        return head, [e for e in entries if e.id <= cutoff]

    def entry(self, conversation_id: int, entry_id: int) -> Entry | None:
        """The entry if the conversation's cached range holds it (e.g. the assistant entry a tool call comes
        from), else None: read storage. Entries are immutable, so a cached one is the stored one."""
        cached = self._ranges.get(conversation_id)
        if cached is None or not cached.ready:
            return None
        index = bisect.bisect_left(cached.ids, entry_id)
        if index < len(cached.ids) and cached.ids[index] == entry_id:
            return cached.entries[index]
        return None

    def derived(
        self,
        conversation_id: int,
        entries: list[Entry],
        derive: Callable[[], Any],
        extend: Callable[[Any, list[Entry]], Any] | None = None,
    ) -> Any:
        """The view derived from `entries` (a prefix of the cached range), computed once per range state.
        When the last view is of a shorter prefix of the same entries, `extend(view, newer entries)` may
        derive from the newer entries only (it returns None when it cannot). A `ContextView` comes back as an
        object of the caller's own whose lists are shared with the cache (callers must not mutate them); while
        it is alive the range is in use (see the module docstring), so hold it only while using it."""
        cached = self._ranges.get(conversation_id)
        if cached is None or not cached.ready or cached.stale:
            return derive()
        key = (len(entries), entries[-1].id if entries else 0)
        view: Any = None
        if cached.derived is not None:
            (count, newest), previous = cached.derived
            if (count, newest) == key:
                return self._lend(cached, previous)
            # A prefix of these entries iff its newest entry is at the same place (ids are unique, sorted and
            # never removed, so an older entry inserted since would shift it).
            if extend is not None and 0 < count < len(entries) and entries[count - 1].id == newest:
                view = extend(previous, entries[count:])
        if view is None:
            view = derive()
        cached.derived = (key, view)
        return self._lend(cached, view)

    def _lend(self, cached: _Range, view: Any) -> Any:
        """A view of its own for the caller (sharing the cached lists), watched so the range counts as in use
        while it lives."""
        if not isinstance(view, ContextView):
            return view
        handle = replace(view)
        ref = weakref.ref(handle, lambda gone: self._release(cached, gone))
        cached.lent[id(ref)] = ref
        return handle

    def forget(self, conversation_id: int) -> None:
        self._drop(conversation_id)
