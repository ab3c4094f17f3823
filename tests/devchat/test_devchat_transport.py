"""devchat as the bridge sees it: the transport over the chat store, the store itself, and the options."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adapters.bridge import DeleteRefused, GateView, MessageGone, Place, Router
from adapters.bridge.testing import MemoryIngress
from adapters.devchat import ChatStore, DevchatConfigError, DevchatTransport, StoreLocked, create
from adapters.devchat.transport import mentions

GENERAL = Place("devchat", "local", "general")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ChatStore]:
    opened = await ChatStore.open(tmp_path / "var" / "devchat.sqlite")
    await opened.add_channel("general", None)
    yield opened
    await opened.close()


def transport(store: ChatStore) -> DevchatTransport:
    return DevchatTransport(store, workspace="local", bot_name="bot", max_chars=4000, edit_interval=0.0)


async def test_create_edit_and_find_by_key(store: ChatStore) -> None:
    chat = transport(store)
    seen: list[list[dict[str, Any]]] = []
    store.listeners.append(seen.append)
    message_id = await chat.create(GENERAL, "thinking …", "reply:7#0")
    assert await chat.find(GENERAL, "reply:7#0") == message_id
    assert await chat.find(GENERAL.in_thread(message_id), "reply:7#0") is None  # another place
    assert await chat.find(GENERAL, "reply:8#0") is None
    # A create repeated with the same key (a crash before the id was recorded) is the same message.
    assert await chat.create(GENERAL, "thinking more …", "reply:7#0") == message_id
    await chat.edit(GENERAL, message_id, "the answer", "reply:7#0", final=True)
    message = await store.message(int(message_id))
    assert message is not None
    assert (message["text"], message["final"], message["kind"], message["author"]) == (
        "the answer",
        True,
        "bot",
        "bot",
    )
    with pytest.raises(MessageGone):
        await chat.edit(GENERAL, "999", "x", "reply:9#0", final=True)
    # Every change reached the listeners once, as events with increasing sequence numbers.
    events = [e for batch in seen for e in batch]
    assert [e["message"]["text"] for e in events] == ["thinking …", "thinking more …", "the answer"]
    assert [e["seq"] for e in events] == sorted({e["seq"] for e in events})
    snapshot = await store.snapshot()
    assert [m["id"] for m in snapshot.messages] == [int(message_id)]
    assert snapshot.cursor == events[-1]["seq"]


async def test_approval_card_is_posted_once_and_shows_the_decision(store: ChatStore) -> None:
    chat = transport(store)
    gate = GateView(
        gate_id=42,
        tool="deploy",
        arguments={"service": "api"},
        requester_id="alice",
        requester_name="alice",
        status="pending",
        decided_by=None,
        decided_at=None,
        expires_at=1_700_000_000_000,
    )
    card = await chat.post_approval(GENERAL, gate, "approval:42")
    assert await chat.post_approval(GENERAL, gate, "approval:42") == card
    assert await chat.find(GENERAL, "approval:42") == card
    pending = await store.message(int(card))
    assert pending is not None
    assert pending["kind"] == "approval"
    assert pending["gate"]["status"] == "pending"
    assert pending["text"] == "Approval needed: deploy(service='api') asked by alice"
    decided = GateView(**{**gate.__dict__, "status": "approved", "decided_by": "boss", "decided_at": 1})
    await chat.update_approval(GENERAL, card, decided)
    shown = await store.message(int(card))
    assert shown is not None
    assert shown["gate"]["decided_by"] == "boss"
    assert shown["text"] == "deploy(service='api'): approved by boss"
    assert len((await store.snapshot()).messages) == 1


async def test_history_returns_human_posts_of_one_place_after_a_message(store: ChatStore) -> None:
    chat = transport(store)
    first, _ = await store.add_human("general", None, "alice", "hello @bot", "client-0001")
    await chat.create(GENERAL, "bot text", "reply:1#0")
    second, _ = await store.add_human("general", None, "bob", "emailing bot@example.com", "client-0002")
    threaded, _ = await store.add_human("general", first["id"], "carol", "in a thread", "client-0003")
    missed = await chat.history(GENERAL, None)
    assert [(m.message_id, m.user_name, m.mentions_bot) for m in missed] == [
        (str(first["id"]), "alice", True),
        (str(second["id"]), "bob", False),
    ]
    assert [m.message_id for m in await chat.history(GENERAL, str(first["id"]))] == [str(second["id"])]
    in_thread = await chat.history(GENERAL.in_thread(str(first["id"])), None)
    assert [(m.message_id, m.place.thread, m.user_id) for m in in_thread] == [
        (str(threaded["id"]), str(first["id"]), "carol")
    ]


def test_mentions_need_the_whole_name() -> None:
    assert mentions("@bot status?", "bot")
    assert mentions("hey @Bot, status?", "bot")
    assert not mentions("@botany is a science", "bot")
    assert not mentions("mail bot@example.com", "bot")
    assert not mentions("status?", "bot")


async def test_store_is_private_locked_and_keeps_its_messages(tmp_path: Path) -> None:
    path = tmp_path / "var" / "devchat.sqlite"
    first = await ChatStore.open(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(StoreLocked, match="another process"):
        await ChatStore.open(path)
    await first.add_channel("general", None)
    await first.add_human("general", None, "alice", "remember me", "client-0001")
    epoch = first.epoch
    await first.close()
    reopened = await ChatStore.open(path)
    try:
        assert reopened.epoch == epoch
        _, created = await reopened.add_human("general", None, "alice", "remember me", "client-0001")
        assert not created
        assert [m["text"] for m in (await reopened.snapshot()).messages] == ["remember me"]
    finally:
        await reopened.close()


async def test_a_cursor_behind_the_pruned_log_gets_no_events(tmp_path: Path) -> None:
    store = await ChatStore.open(tmp_path / "chat.sqlite", keep_events=100)
    try:
        await store.add_channel("general", None)
        message, _ = await store.add_bot("general", None, kind="bot", author="bot", text="0", key="k")
        for index in range(1, 300):
            await store.update(message["id"], text=str(index))
        last = await store.last_seq()
        assert await store.events_after(1) is None  # pruned: the page needs a snapshot
        recent = await store.events_after(last - 3)
        assert recent is not None
        assert [e["message"]["text"] for e in recent] == ["297", "298", "299"]
        assert await store.events_after(last + 5) is None  # a cursor from another store's future
    finally:
        await store.close()


def test_create_validates_options_and_names_the_key(tmp_path: Path) -> None:
    adapter = create({"port": 9000, "store": str(tmp_path / "c.sqlite"), "approvers": [" boss "]}, {})
    assert adapter.options.port == 9000
    assert adapter.options.approvers == ["boss"]
    assert create({}, {"DEVCHAT_PORT": "9100"}).options.port == 9100
    with pytest.raises(DevchatConfigError, match=r"adapters\.devchat\.port"):
        create({"port": "many"}, {})
    with pytest.raises(DevchatConfigError, match=r"adapters\.devchat\.colour: Extra inputs"):
        create({"colour": "blue"}, {})
    with pytest.raises(
        DevchatConfigError, match=r"adapters\.devchat\.channels\.0|adapters\.devchat\.channels"
    ):
        create({"channels": ["Not A Channel"]}, {})
    with pytest.raises(DevchatConfigError, match=r"adapters\.devchat\.host: '0\.0\.0\.0' is not a loopback"):
        create({"host": "0.0.0.0"}, {})
    # Off loopback an access token is required (from the environment only), and the operator is warned.
    with pytest.raises(DevchatConfigError, match=r"adapters\.devchat\.allow_remote: .* set DEVCHAT_TOKEN"):
        create({"host": "0.0.0.0", "allow_remote": True}, {})
    with pytest.raises(DevchatConfigError, match=r"DEVCHAT_TOKEN is too short"):
        create({"host": "0.0.0.0", "allow_remote": True}, {"DEVCHAT_TOKEN": "short"})
    with pytest.raises(DevchatConfigError, match=r"adapters\.devchat\.token: secrets do not belong"):
        create({"token": "x" * 20}, {})
    remote = create({"host": "0.0.0.0", "allow_remote": True}, {"DEVCHAT_TOKEN": "k" * 24})
    assert remote.options.host == "0.0.0.0" and remote.options.token == "k" * 24
    assert "k" * 24 not in repr(remote.options)
    (warning,) = remote.warnings
    assert "devchat identities are unauthenticated names" in warning
    assert create({}, {}).warnings == []


async def test_delete_removes_a_part_repeats_harmlessly_and_refuses_a_thread_parent(store: ChatStore) -> None:
    chat = transport(store)
    seen: list[list[dict[str, Any]]] = []
    store.listeners.append(seen.append)
    extra = await chat.create(GENERAL, "old tail", "reply:7#1")
    await chat.delete(GENERAL, extra, "reply:7#1")
    await chat.delete(GENERAL, extra, "reply:7#1")  # again after a crash: already gone is no error
    assert await store.message(int(extra)) is None
    assert await chat.find(GENERAL, "reply:7#1") is None
    assert [e["type"] for batch in seen for e in batch] == ["message", "deleted"]  # the page drops it
    parent = await chat.create(GENERAL, "answered in a thread", "reply:8#1")
    await store.add_human("general", int(parent), author="alice", text="about this", client_id="c1")
    with pytest.raises(DeleteRefused):  # the bridge blanks it instead: the thread stays readable
        await chat.delete(GENERAL, parent, "reply:8#1")


async def test_devchat_refuses_to_run_as_one_of_several_workers(tmp_path: Path) -> None:
    """Its page reads the whole store through one harness: behind a partition router it cannot work."""
    adapter = create({"port": 0, "store": str(tmp_path / "c.sqlite")}, {})
    router = Router(MemoryIngress(), 4)
    with pytest.raises(DevchatConfigError, match=r"single process .* \[storage\] partitions = 1"):
        await adapter.start(router)
    await router.stop()
    assert not (tmp_path / "c.sqlite").exists()  # refused before anything was opened
