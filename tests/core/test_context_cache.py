"""The context cache must always agree with reading the active range from storage."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import harness_core._context_cache as context_cache_module
from harness_core import EntryDraft, Harness, HarnessSettings, Input, Tx
from harness_core._context_cache import ContextCache
from harness_core.context import derive_context
from harness_core.conversation import load_context, read_active_range
from harness_core.messages import UserMessage
from harness_core.models.faux import faux_assistant
from harness_core.records import Entry
from harness_core.storage import MemoryStorage

from .helpers import FAUX, open_harness


async def assert_agrees(harness: Harness, conversation_id: int, cutoff: int | None = None) -> None:
    cached = await load_context(harness, conversation_id, cutoff)
    head, entries = await read_active_range(harness, conversation_id, cutoff)
    assert [e.id for e in cached.entries] == ([head.id] if head else []) + [
        e.id for e in entries if e.head is None
    ]
    assert cached.head == head
    assert cached == derive_context(head, entries)  # an extended view equals the one derived whole


async def note(harness: Harness, conversation_id: int, text: str, **extra: object) -> int:
    async def run(tx: Tx) -> int:
        draft = EntryDraft(kind="core.user", model=[UserMessage(content=text)], **extra)  # type: ignore[arg-type]
        return tx.append_entry(conversation_id, draft).id

    return await harness.commit(run)


async def test_appends_after_the_first_load_are_seen() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root()
    await note(harness, root.id, "one")
    await assert_agrees(harness, root.id)
    for i in range(5):
        await note(harness, root.id, f"more {i}")
        await assert_agrees(harness, root.id)
    await harness.close()


async def test_a_new_head_marker_resets_the_cached_range() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root()
    first = await note(harness, root.id, "before")
    await assert_agrees(harness, root.id)
    marker = await note(harness, root.id, "handoff", head="self")
    await note(harness, root.id, "after")
    view = await load_context(harness, root.id)
    assert view.head is not None and view.head.id == marker
    assert first not in [e.id for e in view.entries]
    await assert_agrees(harness, root.id)
    await assert_agrees(harness, root.id, cutoff=first)  # an earlier point than the newest marker
    await harness.close()


async def test_commits_published_while_the_range_is_read_are_not_lost() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root()
    await note(harness, root.id, "first")
    harness.context_cache.forget(root.id)
    storage = harness.session.storage
    original = storage.scan_entries
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow_scan(*args: object, **kwargs: object) -> object:
        started.set()
        await release.wait()
        return await original(*args, **kwargs)  # type: ignore[arg-type]

    storage.scan_entries = slow_scan  # type: ignore[method-assign]
    loading = asyncio.ensure_future(load_context(harness, root.id))
    await started.wait()
    storage.scan_entries = original  # type: ignore[method-assign]
    late = await note(harness, root.id, "published during the read")
    release.set()
    await loading
    view = await load_context(harness, root.id)  # served from the cache
    assert late in [e.id for e in view.entries]
    await assert_agrees(harness, root.id)
    await harness.close()


async def test_a_conversation_running_turns_keeps_agreeing() -> None:
    harness, _ = await open_harness(responder=lambda _r: faux_assistant("ok"))
    root = await harness.root(agent=FAUX)
    for i in range(3):
        await (await root.submit(Input(f"q{i}"))).wait()
        await assert_agrees(harness, root.id)
    fork_at = (await root.entries(limit=1)).items[0].id
    fork = await root.fork(fork_at)
    await (await fork.submit(Input("in the fork"))).wait()
    await assert_agrees(harness, fork.id)
    await assert_agrees(harness, root.id)
    await harness.close()


async def test_entry_lookup_serves_only_committed_entries_of_a_cached_range() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root()
    cache = harness.context_cache
    first = await note(harness, root.id, "one")
    assert cache.entry(root.id, first) is None  # nothing cached yet: the caller reads storage
    await load_context(harness, root.id)
    assert cache.entry(root.id, first) == await harness.entry(first)
    later = await note(harness, root.id, "two")  # published into the cached range
    assert cache.entry(root.id, later) == await harness.entry(later)
    minted: list[int] = []

    async def rolled_back(tx: Tx) -> None:
        minted.append(
            tx.append_entry(root.id, EntryDraft(kind="core.user", model=[UserMessage(content="x")])).id
        )
        raise RuntimeError("rolled back")

    try:
        await harness.commit(rolled_back)
    except RuntimeError:
        pass
    assert cache.entry(root.id, minted[0]) is None and await harness.entry(minted[0]) is None
    assert cache.entry(root.id + 1000, first) is None
    await harness.close()


async def test_views_extended_over_tool_rounds_agree_with_deriving_whole() -> None:
    from harness_core import tool
    from harness_core.messages import ToolResultMessage
    from harness_core.models.faux import faux_text, faux_tool_call

    @tool(replay="safe")
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"{key} = 42"

    def respond(request: object) -> object:
        messages = request.messages  # type: ignore[attr-defined]
        if messages and isinstance(messages[-1], ToolResultMessage):
            return faux_assistant([faux_text("42")])
        return faux_assistant([faux_tool_call("lookup", {"key": "k"}, id="call-1")], stop_reason="toolUse")

    harness, _ = await open_harness(responder=respond, tools=[lookup])  # type: ignore[arg-type]
    root = await harness.root(agent=FAUX)
    for i in range(4):
        settled = await (await root.submit(Input(f"q{i}"))).wait()
        assert settled.status == "done"
        await assert_agrees(harness, root.id)
    view = await load_context(harness, root.id)
    assert [type(m).__name__ for m in view.messages[-4:]] == [
        "UserMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "AssistantMessage",
    ]
    await harness.close()


async def test_a_caller_editing_the_view_it_got_does_not_change_later_contexts() -> None:
    # conversation.context() and watch snapshots are public: a caller that builds on the lists it got (say,
    # appends a message to try a request) must not change the cached view that later views extend.
    from harness_core.messages import SystemMessage

    harness = await Harness.open(await MemoryStorage.open())
    root = await harness.root()
    await note(harness, root.id, "one")

    async def system(tx: Tx) -> None:
        tx.append_entry(root.id, EntryDraft(kind="core.system", model=[SystemMessage(sections={"a": "b"})]))

    await harness.commit(system)  # a non-user message: later appends extend the cached view
    view = await root.context()
    view.messages.append(UserMessage(content="scratch"))
    view.entries.append(view.entries[-1])
    view.contributions.append([UserMessage(content="scratch")])
    async with root.watch() as frames:
        async for frame in frames:
            frame.entries.clear()
            break
    await note(harness, root.id, "two")
    await assert_agrees(harness, root.id)
    await harness.close()


async def test_the_cache_is_bounded_by_bytes_and_an_evicted_range_reads_back_the_same() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    budget = 20_000
    harness.context_cache = cache = ContextCache(max_bytes=budget)
    harness.session.subscribe(cache.on_publication)
    root = await harness.root()
    conversations = [root.id] + [(await harness.create_conversation()).id for _ in range(9)]
    for round_ in range(6):
        for conversation_id in conversations:
            await note(harness, conversation_id, f"round {round_}: " + "x" * 400)
            await assert_agrees(harness, conversation_id)
        assert cache.size[1] <= budget
    assert cache.size[0] < len(conversations)  # without the byte bound all ten (about 27 KB) stay
    for conversation_id in conversations:  # the evicted ones come back from storage, whole
        await assert_agrees(harness, conversation_id)
    await harness.close()


async def test_a_range_bigger_than_the_whole_budget_is_used_but_not_kept() -> None:
    harness = await Harness.open(await MemoryStorage.open())
    harness.context_cache = cache = ContextCache(max_bytes=1_000)
    harness.session.subscribe(cache.on_publication)
    root = await harness.root()
    for n in range(5):
        await note(harness, root.id, f"{n}: " + "y" * 400)
    await assert_agrees(harness, root.id)
    assert cache.size == (0, 0)
    await harness.close()


async def test_misses_are_counted_and_a_range_read_back_counts_only_its_newer_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counted: list[int] = []
    real = context_cache_module.entry_bytes

    def counting(entry: Entry) -> int:
        counted.append(entry.id)
        return real(entry)

    monkeypatch.setattr(context_cache_module, "entry_bytes", counting)
    harness = await Harness.open(await MemoryStorage.open())
    harness.context_cache = cache = ContextCache(capacity=1)  # a second conversation pushes the first out
    harness.session.subscribe(cache.on_publication)
    root = await harness.root()
    other = await harness.create_conversation()
    for n in range(5):
        await note(harness, root.id, f"{n}: " + "z" * 100)
    await assert_agrees(harness, root.id)
    await assert_agrees(harness, root.id)
    assert (cache.gets, cache.reads) == (2, 1)  # the second was served from the cache
    whole = cache.size[1]
    await assert_agrees(harness, other.id)  # root's range leaves
    newer = await note(harness, root.id, "after it left")
    counted.clear()
    await assert_agrees(harness, root.id)  # read back from storage
    assert cache.reads == 3
    assert counted == [newer]  # the rest came from what the cache knew when it let the range go
    _, entries = await read_active_range(harness, root.id, None)
    assert cache.size[1] == sum(real(e) for e in entries) > whole  # the same as counting them all
    await harness.close()


async def test_the_settings_give_a_harness_its_share_of_the_cache() -> None:
    """A worker running one harness per owned partition gives each a share of the budget (bots/workers.py)."""
    settings = HarnessSettings(context_cache_bytes=3_000, context_cache_conversations=2)
    harness = await Harness.open(await MemoryStorage.open(), settings=settings)
    root = await harness.root()
    conversations = [root.id] + [(await harness.create_conversation()).id for _ in range(3)]
    for conversation_id in conversations:
        for n in range(3):
            await note(harness, conversation_id, f"{n}: " + "w" * 400)
        await assert_agrees(harness, conversation_id)
        held, size = harness.context_cache.size
        assert held <= 2 and size <= 3_000
    await harness.close()


async def _cache_of(budget: int) -> tuple[Harness, ContextCache]:
    harness = await Harness.open(await MemoryStorage.open())
    harness.context_cache = cache = ContextCache(max_bytes=budget)
    harness.session.subscribe(cache.on_publication)
    return harness, cache


async def test_a_range_in_use_is_not_evicted_for_another_one() -> None:
    # Budget for one range: a generation holding A's context while B's is read. Evicting A would free nothing
    # (the generation holds it) and make A's next step read it again; B, idle once read, leaves instead.
    harness, cache = await _cache_of(3_000)
    root = await harness.root()
    other = (await harness.create_conversation()).id
    for n in range(4):
        await note(harness, root.id, f"a{n}: " + "a" * 400)
        await note(harness, other, f"b{n}: " + "b" * 400)
    held = await load_context(harness, root.id)
    assert cache.reads == 1 and cache.in_use == 1
    await assert_agrees(harness, other)  # over the budget with both: the idle one (B) leaves
    assert cache.size[0] == 1 and cache.size[1] <= 3_000
    reads = cache.reads
    await assert_agrees(harness, root.id)  # still cached
    assert cache.reads == reads
    assert held.entries[-1].id == (await load_context(harness, root.id)).entries[-1].id
    del held
    assert cache.in_use == 0
    await assert_agrees(harness, other)  # now A is idle and least recently used: it leaves for B
    reads = cache.reads
    await assert_agrees(harness, root.id)
    assert cache.reads == reads + 1
    await harness.close()


async def test_ranges_in_use_stay_past_the_budget_until_let_go_then_the_cache_shrinks_back() -> None:
    harness, cache = await _cache_of(5_000)
    root = await harness.root()
    other = (await harness.create_conversation()).id
    for n in range(4):
        await note(harness, root.id, f"a{n}: " + "a" * 400)
        await note(harness, other, f"b{n}: " + "b" * 400)
    first = await load_context(harness, root.id)
    second = await load_context(harness, other)  # both fit
    assert cache.size[0] == 2 and cache.in_use == 2
    for n in range(3):  # published into both cached ranges while they are in use: over the budget
        await note(harness, root.id, f"more a{n}: " + "a" * 400)
        await note(harness, other, f"more b{n}: " + "b" * 400)
    assert cache.size[0] == 2 and cache.size[1] > 5_000
    del first, second
    assert cache.size[0] == 2  # the views only count; the shrink runs on the loop's next turn
    await asyncio.sleep(0)
    assert cache.size[0] == 1 and cache.size[1] <= 5_000 and cache.in_use == 0
    await assert_agrees(harness, root.id)
    await assert_agrees(harness, other)
    await harness.close()


async def test_a_range_dropped_while_in_use_counts_against_the_budget_until_its_views_are_gone() -> None:
    harness, cache = await _cache_of(100_000)
    root = await harness.root()
    for n in range(3):
        await note(harness, root.id, f"{n}: " + "c" * 400)
    held = await load_context(harness, root.id)
    before = cache.size[1]
    marker = await note(harness, root.id, "handoff", head="self")  # a new range start: the old range is stale
    await assert_agrees(harness, root.id)  # reads the new range; the old one leaves the cache, still held
    _, fresh = cache.size
    assert cache.in_use == 1  # the old range (the new one's view is gone)
    assert held.head is None and fresh > before  # the old range's bytes still count, with the new range's
    del held
    assert cache.in_use == 0 and cache.size[1] == fresh - before
    view = await load_context(harness, root.id)
    assert view.head is not None and view.head.id == marker
    await harness.close()


async def test_a_generation_holds_its_context_only_while_it_uses_it() -> None:
    # The prepare step reads the context, plans from it and lets it go before its commit waits for storage;
    # the request step holds it while the model answers and lets it go before recording the answer. A context
    # held across a commit counts as in use (or stays alive after it left the cache) for nothing.
    from collections.abc import Sequence

    from harness_core.storage import CommitBatch

    in_use_at: dict[str, list[int]] = {"prepare": [], "answer": []}

    class Watching(MemoryStorage):
        harness: Harness | None = None

        async def commit(self, batches: Sequence[CommitBatch]) -> None:
            if self.harness is not None:
                in_use = self.harness.context_cache.in_use
                for batch in batches:
                    if any((t.state.checkpoint or {}).get("phase") == "request" for t in batch.tasks):
                        in_use_at["prepare"].append(in_use)
                    if any(e.kind == "core.assistant" for e in batch.entries):
                        in_use_at["answer"].append(in_use)
            await super().commit(batches)

    storage = await Watching.open()
    harness, faux = await open_harness(storage=storage)
    storage.harness = harness

    def respond(_request: object) -> object:
        in_use_at.setdefault("model", []).append(harness.context_cache.in_use)
        return faux_assistant("ok")

    faux.set_responder(respond)  # type: ignore[arg-type]
    real_snapshot = harness.snapshot

    async def snapshot(*args: Any, **kwargs: Any) -> Any:  # the request step's other reads come first
        in_use_at.setdefault("snapshot", []).append(harness.context_cache.in_use)
        return await real_snapshot(*args, **kwargs)

    harness.snapshot = snapshot  # type: ignore[method-assign]
    root = await harness.root(agent=FAUX)
    for i in range(3):
        await (await root.submit(Input(f"q{i}"))).wait()
    assert in_use_at["model"] == [1, 1, 1]  # in use while the model answers from it
    assert in_use_at["prepare"] == in_use_at["answer"] == [0, 0, 0]
    assert len(in_use_at["snapshot"]) >= 6 and set(in_use_at["snapshot"]) == {0}
    await assert_agrees(harness, root.id)
    await harness.close()


async def _two_conversations(cache_kwargs: dict[str, Any]) -> tuple[Harness, ContextCache, int, int]:
    harness = await Harness.open(await MemoryStorage.open())
    harness.context_cache = cache = ContextCache(**cache_kwargs)
    harness.session.subscribe(cache.on_publication)
    root = await harness.root()
    other = (await harness.create_conversation()).id
    for n in range(3):
        await note(harness, root.id, f"a{n}: " + "a" * 400)
        await note(harness, other, f"b{n}: " + "b" * 400)
    return harness, cache, root.id, other


async def test_a_miss_waits_while_misses_in_use_fill_their_budget_and_goes_on_once_one_is_let_go() -> None:
    # A cohort of generations that all miss would each hold a whole context the cache could not keep: misses in
    # use share a budget (here: one range at a time), hits never wait.
    harness, cache, first, second = await _two_conversations({"miss_bytes": 1, "admit_wait": 30.0})
    held = await load_context(harness, first)
    assert cache.missing[0] == 1
    waiting = asyncio.ensure_future(load_context(harness, second))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done() and cache.admit_waits == 1
    again = await load_context(harness, first)  # a hit: served at once
    assert again.entries[-1].id == held.entries[-1].id
    del held, again
    view = await asyncio.wait_for(waiting, 5)
    assert cache.missing[0] == 1 and cache.admit_timeouts == 0
    assert view == derive_context(*await read_active_range(harness, second, None))
    del view, waiting
    await asyncio.sleep(0)
    assert cache.missing == (0, 0)
    await assert_agrees(harness, first)
    await harness.close()


async def test_the_wait_for_the_miss_budget_is_bounded() -> None:
    # A step holding one context that asks for another would otherwise wait for itself.
    harness, cache, first, second = await _two_conversations({"miss_bytes": 1, "admit_wait": 0.05})
    held = await load_context(harness, first)
    view = await asyncio.wait_for(load_context(harness, second), 5)
    assert (cache.admit_waits, cache.admit_timeouts) == (1, 1)
    assert cache.missing[0] == 2  # over the budget, counted
    assert view == derive_context(*await read_active_range(harness, second, None))
    del held, view
    await asyncio.sleep(0)
    assert cache.missing == (0, 0)
    await harness.close()


async def test_a_miss_whose_caller_takes_no_view_or_whose_read_fails_gives_its_share_back() -> None:
    harness, cache, first, second = await _two_conversations({"max_bytes": 500, "miss_bytes": 1})
    await assert_agrees(harness, first)  # bigger than the whole cache: used, not kept, no view watched
    await asyncio.sleep(0)
    assert cache.missing == (0, 0) and cache.size == (0, 0)

    async def failing() -> tuple[Entry | None, list[Entry]]:
        raise OSError("disk gone")

    with pytest.raises(OSError):
        await cache.get(second, None, failing)
    assert cache.missing == (0, 0)
    view = await asyncio.wait_for(load_context(harness, second), 5)  # not blocked by either
    assert cache.admit_waits == 0 and view.entries
    await harness.close()


async def test_a_miss_waiting_while_another_step_reads_the_same_range_is_served_from_it() -> None:
    harness, cache, first, second = await _two_conversations({"miss_bytes": 1, "admit_wait": 30.0})
    held = await load_context(harness, first)
    one = asyncio.ensure_future(load_context(harness, second))
    two = asyncio.ensure_future(load_context(harness, second))
    for _ in range(5):
        await asyncio.sleep(0)
    del held
    first_view = await asyncio.wait_for(one, 5)
    del one
    for _ in range(5):
        await asyncio.sleep(0)
    assert not two.done()  # the first view holds the budget
    del first_view
    second_view = await asyncio.wait_for(two, 5)
    assert cache.reads == 2  # the second waiter found the range the first one read: a hit
    assert second_view == derive_context(*await read_active_range(harness, second, None))
    del second_view, two
    await asyncio.sleep(0)
    assert cache.missing == (0, 0)
    await harness.close()


async def test_generations_that_all_miss_hold_at_most_the_miss_budget_of_contexts_at_once() -> None:
    # Six conversations answered at once with a cache that keeps one idle range: every step misses. The
    # model sees at most one context in use at a time (the budget admits one range), and every context read back
    # equals the one read whole from storage.
    harness, faux = await open_harness()
    harness.context_cache = cache = ContextCache(capacity=1, miss_bytes=1, admit_wait=30.0)
    harness.session.subscribe(cache.on_publication)
    seen: list[int] = []

    def respond(_request: object) -> object:
        seen.append(cache.in_use)
        return faux_assistant("ok")

    faux.set_responder(respond)  # type: ignore[arg-type]
    conversations = [await harness.root(agent=FAUX)] + [
        await harness.create_conversation(agent=FAUX) for _ in range(5)
    ]
    for round_ in range(2):
        handles = [await c.submit(Input(f"q{round_}")) for c in conversations]
        await asyncio.wait_for(asyncio.gather(*(h.wait() for h in handles)), 30)
    assert len(seen) == 12 and max(seen) == 1
    assert cache.admit_waits > 0 and cache.admit_timeouts == 0
    for conversation in conversations:
        await assert_agrees(harness, conversation.id)
    await asyncio.sleep(0)
    assert cache.missing == (0, 0)
    await harness.close()


async def test_a_miss_reckoned_bigger_than_it_reads_makes_room_for_a_waiter_at_once() -> None:
    # Ranges never counted before are reckoned at MISS_GUESS; once read, their share is their real size.
    budget = context_cache_module.MISS_GUESS + 5_000
    harness, cache, first, second = await _two_conversations({"miss_bytes": budget, "admit_wait": 30.0})
    release = asyncio.Event()

    async def slow_read() -> tuple[Entry | None, list[Entry]]:
        await release.wait()
        return await read_active_range(harness, first, None)

    async def first_view() -> Any:  # as `load_context` does, with a read that waits
        head, entries = await cache.get(first, None, slow_read)
        return cache.derived(first, entries, lambda: derive_context(head, entries))

    one = asyncio.ensure_future(first_view())
    await asyncio.sleep(0)
    two = asyncio.ensure_future(load_context(harness, second))  # two guesses do not fit: it waits
    for _ in range(5):
        await asyncio.sleep(0)
    assert cache.admit_waits == 1 and not two.done()
    release.set()
    held = await asyncio.wait_for(one, 5)  # the first range stays in use
    view = await asyncio.wait_for(two, 5)
    assert cache.admit_timeouts == 0
    assert cache.missing[0] == 2 and cache.missing[1] < budget
    assert held == derive_context(*await read_active_range(harness, first, None)) and view.entries
    del held, view, one, two
    await asyncio.sleep(0)
    assert cache.missing == (0, 0)
    await harness.close()
