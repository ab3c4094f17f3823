"""Big stores, built fast but real: a sample conversation runs the scripted turn (and one compaction) through
the real harness; its records are then cloned with fresh ids into many conversations and written through
`SqliteStorage.commit` in large batches. The result is an ordinary store the harness opens normally.

Cloned per conversation: the conversation record, its five built-in documents (final values of the sample,
a fresh provider session id), and per turn the entries (user, assistant tool call, tool result, answer; the
first turn and each turn after a compaction also carry the system entry), the done submission and the three
terminal tasks (generation, tool, generation). Compactions are `core.compaction` entries with a head marker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import _script
from harness_core import (
    CORE_COMPACTION,
    CORE_USER,
    CompactionSettings,
    Conversation,
    Entry,
    Extension,
    Harness,
    HarnessSettings,
    Models,
    Submission,
    Task,
    hook,
)
from harness_core.storage import MemoryStorage, SqliteStorage
from harness_core.storage._protocol import CommitBatch, DocCreate

SUMMARY = "Summary: the user keeps asking for k; the lookup tool says k = 42 every time."
# Integer fields inside task inputs and results that name other records of the same turn.
_ID_KEYS = frozenset({"assistant", "entry_id", "submission_id"})


@dataclass
class Turn:
    """One turn of the sample: its records, and the id range they were minted in."""

    low: int
    high: int
    entries: list[Entry]
    tasks: list[Task]
    submission: Submission


@dataclass
class Sample:
    first: Turn  # carries the system entry
    steady: Turn
    compaction: Entry
    docs: list[DocCreate]


async def capture_sample() -> Sample:
    """Run the scripted turn three times and one manual compaction on the real harness (in memory)."""
    extension = Extension(
        "bench-summary", hooks=[hook("core.compaction", before_compact=lambda *_: {"summary": SUMMARY})]
    )
    registry = _script.registry()
    registry.install(extension)
    settings = HarnessSettings(compaction=CompactionSettings(keep_recent_tokens=10))
    storage = await MemoryStorage.open()
    harness = await Harness.open(
        storage, models=Models(_script.scripted_faux()), registry=registry, settings=settings
    )
    conversation = await harness.create_conversation(agent=_script.AGENT)
    await _script.run_turns([conversation], 3)
    await conversation.compact()
    await harness.wait_for_idle(conversation.id)
    entries = (await storage.scan_entries(conversation.id, order="asc", limit=10_000)).items
    tasks = (await storage.scan_tasks(conversation_id=conversation.id, limit=10_000)).items
    submissions = [
        s
        for s in (await storage.scan_submissions(conversation_id=conversation.id, limit=10_000)).items
        if s.type == "input"
    ]
    docs = []
    for record in await storage.scan_documents(scope="conversation", scope_id=conversation.id):
        stored = await storage.document(record.id)
        assert stored is not None
        docs.append(DocCreate(record=record, version=stored.version, value=stored.value))
    await harness.close()

    def turn(submission: Submission) -> Turn:
        low, high = submission.id, submission.answer or submission.id
        return Turn(
            low,
            high,
            [e for e in entries if low <= e.id <= high],
            [t for t in tasks if low <= t.id <= high],
            submission,
        )

    compaction = next(e for e in entries if e.kind == CORE_COMPACTION)
    return Sample(first=turn(submissions[0]), steady=turn(submissions[1]), compaction=compaction, docs=docs)


@dataclass
class Plan:
    """How one conversation's history is laid out."""

    turns: int
    compact_every: int = 0  # turns between compactions (0: never)
    keep_turns: int = 5  # turns a compaction keeps before its marker
    tail_turns: int = 0  # turns after the last compaction (0: compact_every)

    def compaction_after(self) -> set[int]:
        """Turn indexes after which a compaction marker is appended."""
        if not self.compact_every:
            return set()
        tail = self.tail_turns or self.compact_every
        marks = set(range(self.compact_every - 1, self.turns - tail, self.compact_every))
        marks.add(self.turns - tail - 1)
        return {m for m in marks if m >= self.keep_turns}


@dataclass
class Builder:
    sample: Sample
    next_id: int
    seq: int
    batch: CommitBatch = field(init=False)
    counts: dict[str, int] = field(default_factory=lambda: {"conversations": 0, "entries": 0, "tasks": 0})

    def __post_init__(self) -> None:
        self.batch = CommitBatch(seq=self.seq, next_id=self.next_id)

    def mint(self, span: int = 1) -> int:
        first = self.next_id
        self.next_id += span
        return first

    def conversation(self, plan: Plan) -> int:
        batch = self.batch
        conversation_id = self.mint()
        batch.conversations.append(Conversation(id=conversation_id, seq=batch.seq))
        for doc in self.sample.docs:
            record = doc.record.model_copy(
                update={"id": self.mint(), "scope_id": conversation_id, "created_seq": batch.seq}
            )
            value = {"session_id": str(uuid.uuid4())} if record.kind == "core.provider" else doc.value
            batch.doc_creates.append(DocCreate(record=record, version=doc.version, value=value))
        compact_after = plan.compaction_after()
        user_ids: list[int] = []
        system_next = True
        for n in range(plan.turns):
            template = self.sample.first if system_next else self.sample.steady
            user_ids.append(self._turn(conversation_id, template, n))
            system_next = False
            if n in compact_after:
                head = user_ids[n - plan.keep_turns + 1]
                marker = self.sample.compaction.model_copy(
                    update={
                        "id": self.mint(),
                        "conversation_id": conversation_id,
                        "head": head,
                        "seq": batch.seq,
                        "by_task_id": None,
                    }
                )
                batch.entries.append(marker)
                self.counts["entries"] += 1
                system_next = True  # the next prepare re-adds the system prompt after the marker
        self.counts["conversations"] += 1
        return conversation_id

    def _turn(self, conversation_id: int, template: Turn, n: int) -> int:
        """Clone one sample turn; returns the new id of its user entry."""
        batch = self.batch
        base = self.mint(template.high - template.low + 1)

        def new(old: int | None) -> int | None:
            return (
                None if old is None or not template.low <= old <= template.high else base + old - template.low
            )

        common = {"conversation_id": conversation_id, "seq": batch.seq}
        user_id = 0
        for e in template.entries:
            clone = e.model_copy(update={**common, "id": new(e.id), "by_task_id": new(e.by_task_id)})
            if e.kind == CORE_USER:
                user_id = clone.id
            batch.entries.append(clone)
        for t in template.tasks:
            state = t.state
            if state.outcome is not None:
                state = state.model_copy(
                    update={
                        "outcome": state.outcome.model_copy(
                            update={"result": _remap(state.outcome.result, new)}
                        )
                    }
                )
            update = {
                **common,
                "id": new(t.id),
                "owner_task_id": new(t.owner_task_id),
                "input": _remap(t.input, new),
                "state": state,
            }
            batch.tasks.append(t.model_copy(update=update))
        s = template.submission
        batch.submissions.append(
            s.model_copy(
                update={
                    **common,
                    "id": new(s.id),
                    "entry": new(s.entry),
                    "answer": new(s.answer),
                    "request_id": f"bulk:{conversation_id}:{n}",
                }
            )
        )
        self.counts["entries"] += len(template.entries)
        self.counts["tasks"] += len(template.tasks)
        return user_id

    def take(self) -> CommitBatch:
        batch = self.batch
        batch.next_id = self.next_id
        self.seq += 1
        self.batch = CommitBatch(seq=self.seq, next_id=self.next_id)
        return batch

    def pending_rows(self) -> int:
        return len(self.batch.entries) + len(self.batch.tasks)


def _remap(value: Any, new: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: (new(v) or v) if k in _ID_KEYS and isinstance(v, int) else _remap(v, new)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_remap(v, new) for v in value]
    return value


async def build(path: Path, plans: Iterator[Plan], *, rows_per_batch: int = 40_000) -> dict[str, Any]:
    """Write the conversations the plans describe into a new store at `path`; returns counts and timings."""
    started = time.perf_counter()
    sample = await capture_sample()
    storage = await SqliteStorage.open(path)
    meta = await storage.meta()
    builder = Builder(sample, next_id=max(meta.next_id, 2), seq=meta.last_seq + 1)
    ids: list[int] = []
    for plan in plans:
        ids.append(builder.conversation(plan))
        if builder.pending_rows() >= rows_per_batch:
            await storage.commit([builder.take()])
    if builder.pending_rows() or builder.batch.conversations:
        await storage.commit([builder.take()])
    await storage.close()
    return {
        "conversation_ids": ids,
        **builder.counts,
        "seconds": time.perf_counter() - started,
    }


BUILDER_VERSION = 1  # bump when the layout of built stores changes


async def cached_store(
    directory: Path, name: str, plans: list[Plan], *, fingerprint: str = ""
) -> tuple[Path, dict[str, Any]]:
    """The store the plans describe, built once and kept in `directory/<name>` (rebuilt when the builder, the
    schema or the records' shape changes). Returns the pristine store's path and its build info; copy it
    before writing to it."""
    import hashlib
    import json
    import re

    from harness_core.storage._sqlite_schema import SCHEMA_VERSION

    sample = await capture_sample()
    shape = sample.steady.entries[-1].model_dump_json(exclude={"id", "conversation_id", "seq", "by_task_id"})
    shape += sample.steady.tasks[-1].model_dump_json(include={"state", "kind", "version"})
    shape = re.sub(r"\d+", "0", shape)  # the records' shape, not their ids and timestamps
    key = hashlib.sha256(
        f"{BUILDER_VERSION}:{SCHEMA_VERSION}:{shape}:{fingerprint}:{plans!r}".encode()
    ).hexdigest()[:12]
    folder = directory / f"{name}-{key}"
    path = folder / "store.sqlite"
    info_path = folder / "info.json"
    if info_path.exists() and path.exists():
        return path, json.loads(info_path.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("store.sqlite*"):
        stale.unlink()
    info = await build(path, iter(plans))
    info_path.write_text(json.dumps(info))
    return path, info
