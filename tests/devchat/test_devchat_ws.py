"""The devchat server over real HTTP and websockets (aiohttp client against the adapter on a free port): hello
and snapshots, posts committed before the ack, resuming from a cursor, exactly-once posts, private refusals,
catch-up, and the guards of a server without a login."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from adapters.bridge import ApprovalDoc, IncomingMessage, MessageDoc, Place
from adapters.bridge.testing import MemoryTransport
from adapters.devchat import ChatStore
from adapters.devchat.adapter import workspace_of

from .support import Rig, final_bot, message_events, post


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
    general = rig.adapter.transport.place("general", None)  # type: ignore[union-attr]
    assert await rig.harness.snapshot(MessageDoc, key=general.message_key(str(ack["message_id"]))) is not None
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
    await rig.run()
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
    await rig.run(approvers=["dave"])
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


@pytest.mark.parametrize("second_platform", [False, True])
async def test_a_devchat_user_typing_a_slack_approvers_id_cannot_approve(
    rig_factory: Callable[..., Awaitable[Rig]], second_platform: bool
) -> None:
    # Namespaced entries match only on their platform; a bare one only while a single platform runs.
    approvers = ["U0LEADSLACK", "devchat:boss"] if second_platform else ["slack:U0LEADSLACK", "devchat:boss"]
    rig = await rig_factory(approvers=approvers)
    if second_platform:
        rig.bridge.attach(MemoryTransport("slack"))
    await rig.run()
    alice, _ = await rig.hello()
    await alice.send(**post("client-0006", "@bot deploy api", channel="ops"))
    frame = await alice.until(lambda f: any(m["kind"] == "approval" for m in message_events(f)))
    gate = next(m for m in message_events(frame) if m["kind"] == "approval")["gate"]["gate_id"]
    mallory, _ = await rig.hello()
    await mallory.send(type="click", name="U0LEADSLACK", gate=gate, approve=True)
    refused = await mallory.until(lambda f: f["type"] == "notice")
    assert refused["level"] == "error" and "U0LEADSLACK is not an approver" in refused["text"]
    assert rig.runs == []
    await mallory.send(type="click", name="boss", gate=gate, approve=True)
    assert (await mallory.until(lambda f: f["type"] == "notice" and f is not refused))["level"] == "info"
    await alice.until(final_bot("Deploy finished"))
    assert rig.runs == ["api"]


@pytest.mark.parametrize("all_platforms", [False, True])
async def test_the_panel_shows_and_retries_only_devchats_own_work_unless_configured(
    rig_factory: Callable[..., Awaitable[Rig]], all_platforms: bool
) -> None:
    rig = await rig_factory(approvers=["slack:U0LEAD", "devchat:boss"])
    slack = MemoryTransport("slack")
    rig.bridge.attach(slack)
    await rig.run(all_platforms=all_platforms)
    slack_place = Place("slack", "T1", "C1")
    await rig.bridge.intake(
        IncomingMessage(slack_place, "1.1", "U0ALICE", "alice", "deploy api", mentions_bot=True)
    )
    page, _ = await rig.hello()
    await page.send(**post("client-0007", "@bot deploy api", channel="ops"))
    panel = await page.until(
        lambda f: f["type"] == "panel" and len(f["approvals"]) == (2 if all_platforms else 1)
    )
    places = sorted(a["place"] for a in panel["approvals"])
    assert places == (["#ops", "slack:C1"] if all_platforms else ["#ops"])
    slack_gate = next(
        int(key)
        for key, gate in (await rig.bridge.harness.family(ApprovalDoc)).items()
        if gate["target"]["platform"] == "slack"
    )
    assert all(t["place"] != "slack:C1" for t in panel["tasks"]) or all_platforms
    await page.send(type="retry", name="alice", task=slack_gate)
    notice = await page.until(lambda f: f["type"] == "notice")
    if all_platforms:
        assert "Retry refused: not a devchat task" not in notice["text"]
    else:
        assert notice["text"] == "Retry refused: not a devchat task"


async def test_a_click_on_a_gate_that_already_expired_says_it_expired(
    rig_factory: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await rig_factory(expires_after_ms=300)
    await rig.run()
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
    await rig.run()
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
    store = await ChatStore.open(rig.store_path)  # the place of a message there names the store
    general = Place("devchat", workspace_of("local", store.store_id), "general")
    await store.close()
    # Answered while devchat was not attached (the reply worker found no transport for the platform).
    await rig.bridge.intake(IncomingMessage(general, "1", "alice", "alice", "@bot early", mentions_bot=True))
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


async def test_with_a_token_the_page_and_the_websocket_need_it(rig: Rig) -> None:
    await rig.adapter.stop()
    token = "t0k3n-for-devchat-tests"
    adapter = await rig.start_adapter(env={"DEVCHAT_TOKEN": token})
    url = adapter.url
    async with aiohttp.ClientSession() as anonymous:
        for path in ("", "?token=wrong-token-value", "static/app.js"):
            async with anonymous.get(url + path, allow_redirects=False) as response:
                assert response.status == 401, path
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await anonymous.ws_connect(url + "ws")
        assert refused.value.status == 401
        async with anonymous.get(url + "healthz") as response:
            assert response.status == 200  # for supervisors; tells nothing about the chat
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:  # IP host
        async with browser.get(url + f"?token={token}", allow_redirects=False) as response:
            assert response.status == 303 and response.headers["Location"] == "/"
            cookie = response.cookies["devchat_token"]
            assert cookie.value == token and cookie["httponly"] and cookie["samesite"] == "Strict"
        async with browser.get(url) as page:  # the cookie carries it from here on
            assert page.status == 200 and "<html" in (await page.text()).lower()
        ws = await browser.ws_connect(url + "ws")
        await ws.send_json({"type": "hello", "cursor": None, "epoch": None})
        assert (await ws.receive_json(timeout=10))["type"] == "snapshot"
        await ws.close()


async def test_the_panel_shows_bidi_controls_in_names_as_visible_tags(rig: Rig) -> None:
    ops = Place("devchat", "local", "ops")
    await rig.bridge.intake(
        IncomingMessage(ops, "1", "eve", "\u202eyrollam", "deploy api", mentions_bot=True)
    )
    page, _ = await rig.hello()
    panel = await page.until(lambda f: f["type"] == "panel" and f["approvals"])
    assert panel["approvals"][0]["requester"] == "[U+202E]yrollam"


async def test_an_internal_failure_reaches_the_page_as_an_apology_with_an_incident_id(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    page, _ = await rig.hello()
    store: Any = rig.adapter.store

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError(5, "Input/output error", "/srv/durable-bots/var/devchat.sqlite")

    store.add_channel = broken
    await page.send(type="channel", name="alice", channel="release")
    text = (await page.until(lambda f: f["type"] == "error"))["text"]
    found = re.fullmatch(r"Sorry, that channel failed on my side \(incident ([0-9a-f]{8})\)\.", text)
    assert found is not None, text
    [logged] = [r for r in caplog.records if found.group(1) in r.getMessage()]
    assert "/srv/durable-bots/var/devchat.sqlite" in logged.getMessage()


async def test_only_the_requester_withdraws_a_request_and_the_card_says_so(
    rig_factory: Callable[..., Awaitable[Rig]],
) -> None:
    rig = await rig_factory()
    await rig.run()
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
