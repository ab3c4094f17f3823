"""Block Kit for approval requests: a section describing the call (who asked, who may approve, until when),
Approve/Deny buttons and a Withdraw button for the requester that encode the gate id, and the decided form
(who, when) without buttons.

Limits (Slack): section text 3,000 characters, button `action_id` 255 and `value` 2,000, `block_id` 255.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from adapters.bridge import GateView
from adapters.bridge.approvals import Action
from adapters.bridge.text import break_fences
from adapters.slack.safe_text import slack_text

ACTION_PREFIX = "durable_bots_gate"
ACTION_PATTERN = re.compile(rf"^{ACTION_PREFIX}:(approve|deny|withdraw):(\d+)$")
SECTION_LIMIT = 3000
ARGUMENTS_LIMIT = 1500


def action_id(verb: str, gate_id: int) -> str:
    return f"{ACTION_PREFIX}:{verb}:{gate_id}"


def parse_action(action_id_value: str) -> tuple[Action, int] | None:
    """(approve | deny | withdraw, gate id) from a button's action_id, or None if it is not one of ours."""
    found = ACTION_PATTERN.match(action_id_value)
    if found is None:
        return None
    verb: Action = "approve" if found.group(1) == "approve" else "deny"
    if found.group(1) == "withdraw":
        verb = "withdraw"
    return verb, int(found.group(2))


def slack_date(ms: int | None) -> str:
    """A Slack date token (shown in the reader's time zone) with an ISO fallback."""
    if not ms:
        return "unknown time"
    seconds = int(ms // 1000)
    iso = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{seconds}^{{date_short_pretty}} at {{time}}|{iso}>"


def _escape(text: str) -> str:
    return slack_text(text)


def _arguments(gate: GateView) -> str:
    rendered = json.dumps(gate.arguments, ensure_ascii=False, sort_keys=True, indent=1)
    if len(rendered) > ARGUMENTS_LIMIT:
        rendered = rendered[: ARGUMENTS_LIMIT - 1] + "…"
    return break_fences(_escape(rendered))  # an argument cannot end the card's code block


def _requester(gate: GateView) -> str:
    if gate.requester_id:
        return f"<@{gate.requester_id}>"
    return _escape(gate.requester_name or "a scheduled run")


def _approvers(gate: GateView) -> str:
    people = [
        f"<@{a}>" if re.fullmatch(r"[UW][A-Z0-9]+", a) else _escape(a) for a in gate.approvers_on("slack")
    ]
    groups = [
        f"<!subteam^{g}>" if re.fullmatch(r"S[A-Z0-9]+", g) else _escape(g) for g in gate.groups_on("slack")
    ]
    return ", ".join([*people, *groups]) or "nobody"


def describe(gate: GateView) -> str:
    text = (
        f"*Approval needed (#{gate.gate_id}):* `{_escape(gate.tool)}`\n"
        f"*Requested by:* {_requester(gate)}\n"
        f"*May approve:* {_approvers(gate)}\n"
        f"*Arguments:*\n```{_arguments(gate)}```"
    )
    return text[:SECTION_LIMIT]


def outcome(gate: GateView) -> str:
    who = _escape(gate.decided_by or "an approver")
    if gate.status == "approved":
        return f":white_check_mark: Approved by {who} at {slack_date(gate.decided_at)}"
    if gate.status == "denied":
        return f":x: Denied by {who} at {slack_date(gate.decided_at)}"
    if gate.status == "withdrawn":
        return f":leftwards_arrow_with_hook: Withdrawn by {who} at {slack_date(gate.decided_at)} (not run)"
    if gate.status == "expired":
        return f":hourglass: Expired at {slack_date(gate.decided_at or gate.expires_at)} (not run)"
    return f"Status: {_escape(gate.status)}"


def fallback_text(gate: GateView) -> str:
    if gate.status == "pending":
        return slack_text(
            f"Approval needed: {gate.tool} (requested by {gate.requester_name or 'a scheduled run'})"
        )
    return f"{slack_text(gate.tool)}: {outcome(gate)}"


def approval_blocks(gate: GateView) -> list[dict[str, Any]]:
    section: dict[str, Any] = {
        "type": "section",
        "block_id": f"{ACTION_PREFIX}_text_{gate.gate_id}",
        "text": {"type": "mrkdwn", "text": describe(gate)},
    }
    if gate.status != "pending":
        return [
            section,
            {
                "type": "context",
                "block_id": f"{ACTION_PREFIX}_outcome_{gate.gate_id}",
                "elements": [{"type": "mrkdwn", "text": outcome(gate)}],
            },
        ]
    return [
        section,
        {
            "type": "context",
            "block_id": f"{ACTION_PREFIX}_expiry_{gate.gate_id}",
            "elements": [{"type": "mrkdwn", "text": f"Expires {slack_date(gate.expires_at)}"}],
        },
        {
            "type": "actions",
            "block_id": f"{ACTION_PREFIX}_actions_{gate.gate_id}",
            "elements": [
                {
                    "type": "button",
                    "action_id": action_id("approve", gate.gate_id),
                    "text": {"type": "plain_text", "text": "Approve"},
                    "style": "primary",
                    "value": str(gate.gate_id),
                },
                {
                    "type": "button",
                    "action_id": action_id("deny", gate.gate_id),
                    "text": {"type": "plain_text", "text": "Deny"},
                    "style": "danger",
                    "value": str(gate.gate_id),
                },
                {
                    "type": "button",
                    "action_id": action_id("withdraw", gate.gate_id),
                    "text": {"type": "plain_text", "text": "Withdraw (requester)"},
                    "value": str(gate.gate_id),
                },
            ],
        },
    ]
