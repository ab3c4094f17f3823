"""Tool-call identity from OpenAI-compatible servers that do not follow the reference stream shape, driven
through the harness: whatever the wire shape, every call the model made runs once with its own arguments and
its result goes back under its own id.

Shapes seen in the wild: Ollama (and some proxies in front of Gemini or the Responses API) stream every
parallel call with `index: 0`, told apart only by their ids; some servers repeat one id for parallel calls
(`functions.forecast:0`), or send a call's id only after its first fragment, or omit `index` altogether."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness_core import Input
from harness_core.messages import AssistantMessage

from .harness_support import (
    AnthropicDialect,
    Dialect,
    OpenAIDialect,
    OpenRig,
    Script,
    stream_response,
)
from .support import sse_data, sse_events

pytestmark = pytest.mark.timeout(10)

ZURICH = {"city": "Zürich", "days": 3}
OSLO = {"city": "Oslo", "days": 10}


def results(executed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(executed, key=lambda c: c["city"])


def tool_chunks(*fragments: dict[str, Any]) -> list[bytes]:
    chunk = OpenAIDialect.chunk
    events = [sse_data(chunk({"tool_calls": [fragment]})) for fragment in fragments]
    events.append(sse_data(chunk({}, "tool_calls"), done=True))
    return events


def start(index: int | None, call_id: str | None, arguments: str = "") -> dict[str, Any]:
    fragment: dict[str, Any] = {"type": "function", "function": {"name": "forecast", "arguments": arguments}}
    if index is not None:
        fragment["index"] = index
    if call_id is not None:
        fragment["id"] = call_id
    return fragment


def more(index: int | None, arguments: str) -> dict[str, Any]:
    fragment: dict[str, Any] = {"function": {"arguments": arguments}}
    if index is not None:
        fragment["index"] = index
    return fragment


@pytest.fixture
def dialect() -> Dialect:
    return OpenAIDialect()


async def run_round(open_rig: OpenRig, script: Script, dialect: Dialect, events: list[bytes]) -> Any:
    rig = await open_rig()
    script.add(stream_response(events), stream_response(dialect.text_events("Done.")))
    settled = await (await rig.root.submit(Input("Weather in Zürich and Oslo?"))).wait()
    assert settled.status == "done"
    return rig


def sent_pairs(dialect: Dialect, body: dict[str, Any]) -> tuple[list[str], dict[str, Any], dict[str, str]]:
    """The call ids in order, arguments by call id, and result text by call id, of a captured request."""
    transcript = dialect.transcript(body)
    calls = [item for item in transcript if item[0] == "call"]
    sent = {item[1]: item[3] for item in calls}
    got = {item[1]: item[2] for item in transcript if item[0] == "result"}
    return [item[1] for item in calls], sent, got


def assert_paired(dialect: Dialect, body: dict[str, Any]) -> list[str]:
    ids, sent, got = sent_pairs(dialect, body)
    assert len(set(ids)) == 2, ids
    for call_id in ids:
        assert got[call_id] == f"{sent[call_id]['city']}: sunny for {sent[call_id]['days']} days"
    return ids


async def test_parallel_calls_that_all_use_index_0(
    open_rig: OpenRig, script: Script, dialect: Dialect
) -> None:
    events = tool_chunks(
        start(0, "call_zurich", json.dumps(ZURICH)),
        start(0, "call_oslo"),
        more(0, json.dumps(OSLO)[:9]),
        more(0, json.dumps(OSLO)[9:]),
    )
    rig = await run_round(open_rig, script, dialect, events)
    assert results(rig.executed) == [OSLO, ZURICH]
    assert assert_paired(dialect, script.requests[1]) == ["call_zurich", "call_oslo"]


async def test_parallel_calls_sharing_one_id(open_rig: OpenRig, script: Script, dialect: Dialect) -> None:
    events = tool_chunks(
        start(0, "functions.forecast:0", json.dumps(ZURICH)),
        start(1, "functions.forecast:0", json.dumps(OSLO)),
    )
    rig = await run_round(open_rig, script, dialect, events)
    assert results(rig.executed) == [OSLO, ZURICH]
    first, _second = assert_paired(dialect, script.requests[1])
    assert first == "functions.forecast:0"


async def test_id_sent_after_the_first_fragment(open_rig: OpenRig, script: Script, dialect: Dialect) -> None:
    events = tool_chunks(
        start(0, None, '{"city": '),
        start(0, "call_zurich", '"Zürich", "days": 3}'),
        start(1, None, json.dumps(OSLO)),
    )
    rig = await run_round(open_rig, script, dialect, events)
    assert results(rig.executed) == [OSLO, ZURICH]
    assert assert_paired(dialect, script.requests[1])[0] == "call_zurich"


async def test_fragments_without_index(open_rig: OpenRig, script: Script, dialect: Dialect) -> None:
    raw = json.dumps(ZURICH)
    events = tool_chunks(
        start(None, "call_zurich", raw[:5]), more(None, raw[5:]), start(None, "call_oslo", json.dumps(OSLO))
    )
    rig = await run_round(open_rig, script, dialect, events)
    assert results(rig.executed) == [OSLO, ZURICH]
    assert assert_paired(dialect, script.requests[1]) == ["call_zurich", "call_oslo"]


async def test_later_fragments_with_another_id_continue_the_call(
    open_rig: OpenRig, script: Script, dialect: Dialect
) -> None:
    # Some servers give a call's first fragment one id and its later fragments another (no name on those).
    raw = json.dumps(ZURICH)
    events = tool_chunks(
        start(0, "call_first", ""),
        {"index": 0, "id": "call_other", "function": {"arguments": raw[:6]}},
        {"index": 0, "id": "call_other", "function": {"arguments": raw[6:]}},
        start(1, "call_oslo", json.dumps(OSLO)),
    )
    rig = await run_round(open_rig, script, dialect, events)
    assert results(rig.executed) == [OSLO, ZURICH]
    assert assert_paired(dialect, script.requests[1]) == ["call_first", "call_oslo"]


async def test_id_and_name_repeated_on_every_fragment(
    open_rig: OpenRig, script: Script, dialect: Dialect
) -> None:
    zurich, oslo = json.dumps(ZURICH), json.dumps(OSLO)
    events = tool_chunks(
        start(0, "call_zurich", zurich[:7]),
        start(1, "call_oslo", oslo[:7]),
        start(0, "call_zurich", zurich[7:]),
        start(1, "call_oslo", oslo[7:]),
    )
    rig = await run_round(open_rig, script, dialect, events)
    assert results(rig.executed) == [OSLO, ZURICH]
    assert assert_paired(dialect, script.requests[1]) == ["call_zurich", "call_oslo"]


@pytest.mark.parametrize("dialect", [AnthropicDialect()], ids=["anthropic"])
async def test_anthropic_compatible_proxy_repeating_a_tool_use_id(
    open_rig: OpenRig, script: Script, dialect: Dialect
) -> None:
    # The Messages API itself rejects repeated tool_use ids; a proxy in front of another model may send them.
    events = [AnthropicDialect.start()]
    for index, arguments in enumerate([ZURICH, OSLO]):
        block = {"type": "tool_use", "id": "tooluse_1", "name": "forecast", "input": {}}
        events += [
            {"type": "content_block_start", "index": index, "content_block": block},
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": json.dumps(arguments)},
            },
            {"type": "content_block_stop", "index": index},
        ]
    events += AnthropicDialect.end("tool_use", 9)
    rig = await run_round(open_rig, script, dialect, [sse_events(e) for e in events])
    assert results(rig.executed) == [OSLO, ZURICH]
    assert assert_paired(dialect, script.requests[1])[0] == "tooluse_1"
    (calls, _answer) = await rig.assistant_entries()
    assert isinstance(calls, AssistantMessage) and len({c.id for c in calls.tool_calls()}) == 2
