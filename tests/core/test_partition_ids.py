"""A harness over one partition of a shared store mints only that partition's ids (`StorageMeta.id_stride`,
`id_offset`), so every id says its partition; the root conversation (id 1) lives in partition `1 % n` only.
The storage here is the memory backend told it is partition `offset` of `stride` (the PostgreSQL partitions
themselves are tested in tests/storage/test_postgres_partitions.py)."""

from __future__ import annotations

import pytest

from harness_core import EntryDraft, InvalidOperation, Tx, partition_of_id
from harness_core.storage import MemoryStorage, StorageMeta

from .helpers import FAUX, open_harness


class PartitionOfMemory(MemoryStorage):
    """Memory storage that reports the id layout of partition `offset` of `stride`."""

    def __init__(self, stride: int, offset: int) -> None:
        super().__init__()
        self.stride, self.offset = stride, offset

    async def meta(self) -> StorageMeta:
        meta = await super().meta()
        return StorageMeta(meta.next_id, meta.last_seq, id_stride=self.stride, id_offset=self.offset)


@pytest.mark.parametrize("offset", [0, 1, 3])
async def test_every_minted_id_is_in_the_partition(offset: int) -> None:
    harness, _ = await open_harness(storage=PartitionOfMemory(4, offset))
    try:
        conversations = [await harness.create_conversation(agent=FAUX) for _ in range(3)]

        async def notes(tx: Tx) -> None:
            for c in conversations:
                tx.append_entry(c.id, EntryDraft(kind="t.note", data={}))

        await harness.commit(notes)
        ids = [c.id for c in conversations]
        for c in conversations:
            ids += [e.id for e in (await c.entries(limit=50)).items]
        assert len(ids) >= 6
        assert {partition_of_id(i, 4) for i in ids} == {offset}
        assert len(set(ids)) == len(ids) and min(ids) >= 2
    finally:
        await harness.close()


async def test_the_root_conversation_lives_in_partition_one_only() -> None:
    owner, _ = await open_harness(storage=PartitionOfMemory(4, 1))
    try:
        assert (await owner.root(agent=FAUX)).id == 1
        later = await owner.create_conversation()
        assert later.id % 4 == 1 and later.id != 1
    finally:
        await owner.close()
    other, _ = await open_harness(storage=PartitionOfMemory(4, 2))
    try:
        with pytest.raises(InvalidOperation, match=r"partition 1 of 4; this harness owns partition 2"):
            await other.root()
    finally:
        await other.close()
