"""devchat intake against hostile input over the real websocket: a post carrying a lone surrogate (the JSON
escape `\\ud83d`, as a browser can send it) is stored, answered once and survives a restart; frames of any shape
are answered or refused with an error frame and the connection stays; a new store (the old file deleted) never
reuses the request id of an old post."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.devchat import ChatStore

from .support import Rig, final_bot, post


async def test_a_post_with_a_lone_surrogate_is_answered_once_and_a_restart_is_clean(
    rig_factory: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await rig_factory()
    await rig.run()
    page, _ = await rig.hello()
    frame = json.dumps(post("client-s001", "@bot hi \ud83d there", name="zo\udc00e"))
    assert "\\ud83d" in frame  # the escape travels, as JSON allows
    await page.ws.send_str(frame)
    ack = await page.until(lambda f: f["type"] in ("ack", "nack", "error"))
    assert ack["type"] == "ack" and ack["outcome"] == "answering", ack
    await page.until(final_bot("answer to zo\ufffde: @bot hi \ufffd there"))
    await page.send(**post("client-s002", "@bot still there?"))
    await page.until(final_bot("answer to alice: @bot still there?"))
    await page.close()

    await rig.adapter.stop()
    await rig.start_adapter()  # the restart catches up through the same dedupe: nothing is taken in twice
    page, snapshot = await rig.hello()
    humans = [m["text"] for m in snapshot["messages"] if m["kind"] == "human"]
    assert humans == ["@bot hi \ufffd there", "@bot still there?"]
    answers = [m["text"] for m in snapshot["messages"] if m["kind"] == "bot"]
    assert answers == ["answer to zo\ufffde: @bot hi \ufffd there", "answer to alice: @bot still there?"]
    await page.send(**post("client-s003", "@bot and after the restart?"))
    await page.until(final_bot("answer to alice: @bot and after the restart?"))
    assert len(rig.faux.requests) == 3


async def test_a_new_store_never_reuses_the_request_id_of_a_deleted_one(
    rig_factory: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await rig_factory()
    await rig.run()
    page, _ = await rig.hello()
    await page.send(**post("client-d001", "@bot before the reset"))
    first = await page.until(lambda f: f["type"] == "ack")
    await page.until(final_bot("answer to alice: @bot before the reset"))
    await page.close()
    await rig.adapter.stop()
    for suffix in ("", "-wal", "-shm"):  # the operator deletes var/devchat.sqlite
        rig.store_path.with_name(rig.store_path.name + suffix).unlink(missing_ok=True)

    await rig.start_adapter()
    page, _ = await rig.hello()
    await page.send(**post("client-d002", "@bot after the reset"))
    second = await page.until(lambda f: f["type"] == "ack")
    assert second["message_id"] == first["message_id"]  # the chat's own ids start again...
    assert second["outcome"] == "answering", second  # ...but the request id is another one
    await page.until(final_bot("answer to alice: @bot after the reset"))
    assert len(rig.faux.requests) == 2


async def legacy_store(path: Path) -> None:
    """A store as created before store ids existed (its request ids carry no store identity)."""
    store = await ChatStore.open(path)
    await store.db.execute("DELETE FROM meta WHERE key = 'store_id'")
    await store.close()


async def test_a_reused_id_with_other_content_is_a_loud_conflict_not_a_silent_duplicate(
    rig_factory: Callable[..., Awaitable[Rig]], caplog: pytest.LogCaptureFixture
) -> None:
    rig = await rig_factory()
    await rig.bridge.start()
    await legacy_store(rig.store_path)
    await rig.start_adapter()
    rig.harness.resume()
    page, _ = await rig.hello()
    await page.send(**post("client-c001", "@bot in the old store"))
    first = await page.until(lambda f: f["type"] == "ack")
    await page.until(final_bot("answer to alice: @bot in the old store"))
    await page.close()
    await rig.adapter.stop()
    for suffix in ("", "-wal", "-shm"):
        rig.store_path.with_name(rig.store_path.name + suffix).unlink(missing_ok=True)
    await legacy_store(rig.store_path)  # deleted and replaced by another store without an id

    await rig.start_adapter()
    page, _ = await rig.hello()
    with caplog.at_level(logging.ERROR, logger="adapters.bridge"):
        await page.send(**post("client-c002", "@bot in the new store"))
        second = await page.until(lambda f: f["type"] == "ack")
    assert second["message_id"] == first["message_id"]
    assert second["outcome"] == "conflict"
    assert (
        "RequestIdConflict" in caplog.text and f"devchat:local:general:{first['message_id']}" in caplog.text
    )


frames = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
hostile_posts = st.fixed_dictionaries(
    {"type": st.just("post")},
    optional={
        "name": st.text(max_size=40) | st.integers() | st.none() | st.lists(st.text(max_size=3), max_size=2),
        "channel": st.sampled_from(["general", "ops", "nowhere", ""]) | st.text(max_size=10) | st.integers(),
        "thread": st.none() | st.integers(min_value=-3, max_value=10**20) | st.text(max_size=5),
        "text": st.text(max_size=200) | st.just("\u202eevil\u202c @bot") | st.integers() | st.none(),
        "client_id": st.text(min_size=0, max_size=70) | st.integers(),
    },
)


async def test_hostile_frames_never_stop_the_page_or_the_bot(rig: Rig) -> None:
    page, _ = await rig.hello()
    loop = asyncio.get_running_loop()
    sent: list[str] = []

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(
        st.one_of(
            frames.map(json.dumps),
            hostile_posts.map(json.dumps),
            st.text(max_size=50),  # not JSON at all
            st.integers(min_value=1, max_value=3000).map(lambda n: "[" * n + "]" * n),  # deep nesting
            st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3).map(
                lambda s: json.dumps({"type": "post", "name": s or "x", "channel": "general", "text": s})
            ),
        )
    )
    def one(frame: str) -> None:
        sent.append(frame)

    one()
    sent += [  # shapes a random search rarely hits all at once
        json.dumps({**post("client-h001", "@bot x"), "thread": 10**20}),
        json.dumps({**post("client-h002", "@bot x"), "thread": -1}),
        json.dumps({"type": "click", "name": "alice", "gate": 10**30, "approve": True}),
        json.dumps({"type": "retry", "name": "alice", "task": -(10**30)}),
        json.dumps(post("client-h003", "x" * 9_000)),
        json.dumps(post("client-h004", "@bot \u202e\u2066 bidi \u0000 nul")),
        json.dumps({"type": "hello", "cursor": 10**40, "epoch": "\ud800"}),
    ]
    for frame in sent:
        await page.ws.send_str(frame)
    # Every frame is answered (an ack, a nack, or an error) before the next one is read: a sentinel post made
    # after all of them is taken in and answered, so the connection and the bot are still up.
    await page.send(**post("client-zz99", "@bot sentinel"))
    ack = await page.until(lambda f: f["type"] == "ack" and f["client_id"] == "client-zz99")
    assert ack["outcome"] == "answering"
    await page.until(final_bot("answer to alice: @bot sentinel"))
    assert loop.is_running() and not rig.harness.closed.done()
    assert not [f for f in page.frames if f["type"] == "error" and "failed" in f["text"]]
