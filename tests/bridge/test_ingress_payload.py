"""Ingress payloads (issue 16): a message or click committed by one worker reads back the same in its owner,
through strict JSON (UTF-8 bytes, as the store keeps them). Anything else a record may hold (a lone surrogate,
a wrong type, a missing field, another version) comes back as valid text or is refused with an
`IngressPayloadError` naming the field: never another exception, which would stop the consumer."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.bridge import ClickOrigin, IncomingMessage, IngressPayloadError, Place, valid_text
from adapters.bridge.ingress import (
    Click,
    click_from_payload,
    click_payload,
    message_from_payload,
    message_payload,
)

# Any code point, lone surrogates included (what a platform's JSON escapes can decode to).
TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=40)
OPTIONAL = st.none() | TEXT
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


def read_or_refusal(read: Callable[[Any], Any], payload: Any) -> tuple[Any, str | None]:
    try:
        return read(payload), None
    except IngressPayloadError as exc:
        return None, str(exc)


def stored(payload: dict[str, Any]) -> Any:
    """Through the store: strict JSON, as UTF-8 bytes."""
    return json.loads(json.dumps(payload, allow_nan=False, ensure_ascii=False).encode("utf-8"))


@st.composite
def messages(draw: st.DrawFn) -> IncomingMessage:
    place = Place(draw(st.sampled_from(["slack", "discord"])), draw(TEXT), draw(TEXT), draw(OPTIONAL))
    return IncomingMessage(
        place,
        draw(TEXT),
        draw(TEXT),
        draw(TEXT),
        draw(TEXT),
        mentions_bot=draw(st.booleans()),
        is_dm=draw(st.booleans()),
        reply_to=draw(OPTIONAL),
    )


@st.composite
def clicks(draw: st.DrawFn) -> Click:
    groups = draw(st.none() | st.lists(TEXT, max_size=3))
    origin = draw(st.none() | st.builds(ClickOrigin, TEXT, TEXT))
    return Click(
        draw(st.integers(min_value=0, max_value=2**63 - 1)),
        draw(TEXT),
        draw(TEXT),
        draw(st.sampled_from(["approve", "deny", "withdraw"])),
        None if groups is None else tuple(groups),
        origin,
        draw(OPTIONAL),
        draw(st.booleans()),
    )


@settings(max_examples=150, deadline=None)
@given(messages())
def test_a_message_reads_back_exactly_as_it_was_committed(message: IncomingMessage) -> None:
    assert message_from_payload(stored(message_payload(message))) == message


@settings(max_examples=100, deadline=None)
@given(clicks())
def test_a_click_reads_back_with_valid_text(click: Click) -> None:
    # Text from the platform is made valid by the router before the click is written (as decide does).
    valid = Click(
        click.gate_id,
        valid_text(click.user_id),
        valid_text(click.user_name),
        click.action,
        None if click.user_groups is None else tuple(valid_text(g) for g in click.user_groups),
        None
        if click.origin is None
        else ClickOrigin(valid_text(click.origin.channel), valid_text(click.origin.message_id)),
        None if click.platform is None else valid_text(click.platform),
        click.operator,
    )
    assert click_from_payload(stored(click_payload(valid))) == valid


@settings(max_examples=150, deadline=None)
@given(
    messages(), st.sampled_from(["place", "message_id", "user_id", "text", "is_dm", "reply_to", "v"]), JSON
)
def test_a_damaged_message_record_is_valid_text_or_refused_by_name(
    message: IncomingMessage, field: str, value: Any
) -> None:
    payload = message_payload(message)
    payload[field] = value
    read, refusal = read_or_refusal(message_from_payload, payload)
    if refusal is not None:
        assert field in refusal or (field == "v" and "version" in refusal)
        return
    for text in (read.message_id, read.user_id, read.user_name, read.text, read.place.key):
        text.encode("utf-8")  # never a lone surrogate


@settings(max_examples=150, deadline=None)
@given(
    clicks(), st.sampled_from(["gate_id", "action", "user_groups", "origin", "operator", "user_name"]), JSON
)
def test_a_damaged_click_record_is_valid_text_or_refused_by_name(
    click: Click, field: str, value: Any
) -> None:
    payload = click_payload(click)
    payload[field] = value
    read, refusal = read_or_refusal(click_from_payload, payload)
    if refusal is not None:
        assert field in refusal
        return
    read.user_name.encode("utf-8")
    for group in read.user_groups or ():
        group.encode("utf-8")


@pytest.mark.parametrize("payload", [None, [], "x", 3, {"v": 1}])
def test_a_record_that_is_not_an_object_or_is_empty_is_refused(payload: Any) -> None:
    for read in (message_from_payload, click_from_payload):
        with pytest.raises(IngressPayloadError):
            read(payload)
