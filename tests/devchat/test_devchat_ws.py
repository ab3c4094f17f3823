"""The devchat server over real HTTP and websockets (aiohttp client against the adapter on a free port): hello
and snapshots, posts committed before the ack, resuming from a cursor, exactly-once posts, private refusals,
catch-up, and the guards of a server without a login."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from adapters.bridge import IncomingMessage, MessageDoc, Place
from adapters.devchat import ChatStore

from .support import Rig, final_bot, message_events

GENERAL = Place("devchat", "local", "general")


def post(client_id: str, text: str, *, name: str = "alice", channel: str = "general") -> dict[str, Any]:
    return {
        "type": "post",
        "name": name,
        "channel": channel,
        "thread": None,
        "text": text,
        "client_id": client_id,
    }


async def test_hello_gets_a_snapshot_and_the_panel(rig: Rig) -> None:
    page, first = await rig.hello()
    assert first["type"] == "snapshot"
    assert [c["name"] for c in first["channels"]] == ["general", "ops"]
    assert first["messages"] == []
    assert first["bot"] == "bot"
    assert first["epoch"] == rig.adapter.store.epoch  # type: ignore[union-attr]
    panel = await page.until(lambda f: f["type"] == "panel")
    assert panel["tasks"] == [] and panel["approvals"] == []
    async with aiohttp.ClientSession() as http, http.get(rig.adapter.url + "healthz") as response:
        health = await response.json()
    assert health["ok"] and health["cursor"] == first["cursor"]


async def test_post_is_committed_before_the_ack_and_the_answer_streams_into_one_message(rig: Rig) -> None:
    rig.faux.chunk_size = 2
    rig.faux.delay_ms = 20
    page, _ = await rig.hello()
    await page.send(**post("client-0001", "@bot hello there"))
    ack = await page.until(lambda f: f["type"] == "ack")
    assert ack["outcome"] == "answering"
    # The human message was broadcast (stored) before the ack, and the harness had it when the ack went out.
    stored = [m for f in page.frames for m in message_events(f) if m["kind"] == "human"]
    assert [(m["id"], m["author"], m["text"]) for m in stored] == [
        (ack["message_id"], "alice", "@bot hello there")
    ]
    assert await rig.harness.snapshot(MessageDoc, key=GENERAL.message_key(str(ack["message_id"]))) is not None
    await page.until(final_bot("answer to alice: @bot hello there"))
    bot_states = [m for f in page.frames for m in message_events(f) if m["kind"] == "bot"]
    assert len({m["id"] for m in bot_states}) == 1  # one message, edited as the answer streamed
    assert any(not m["final"] for m in bot_states)  # partials were shown live
    assert bot_states[-1]["text"] == "answer to alice: @bot hello there" and bot_states[-1]["final"]


async def test_reconnect_with_cursor_gets_only_the_missed_events(rig: Rig) -> None:
    away, first = await rig.hello()
    cursor, epoch = first["cursor"], first["epoch"]
    await away.close()
    other, _ = await rig.hello()
    await other.send(**post("client-0002", "@bot what did I miss?", name="bob"))
    await other.until(final_bot("answer to bob"))
    missed = [e["seq"] for e in other.events()]

    back, resumed = await rig.hello(cursor=cursor, epoch=epoch)
    assert resumed["type"] == "events" and resumed["resumed"]
    assert [e["seq"] for e in resumed["events"]] == missed  # exactly what happened while away, in order
    assert missed[0] == cursor + 1
    assert resumed["cursor"] == missed[-1]
    assert not any(f["type"] == "snapshot" for f in back.frames)

    _, current = await rig.hello(cursor=resumed["cursor"], epoch=epoch)
    assert current["type"] == "events" and current["events"] == []
    _, foreign = await rig.hello(cursor=cursor, epoch="another-store")
    assert foreign["type"] == "snapshot"  # a cursor of another store means nothing here


async def test_a_post_resent_after_a_dropped_connection_is_stored_and_answered_once(rig: Rig) -> None:
    dropped = await rig.connect()
    await dropped.send(type="hello")
    await dropped.send(**post("client-0003", "@bot once please"))
    await dropped.close()  # gone before (or while) the server answers
    for _ in range(2):  # the page resends on every reconnect until it sees the ack
        page, _ = await rig.hello()
        await page.send(**post("client-0003", "@bot once please"))
        ack = await page.until(lambda f: f["type"] == "ack")
        assert ack["client_id"] == "client-0003"
    await page.until(final_bot("answer to alice: @bot once please"))
    _, snapshot = await rig.hello()
    humans = [m for m in snapshot["messages"] if m["kind"] == "human"]
    bots = [m for m in snapshot["messages"] if m["kind"] == "bot"]
    assert [m["id"] for m in humans] == [ack["message_id"]]
    assert [m["text"] for m in bots] == ["answer to alice: @bot once please"]
    assert len(rig.faux.requests) == 1


async def test_a_click_by_a_non_approver_is_refused_privately_and_the_approver_runs_the_deploy_once(
    rig_factory: Callable[..., Awaitable[Rig]],
) -> None:
    # alice is an approver too, so her click on her own request is refused as self-approval.
    rig = await rig_factory(approvers=["boss", "alice"])
    await rig.bridge.start()
    await rig.start_adapter()
    rig.harness.resume()
    alice, _ = await rig.hello()
    carol, _ = await rig.hello()
    boss, _ = await rig.hello()
    bob, _ = await rig.hello()  # only watches
    await alice.send(**post("client-0004", "@bot deploy api please", channel="ops"))

    def pending_card(frame: dict[str, Any]) -> bool:
        return any(
            m["kind"] == "approval" and m["gate"]["status"] == "pending" for m in message_events(frame)
        )

    card = next(m for m in message_events(await alice.until(pending_card)) if m["kind"] == "approval")
    gate = card["gate"]["gate_id"]
    assert card["gate"]["tool"] == "deploy" and card["gate"]["requester_name"] == "alice"
    panel = await bob.until(lambda f: f["type"] == "panel" and f["approvals"])
    assert [(a["gate"], a["status"], a["place"]) for a in panel["approvals"]] == [(gate, "pending", "#ops")]

    await carol.send(type="click", name="carol", gate=gate, approve=True)
    refused = await carol.until(lambda f: f["type"] == "notice")
    assert refused["level"] == "error" and "carol is not an approver" in refused["text"]
    await alice.send(type="click", name="alice", gate=gate, approve=True)
    own = await alice.until(lambda f: f["type"] == "notice")
    assert own["level"] == "error" and "another approver" in own["text"]
    assert rig.runs == []

    await boss.send(type="click", name="boss", gate=gate, approve=True)
    accepted = await boss.until(lambda f: f["type"] == "notice")
    assert accepted["level"] == "info"
    await bob.until(final_bot("Deploy finished: deployed api"))
    decided = [m for m in bob.messages().values() if m["kind"] == "approval"]
    assert [(m["gate"]["status"], m["gate"]["decided_by"]) for m in decided] == [("approved", "boss")]
    await boss.send(type="click", name="boss", gate=gate, approve=False)
    again = await boss.until(lambda f: f["type"] == "notice")
    assert "already approved by boss" in again["text"]
    assert rig.runs == ["api"]
    # Refusals went to the clicking page only: the watcher got none, although it saw everything else.
    assert not [f for f in bob.frames if f["type"] == "notice"]
    assert not [f for f in carol.frames if f["type"] == "notice" and f is not refused]


async def test_devchat_approver_list_narrows_the_policy(
    rig_factory: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await rig_factory(approvers=["boss", "dave"])
    await rig.bridge.start()
    await rig.start_adapter(approvers=["dave"])
    rig.harness.resume()
    alice, _ = await rig.hello()
    await alice.send(**post("client-0005", "@bot deploy api", channel="ops"))
    frame = await alice.until(lambda f: any(m["kind"] == "approval" for m in message_events(f)))
    gate = next(m for m in message_events(frame) if m["kind"] == "approval")["gate"]["gate_id"]
    boss, _ = await rig.hello()
    await boss.send(type="click", name="boss", gate=gate, approve=True)
    assert "boss is not an approver" in (await boss.until(lambda f: f["type"] == "notice"))["text"]
    await boss.send(type="click", name="dave", gate=gate, approve=False)
    assert (await boss.until(lambda f: f["type"] == "notice"))["level"] == "info"
    await alice.until(final_bot("Deploy finished"))
    assert rig.runs == []  # denied


async def test_a_click_on_a_gate_that_already_expired_says_it_expired(
    rig_factory: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await rig_factory(expires_after_ms=300)
    await rig.bridge.start()
    await rig.start_adapter()
    rig.harness.resume()
    alice, _ = await rig.hello()
    await alice.send(**post("client-0006", "@bot deploy api", channel="ops"))

    def expired_card(frame: dict[str, Any]) -> bool:
        return any(
            m["kind"] == "approval" and m["gate"]["status"] == "expired" for m in message_events(frame)
        )

    card = next(m for m in message_events(await alice.until(expired_card)) if m["kind"] == "approval")
    boss, _ = await rig.hello()
    await boss.send(type="click", name="boss", gate=card["gate"]["gate_id"], approve=True)
    refused = await boss.until(lambda f: f["type"] == "notice")
    assert refused["level"] == "error"
    # Nobody decided it: the text must not read "already expired by someone".
    assert "expired" in refused["text"] and " by " not in refused["text"], refused["text"]
    assert rig.runs == []


async def test_posts_stored_while_the_bot_was_down_are_caught_up(
    rig_factory: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await rig_factory()
    await rig.bridge.start()
    await rig.start_adapter()
    rig.harness.resume()
    page, _ = await rig.hello()
    await page.send(**post("client-0006", "@bot first"))
    await page.until(final_bot("answer to alice: @bot first"))
    await page.close()
    await rig.adapter.stop()
    # Stored by devchat, never handed to the bridge (a crash between the two commits).
    store = await ChatStore.open(rig.store_path)
    await store.add_human("general", None, "bob", "@bot did you get this?", "client-0007")
    await store.add_channel("fresh", "bob")
    await store.add_human("fresh", None, "bob", "@bot and this, in a channel you never saw?", "client-0008")
    await store.close()
    await rig.start_adapter()
    page, _ = await rig.hello()
    while not [m for m in page.messages().values() if m["kind"] == "bot" and m["final"]][2:]:
        await page.until(lambda f: f["type"] == "events")
    answers = sorted(m["text"] for m in page.messages().values() if m["kind"] == "bot")
    assert answers == [
        "answer to alice: @bot first",
        "answer to bob: @bot and this, in a channel you never saw?",
        "answer to bob: @bot did you get this?",
    ]
    assert len(rig.faux.requests) == 3


async def test_an_adapter_attached_after_the_bridge_started_delivers_replies_left_pending(
    rig_factory: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await rig_factory()
    await rig.bridge.start()
    rig.harness.resume()
    # Answered while devchat was not attached (the reply worker found no transport for the platform).
    await rig.bridge.intake(IncomingMessage(GENERAL, "1", "alice", "alice", "@bot early", mentions_bot=True))
    await rig.harness.wait_for_idle()
    await rig.bridge.delivery.idle()
    await rig.start_adapter()
    page, _ = await rig.hello()
    if not [m for m in page.messages().values() if m["kind"] == "bot" and m["final"]]:
        await page.until(final_bot("answer to alice: @bot early"))
    assert [m["text"] for m in page.messages().values() if m["kind"] == "bot"] == [
        "answer to alice: @bot early"
    ]


async def test_bad_frames_are_answered_with_errors_and_the_connection_stays(rig: Rig) -> None:
    page, _ = await rig.hello()
    await page.send(type="post", name="alice", channel="general", text="hi")  # no client_id
    assert "client_id" in (await page.until(lambda f: f["type"] == "error"))["text"]
    await page.send(**post("client-0009", "hi", name="   "))
    assert "display name" in (await page.until(lambda f: f["type"] == "error"))["text"]
    await page.send(**post("client-0010", "hi", channel="nowhere"))
    assert "no channel #nowhere" in (await page.until(lambda f: f["type"] == "error"))["text"]
    await page.send(type="channel", name="alice", channel="Release Train!")
    assert "channel name" in (await page.until(lambda f: f["type"] == "error"))["text"]
    await page.send(type="click", name="alice", gate=1)  # neither action nor approve
    assert "a click needs an action" in (await page.until(lambda f: f["type"] == "error"))["text"]
    await page.send(type="channel", name="alice", channel="release")
    created = await page.until(lambda f: any(e["type"] == "channel" for e in f.get("events", [])))
    assert created["events"][0]["channel"]["name"] == "release"
    await page.send(type="retry", name="alice", task=12345)
    assert "Retry refused" in (await page.until(lambda f: f["type"] == "notice"))["text"]


async def test_requests_from_other_origins_and_hosts_are_refused(rig: Rig) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await rig.connect(origin="http://evil.example")
    assert refused.value.status == 403
    async with aiohttp.ClientSession() as http:
        async with http.get(rig.adapter.url, headers={"Host": "evil.example"}) as response:
            assert response.status == 403  # DNS rebinding
        async with http.get(rig.adapter.url) as response:
            page = await response.text()
            assert response.status == 200 and 'data-testid="messages"' in page
            assert "default-src 'self'" in response.headers["Content-Security-Policy"]
        async with http.get(rig.adapter.url + "static/app.js") as response:
            assert response.status == 200
        async with http.get(rig.adapter.url + "static/..%2Fstore.py") as response:
            assert response.status in (403, 404)


async def test_only_the_requester_withdraws_a_request_and_the_card_says_so(
    rig_factory: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await rig_factory()
    await rig.bridge.start()
    await rig.start_adapter()
    rig.harness.resume()
    alice, _ = await rig.hello()
    carol, _ = await rig.hello()
    await alice.send(**post("client-0011", "@bot deploy api", channel="ops"))
    frame = await alice.until(lambda f: any(m["kind"] == "approval" for m in message_events(f)))
    card = next(m for m in message_events(frame) if m["kind"] == "approval")["gate"]
    assert card["approvers"] == ["boss"]  # the card says who may approve
    await carol.send(type="click", name="carol", gate=card["gate_id"], action="withdraw")
    refused = await carol.until(lambda f: f["type"] == "notice")
    assert refused["level"] == "error" and "only the person who asked (alice)" in refused["text"]
    await alice.send(type="click", name="alice", gate=card["gate_id"], action="withdraw")
    assert (await alice.until(lambda f: f["type"] == "notice"))["text"] == "you withdrew it"
    await alice.until(final_bot("Deploy finished: (approval #"))
    assert rig.runs == []
    withdrawn = [m for m in alice.messages().values() if m["kind"] == "approval"]
    assert [(m["gate"]["status"], m["gate"]["decided_by"]) for m in withdrawn] == [("withdrawn", "alice")]
