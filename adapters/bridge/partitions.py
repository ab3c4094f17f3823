"""Which partition of a shared store a place belongs to (DESIGN.md §9, the workers contract).

A place is a channel with its threads: a thread forks its channel's conversation in the same commit, so every
place of one channel must land in the channel's partition. The hash is the store's `partition_of_key` rule
(blake2b, 8 bytes of the key's UTF-8, big-endian, modulo the partition count): stable across processes,
machines and Python versions, unlike `hash()`.
"""

from __future__ import annotations

import hashlib

from adapters.bridge.model import Place


def partition_of_key(key: str, partitions: int) -> int:
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    digest = hashlib.blake2b(key.encode("utf-8", errors="surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def partition_of_place(place: Place, partitions: int) -> int:
    """The partition of `place`'s channel (threads follow their channel)."""
    return partition_of_key(place.channel_place.key, partitions)


def partition_of_gate(gate_id: int, partitions: int) -> int:
    """Ids carry their partition: partition p mints only ids with `id % partitions == p`."""
    return gate_id % partitions
