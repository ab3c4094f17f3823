"""Which partition of a shared store a place or a gate belongs to (DESIGN.md §9, the workers contract).

A place is a channel with its threads: a thread forks its channel's conversation in the same commit, so every
place of one channel must land in the channel's partition. The hashing itself is the store's rule,
`harness_core.partition_of_key`; ids carry their partition (`harness_core.partition_of_id`).
"""

from __future__ import annotations

from adapters.bridge.model import Place
from harness_core import partition_of_id, partition_of_key

__all__ = ["partition_of_gate", "partition_of_key", "partition_of_place"]


def partition_of_place(place: Place, partitions: int) -> int:
    """The partition of `place`'s channel (threads follow their channel)."""
    return partition_of_key(place.channel_place.key, partitions)


def partition_of_gate(gate_id: int, partitions: int) -> int:
    """Ids carry their partition: partition p mints only ids with `id % partitions == p`."""
    return partition_of_id(gate_id, partitions)
