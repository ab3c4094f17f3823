"""`Bounded`: a mapping that keeps at most `capacity` keys, the least recently used leaving first.

For the bridge's per-message and per-channel memory: each such map is a shortcut over what storage or the
platform already knows, so a key that left costs a repeat (an edit with the same text, a new lock), never a
wrong or a doubled action.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, MutableMapping
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Bounded(MutableMapping[K, V]):
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()

    def __getitem__(self, key: K) -> V:
        value = self._data[key]
        self._data.move_to_end(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def __delitem__(self, key: K) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)


class BoundedSet(Generic[K]):
    """A set that keeps at most `capacity` members, the least recently added or touched leaving first."""

    def __init__(self, capacity: int) -> None:
        self._members: Bounded[K, None] = Bounded(capacity)

    def add(self, member: K) -> None:
        self._members[member] = None

    def discard(self, member: K) -> None:
        self._members.pop(member, None)

    def __contains__(self, member: object) -> bool:
        return member in self._members

    def __len__(self) -> int:
        return len(self._members)
