"""A bounded cache of each conversation's active range (the newest head marker and the visible entries from
its `head` on), so preparing a request costs O(new entries) instead of re-reading and re-parsing the whole
active context every time.

Entries are immutable and only ever appended, so a cached range stays right as long as new entries of the
conversation are appended to it; a new head marker (reset, compaction) changes the range, so it drops the
range. The cache is filled from storage; commits published while it is being read are buffered and merged by
id, so none is missed or doubled. Cached entries are shared: callers must not mutate them.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from harness_core._session import Publication
from harness_core.records import Entry

Loader = Callable[[], Awaitable[tuple[Entry | None, list[Entry]]]]


@dataclass
class _Range:
    head: Entry | None
    entries: list[Entry]
    ids: list[int] = field(default_factory=list)
    ready: bool = False
    pending: list[Entry] = field(default_factory=list)  # published while the range was being read
    stale: bool = False
    derived: tuple[tuple[int, int], Any] | None = None  # ((entry count, newest id), derived view)

    def add(self, entry: Entry) -> None:
        # `derived` is kept: its key (entry count, newest id) names one prefix state (entries are only ever
        # added, and ids are unique and sorted), so `ContextCache.derived` can extend it or tell it is stale.
        if self.ids and entry.id <= self.ids[-1]:
            if entry.id in self.ids:
                return
            index = bisect.bisect_left(self.ids, entry.id)
            self.ids.insert(index, entry.id)
            self.entries.insert(index, entry)
            return
        self.ids.append(entry.id)
        self.entries.append(entry)


class ContextCache:
    def __init__(self, capacity: int = 512) -> None:
        self._capacity = capacity
        self._ranges: OrderedDict[int, _Range] = OrderedDict()

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
                cached.add(entry)
            else:
                cached.pending.append(entry)

    async def get(
        self, conversation_id: int, cutoff: int | None, load: Loader
    ) -> tuple[Entry | None, list[Entry]]:
        cached = self._ranges.get(conversation_id)
        if cached is not None and cached.ready and not cached.stale:
            self._ranges.move_to_end(conversation_id)
            if cutoff is None:
                return cached.head, list(cached.entries)
            return cached.head, cached.entries[: bisect.bisect_right(cached.ids, cutoff)]
        fresh = _Range(head=None, entries=[])
        self._ranges[conversation_id] = fresh  # buffer what is published while we read
        self._ranges.move_to_end(conversation_id)
        try:
            head, entries = await load()
        except BaseException:
            if self._ranges.get(conversation_id) is fresh:
                del self._ranges[conversation_id]
            raise
        if self._ranges.get(conversation_id) is fresh and not fresh.stale:
            fresh.head = head
            fresh.entries = list(entries)
            fresh.ids = [e.id for e in entries]
            for entry in fresh.pending:
                fresh.add(entry)
            fresh.pending = []
            fresh.ready = True
            while len(self._ranges) > self._capacity:
                self._ranges.popitem(last=False)
        elif self._ranges.get(conversation_id) is fresh:
            del self._ranges[conversation_id]
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
        derive from the newer entries only (it returns None when it cannot). Views are shared: callers must
        not mutate them."""
        cached = self._ranges.get(conversation_id)
        if cached is None or not cached.ready or cached.stale:
            return derive()
        key = (len(entries), entries[-1].id if entries else 0)
        view: Any = None
        if cached.derived is not None:
            (count, newest), previous = cached.derived
            if (count, newest) == key:
                return previous
            # A prefix of these entries iff its newest entry is at the same place (ids are unique, sorted and
            # never removed, so an older entry inserted since would shift it).
            if extend is not None and 0 < count < len(entries) and entries[count - 1].id == newest:
                view = extend(previous, entries[count:])
        if view is None:
            view = derive()
        cached.derived = (key, view)
        return view

    def forget(self, conversation_id: int) -> None:
        self._ranges.pop(conversation_id, None)
