"""Property tests (hypothesis): arbitrary JSON-like values — with unpaired surrogates, NaN and infinities, huge
ints, -0.0, sets and tuples, non-string keys and deep nesting — through the harness's public entry points
(an input's text, a written entry's data, a document, a task's input) on every storage backend. Each value is either stored and
read back equal after reopening the store, or refused with `StrictJsonError`, and the harness stays healthy.
An independent oracle below says which of the two must happen."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness_core import (
    MAX_DEPTH,
    EntryDraft,
    Extension,
    Harness,
    Input,
    Models,
    Registry,
    StrictJsonError,
    Write,
    clean_json,
    clean_text,
    define_doc,
    define_task,
)
from harness_core.storage import JsonlStorage, MemoryStorage, SqliteStorage, Storage

pytestmark = pytest.mark.timeout(300)

SURROGATES = ["\ud83d", "\ude00", "\udbff", "\ud800", "\ud83d\ude00"]

texts = st.lists(st.one_of(st.characters(), st.sampled_from(SURROGATES)), max_size=12).map("".join)
ints = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=2**63 - 3, max_value=2**63 + 3),
    st.integers(min_value=-(2**63) - 3, max_value=-(2**63) + 3),
    st.integers(min_value=-(10**40), max_value=10**40),
)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(-0.0),
    texts,
)


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(texts, children, max_size=4),
        st.dictionaries(st.integers(0, 3), children, min_size=1, max_size=2),  # keys that are not strings
        st.lists(children, max_size=3).map(tuple),
        st.frozensets(st.integers(0, 5), max_size=3).map(set),
    )


def _deep(inner: Any, levels: int) -> Any:
    for index in range(levels):
        inner = [inner] if index % 2 else {"k": inner}
    return inner


values = st.one_of(
    st.recursive(leaves, _extend, max_leaves=12),
    st.builds(_deep, st.recursive(leaves, _extend, max_leaves=3), st.integers(MAX_DEPTH - 3, MAX_DEPTH + 3)),
)


def strict(value: Any, depth: int = 0) -> bool:
    """The oracle: DESIGN.md §2.3 written out independently of the implementation."""
    if value is None or isinstance(value, bool):
        return True
    if type(value) is int:
        return -(2**63) <= value <= 2**63 - 1
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is str:
        return all(not 0xD800 <= ord(ch) <= 0xDFFF for ch in value)
    if type(value) is list:
        return depth < MAX_DEPTH and all(strict(item, depth + 1) for item in value)
    if type(value) is dict:
        return depth < MAX_DEPTH and all(
            type(key) is str and strict(key) and strict(item, depth + 1) for key, item in value.items()
        )
    return False


def exact(value: Any) -> str:
    """A spelling that tells 1, 1.0 and True apart, keeps -0.0 and key order: equality as stored."""
    return json.dumps(value, ensure_ascii=True)


Opener = Callable[[Path], Awaitable[Storage]]
BACKENDS: dict[str, Opener] = {
    "memory": lambda _path: MemoryStorage.open(),
    "sqlite": lambda path: SqliteStorage.open(path / "store.sqlite"),
    "jsonl": lambda path: JsonlStorage.open(path / "store"),
}

NOTES = define_doc("app.notes", scope="conversation")


async def _never(_task: Any, _runtime: Any) -> None:
    await asyncio.Event().wait()  # holds its input; cancelled at close


HOLD = define_task("app.hold", phases={"never": _never})


async def _open(storage: Storage) -> Harness:
    registry = Registry()
    registry.install(Extension("app", tasks=[HOLD]))
    return await Harness.open(storage, models=Models(), registry=registry)


async def _through_every_entry_point(backend: str, root_dir: Path, value: Any) -> None:
    storage = await BACKENDS[backend](root_dir)
    harness = await _open(storage)
    root = await harness.root()
    stored: dict[str, int] = {}

    async def attempt(name: str, given: Any, action: Callable[[], Awaitable[int]]) -> None:
        expected_ok = strict(given)
        if not expected_ok:
            with pytest.raises(StrictJsonError) as refused:
                await action()
            str(refused.value).encode("utf-8")  # the error names the path in valid text
            return
        stored[name] = await action()  # a strict value is never refused

    async def write() -> int:
        submission = await root.submit(Write(EntryDraft(kind="app.note", data={"v": value})))
        return (await submission.wait()).entry or 0

    async def document() -> int:
        async def commit(tx: Any) -> int:
            draft = await tx.doc(NOTES, root.id)
            draft.value = {"v": value}
            return 0

        return int(await harness.commit(commit))

    async def task_input() -> int:
        async def commit(tx: Any) -> int:
            return int((await harness.create_task_in(tx, "app.hold", value, conversation_id=root.id)).id)

        return int(await harness.commit(commit))

    async def user_input() -> int:
        submission = await root.submit(Input(value))
        # Its run fails (no model here). Wait for that: items queued behind a failed run stay queued until the
        # next submission's boundary (only a successful run end places them), so the write below
        # would never settle if it came in while the run was still live.
        assert (await submission.wait()).status == "unanswered"
        return int(submission.record.entry or 0)

    if type(value) is str:  # an input's content is text
        await attempt("input", value, user_input)
    await attempt("write", {"v": value}, write)
    await attempt("document", {"v": value}, document)
    await attempt("task input", value, task_input)
    # Healthy whatever happened: the next write lands.
    assert not harness.session.failed
    after = await root.submit(Write(EntryDraft(kind="app.note", data="after")))
    assert (await after.wait()).status == "done"
    if backend == "memory":
        await _read_back(harness, root.id, stored, value)
        await harness.close()
        return
    await harness.close()
    harness = await _open(await BACKENDS[backend](root_dir))  # read from the files, not from this process
    try:
        await _read_back(harness, root.id, stored, value)
    finally:
        await harness.close()


async def _read_back(harness: Harness, conversation_id: int, stored: dict[str, int], value: Any) -> None:
    storage = harness.session.storage
    if "input" in stored:
        entry = await storage.entry(stored["input"])
        assert entry is not None and entry.model is not None
        assert exact(entry.model[0].content) == exact(value)
    if "write" in stored:
        entry = await storage.entry(stored["write"])
        assert entry is not None and exact(entry.data) == exact({"v": value})
    if "document" in stored:
        found = await harness.snapshot(NOTES, conversation_id)
        assert exact(found) == exact({"v": value})
    if "task input" in stored:
        task = await storage.task(stored["task input"])
        assert task is not None and exact(task.input) == exact(value)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=values)
def test_every_value_is_stored_exactly_or_refused_and_the_harness_stays_up(
    backend: str, tmp_path_factory: pytest.TempPathFactory, value: Any
) -> None:
    asyncio.run(_through_every_entry_point(backend, tmp_path_factory.mktemp(backend), value))


@settings(max_examples=200, deadline=None)
@given(value=values)
def test_clean_json_makes_text_valid_and_is_otherwise_strict(value: Any) -> None:
    try:
        cleaned = clean_json(value)
    except StrictJsonError:
        # Refused only for what cleaning cannot fix: the same value with its text cleaned is not strict.
        assert not strict(_cleaned_text_only(value))
        return
    assert strict(cleaned)
    assert exact(cleaned) == exact(_cleaned_text_only(value))


@settings(max_examples=300, deadline=None)
@given(text=texts)
def test_clean_text_is_valid_idempotent_and_keeps_valid_text(text: str) -> None:
    cleaned = clean_text(text)
    cleaned.encode("utf-8")
    assert clean_text(cleaned) == cleaned
    if strict(text):
        assert cleaned is text


def _cleaned_text_only(value: Any) -> Any:
    if type(value) is str:
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if type(value) is list:
        return [_cleaned_text_only(v) for v in value]
    if type(value) is dict:
        out: dict[Any, Any] = {}
        for key, item in value.items():
            out[_cleaned_text_only(key) if type(key) is str else key] = _cleaned_text_only(item)
        return out
    return value
