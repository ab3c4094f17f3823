"""Bidi controls (U+202A-U+202E, U+2066-U+2069) in tool arguments or names never reach a card as controls: every
platform renders approval cards from `GateView`, which shows them as visible `[U+202E]` tags."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.bridge import GateView
from adapters.bridge.text import neutralize_bidi
from adapters.devchat.transport import gate_json, gate_text
from adapters.discord._render import approval_content, approval_embed
from adapters.slack.blocks import approval_blocks, fallback_text

CONTROLS = [chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))]


def gate(**changes: object) -> GateView:
    fields: dict[str, object] = {
        "gate_id": 3,
        "tool": "deploy",
        "arguments": {"service": "api\u202e;tsoh-lave", "\u2067note": ["a\u2066b"]},
        "requester_id": None,
        "requester_name": "\u202eyrollam",
        "status": "approved",
        "decided_by": "lead\u2069",
        "decided_at": 1_700_000_000_000,
        "expires_at": 1_700_000_600_000,
    }
    fields.update(changes)
    return GateView(**fields)  # type: ignore[arg-type]


def rendered_everywhere(view: GateView) -> str:
    embed = approval_embed(view, "footer").to_dict()
    return "\n".join(
        [
            json.dumps(approval_blocks(view), ensure_ascii=False),
            fallback_text(view),
            approval_content(view),
            json.dumps(embed, ensure_ascii=False),
            gate_text(view),
            json.dumps(gate_json(view), ensure_ascii=False),
        ]
    )


def test_cards_on_every_platform_show_bidi_controls_as_visible_tags() -> None:
    for status in ("pending", "approved"):
        text = rendered_everywhere(gate(status=status))
        assert not any(control in text for control in CONTROLS)
    view = gate()
    assert view.requester_name == "[U+202E]yrollam" and view.decided_by == "lead[U+2069]"
    assert view.arguments == {"service": "api[U+202E];tsoh-lave", "[U+2067]note": ["a[U+2066]b"]}
    assert "[U+202E]yrollam" in gate_text(gate(status="pending"))


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from([*CONTROLS, "a", "b", " ", "é", "\u05d0"]), max_size=30))
def test_neutralized_text_has_no_control_and_keeps_everything_else(text: str) -> None:
    shown = neutralize_bidi(text)
    assert not any(control in shown for control in CONTROLS)
    assert [c for c in shown if c in "abé \u05d0"] == [c for c in text if c not in CONTROLS]


def test_refusals_that_name_the_decider_show_bidi_controls_as_tags() -> None:
    from adapters.bridge import Decision
    from adapters.discord._render import refusal_text as discord_refusal
    from adapters.slack.adapter import refusal_text as slack_refusal

    for text in (
        discord_refusal("already_decided", "approved", "lead\u202eyrollam"),
        slack_refusal(Decision(False, "approved", "lead\u202eyrollam", "already_decided"), "deploy"),
    ):
        assert "lead[U+202E]yrollam" in text and "\u202e" not in text


def test_arguments_cannot_close_the_cards_code_block_and_names_carry_no_markdown() -> None:
    """A tool argument holding ``` would end the card's code block early, and what follows would render as
    markdown: a masked link or a bold "approved by lead" on Discord, forged formatting on Slack. Discord names
    (display names are free text) are shown without markdown too."""
    forged = "x```\n**Approved by lead** [runbook](https://evil.example)\n```"
    view = gate(status="pending", arguments={"note": forged}, requester_name="[lead](https://evil.example)")
    embed = approval_embed(view, "footer")
    assert embed.description is not None and embed.description.count("```") == 2  # only the card's own fence
    slack_section = approval_blocks(view)[0]["text"]["text"]
    assert slack_section.count("```") == 2
    requested_by = embed.fields[0].value or ""
    unescaped = re.compile(r"(?<!\\)(\[lead\]\(|\[x\]\(|\*\*lead)")
    assert not unescaped.search(requested_by) and "lead" in requested_by
    decided = approval_content(gate(decided_by="**lead** [x](https://evil.example)"))
    assert not unescaped.search(decided) and "lead" in decided
