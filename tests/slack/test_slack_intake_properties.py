"""Property tests of the Slack adapter's intake: arbitrary event and interaction bodies, signed, through the real
HTTP endpoint (slack-bolt request handling included) and as Socket Mode envelopes. Every one is acknowledged or
refused with a log line (200, or 400 with `X-Slack-No-Retry: 1`), never a 500 that makes Slack retry, and the
adapter keeps taking in: a valid message afterwards is answered once. One adapter per test, many examples."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.bridge import Bridge, MessageDoc
from adapters.slack import SlackAdapter, create
from adapters.slack.testing import FakeSlack
from harness_core import AgentChange, Harness, ModelRef, Models, Registry
from harness_core.messages import UserMessage, user_text
from harness_core.models.faux import FauxProvider, faux_assistant
from harness_core.storage import MemoryStorage

pytestmark = pytest.mark.timeout(180)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["\ud83d", "\udfff", "\u202e\u2066", "x" * 20_000, "", "1700000000.000100"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
seq = itertools.count(1)  # message ts and event ids: unique across every strategy of the module
texts = st.text(max_size=40) | st.sampled_from(["\ud83d broken", "\u202eevil\u202c", "a" * 40_000])


def last_user_text(request: Any) -> str:
    return [user_text(m) for m in request.messages if isinstance(m, UserMessage)][-1]


@dataclass
class Rig:
    fake: FakeSlack
    harness: Harness
    bridge: Bridge
    adapter: SlackAdapter
    faux: FauxProvider


@asynccontextmanager
async def open_rig(fake: FakeSlack, mode: str) -> AsyncIterator[Rig]:
    faux = FauxProvider()
    faux.set_responder(lambda r: faux_assistant("answered: " + last_user_text(r)[-40:]))
    registry = Registry()
    harness = await Harness.open(await MemoryStorage.open(), models=Models(faux), registry=registry)
    bridge = Bridge(harness, agent=AgentChange(model=ModelRef(provider="faux", model_id="m")))
    registry.install(bridge.extension())
    adapter = create(
        {
            "mode": mode,
            "port": 0,
            "catch_up": False,
            "lookup_timeout": 0.5,
            "edit_interval": 0.0,
            "stream": False,
        },
        fake.env,
    )
    await bridge.start()
    await adapter.start(bridge)
    harness.resume()
    if adapter.url is not None:
        fake.request_url = adapter.url
    try:
        yield Rig(fake, harness, bridge, adapter, faux)
    finally:
        await adapter.stop()
        await bridge.stop()
        await harness.close()


def bodies(fake: FakeSlack, channel: str, user: str) -> st.SearchStrategy[dict[str, Any]]:
    """Real-looking events and clicks with a few fields replaced by anything, or dropped."""

    def mutate(draw: Any, template: dict[str, Any], extra: list[str]) -> dict[str, Any]:
        keys = sorted({*template, *extra})
        changed = draw(st.dictionaries(st.sampled_from(keys), json_values, max_size=2))
        dropped = draw(st.lists(st.sampled_from(keys), max_size=1))
        result = {**template, **changed}
        for key in dropped:
            result.pop(key, None)
        return result

    @st.composite
    def callback(draw: Any) -> dict[str, Any]:
        text = draw(texts)
        event = {
            "type": draw(st.sampled_from(["message", "app_mention"])),
            "channel": channel,
            "user": user,
            "ts": f"{1_700_000_000 + next(seq)}.000100",
            "text": f"<@{fake.bot_user_id}> {text}" if draw(st.booleans()) else text,
            "channel_type": "channel",
        }
        if draw(st.booleans()):
            event = mutate(draw, event, ["thread_ts", "subtype", "blocks", "bot_id", "hidden"])
        body = {
            "type": "event_callback",
            "team_id": fake.team_id,
            "api_app_id": fake.app_id,
            "event_id": f"Ev{next(seq)}",
            "event": event,
        }
        return (
            mutate(draw, body, ["authorizations", "enterprise_id", "event_time"])
            if draw(st.booleans())
            else body
        )

    @st.composite
    def click(draw: Any) -> dict[str, Any]:
        action = {
            "action_id": draw(
                st.sampled_from(["durable_bots_gate:approve:5", "durable_bots_gate:deny:99999999999"])
            ),
            "type": "button",
            "value": "x",
        }
        if draw(st.booleans()):
            action = mutate(draw, action, ["block_id"])
        body = {
            "type": "block_actions",
            "user": {"id": user, "name": draw(texts)},
            "team": {"id": fake.team_id},
            "channel": {"id": channel},
            "container": {"type": "message", "channel_id": channel, "message_ts": "1.2"},
            "actions": [action],
            "response_url": "not a url",
        }
        return mutate(draw, body, ["trigger_id", "message"]) if draw(st.booleans()) else body

    return callback() | click()


async def test_arbitrary_signed_http_bodies_are_answered_200_or_400_and_intake_goes_on() -> None:
    async with FakeSlack(mode="http", ack_timeout=10.0) as fake:
        general = fake.add_channel("general")
        alice = fake.add_user("UALICE", name="alice")
        async with open_rig(fake, "http") as rig:
            sent: list[tuple[bytes, str]] = []

            @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            @given(
                st.one_of(
                    bodies(fake, general.id, alice.id).map(
                        lambda b: (json.dumps(b).encode(), "application/json")
                    ),
                    bodies(fake, general.id, alice.id).map(
                        lambda b: (
                            ("payload=" + quote(json.dumps(b))).encode(),
                            "application/x-www-form-urlencoded",
                        )
                    ),
                    json_values.map(lambda v: (json.dumps(v).encode(), "application/json")),
                    st.binary(max_size=60).map(lambda b: (b, "application/json")),
                    json_values.map(
                        lambda v: (
                            ("payload=" + quote(json.dumps(v))).encode(),
                            "application/x-www-form-urlencoded",
                        )
                    ),
                )
            )
            def one(example: tuple[bytes, str]) -> None:
                sent.append(example)

            one()
            for body, content_type in sent:
                result = await fake.post_to_app(body, content_type=content_type)
                assert result.status in (200, 400), (body[:300], result)
                if result.status == 400:
                    assert result.headers.get("x-slack-no-retry") == "1", (body[:300], result)
            await still_taking_in(rig, general, alice)


async def test_arbitrary_socket_mode_envelopes_are_acknowledged_and_intake_goes_on() -> None:
    async with FakeSlack(ack_timeout=10.0) as fake:
        general = fake.add_channel("general")
        alice = fake.add_user("UALICE", name="alice")
        async with open_rig(fake, "socket") as rig:
            sent: list[tuple[str, dict[str, Any]]] = []

            @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            @given(
                st.one_of(
                    bodies(fake, general.id, alice.id).map(lambda b: ("events_api", b)),
                    bodies(fake, general.id, alice.id).map(lambda b: ("interactive", b)),
                    st.dictionaries(st.text(max_size=6), json_values, max_size=4).map(
                        lambda b: ("events_api", b)
                    ),
                )
            )
            def one(example: tuple[str, dict[str, Any]]) -> None:
                sent.append(example)

            one()
            for index, (kind, payload) in enumerate(sent):
                envelope = {
                    "envelope_id": f"env-{index}",
                    "type": kind,
                    "payload": json.loads(json.dumps(payload)),
                }
                attempt = await fake.deliver(envelope)
                assert await attempt.wait_settled(10) == "acked", (payload, attempt)
            await still_taking_in(rig, general, alice)


async def still_taking_in(rig: Rig, general: Any, alice: Any) -> None:
    fake = rig.fake
    post = await fake.user_posts(general, alice, f"<@{fake.bot_user_id}> sentinel")
    await post.wait_acked()
    await fake.wait_for_message(general, contains="sentinel", timeout=15)
    assert not rig.harness.closed.done()
    sentinels = [m for m in fake.bot_messages(general) if "sentinel" in m.text]
    assert len(sentinels) == 1
    taken_in = await rig.harness.family(MessageDoc)
    assert len(taken_in) >= 5  # the search reached the bridge, not only the endpoint's checks
