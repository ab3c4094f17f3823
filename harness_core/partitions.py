"""Which partition a place or a record belongs to, on a store split into partitions (§9 of the design).

A place (a channel's root conversation, its thread forks and the subagent conversations its tasks own) belongs
to the partition its key hashes to; every id minted in a partition is `partition` modulo the partition count,
so any id says its partition without a lookup. Both are stable across processes, machines and Python versions
(blake2b, not `hash()`).
"""

from __future__ import annotations

import hashlib


def _check(partitions: int) -> None:
    if type(partitions) is not int or partitions < 1:
        raise ValueError(f"partitions must be a positive int, not {partitions!r}")


def partition_of_key(key: str, partitions: int) -> int:
    """The partition of a place key: the first 8 bytes of blake2b of its UTF-8 bytes (lone surrogates kept,
    `surrogatepass`), big-endian, modulo `partitions`."""
    _check(partitions)
    if not isinstance(key, str):
        raise TypeError(f"a place key is text, not {type(key).__name__}")
    digest = hashlib.blake2b(key.encode("utf-8", errors="surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def partition_of_id(record_id: int, partitions: int) -> int:
    """The partition that minted an id (a conversation, task, gate or entry id): `id % partitions`."""
    _check(partitions)
    return record_id % partitions
