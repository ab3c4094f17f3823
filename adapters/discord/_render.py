"""What approval requests look like on Discord: text, an embed with the details, and the two buttons."""

from __future__ import annotations

import json

import discord

from adapters.bridge import GateView
from adapters.bridge.text import break_fences, neutralize_bidi
from adapters.discord._markers import MARKER_COLOUR

ARGUMENTS_LIMIT = 1000  # an embed field holds at most 1024 characters

STATUS_COLOURS = {
    "pending": discord.Colour.gold(),
    "approved": discord.Colour.green(),
    "denied": discord.Colour.red(),
    "expired": MARKER_COLOUR,
    "withdrawn": MARKER_COLOUR,
}


def _timestamp(ms: int | None, style: str) -> str:
    return "" if not ms else f"<t:{ms // 1000}:{style}>"


def _arguments(gate: GateView) -> str:
    text = json.dumps(gate.arguments, indent=2, ensure_ascii=False, sort_keys=True)
    if len(text) > ARGUMENTS_LIMIT:
        text = text[: ARGUMENTS_LIMIT - 1] + "…"
    return f"```json\n{break_fences(text)}\n```"


def _name(name: str | None, default: str) -> str:
    """A person's name as plain text: display names are free text, and markdown in one (a masked link, bold
    "approved") must not render on the card."""
    return discord.utils.escape_markdown(name) if name else default


def approval_content(gate: GateView) -> str:
    tool = f"`{gate.tool}`"
    if gate.status == "pending":
        return f"⏸️ **Approval needed** to run {tool}"
    when = _timestamp(gate.decided_at, "f")
    suffix = f" · {when}" if when else ""
    if gate.status == "approved":
        return f"✅ {tool} **approved** by {_name(gate.decided_by, 'an approver')}{suffix}"
    if gate.status == "denied":
        return f"❌ {tool} **denied** by {_name(gate.decided_by, 'an approver')}{suffix}"
    if gate.status == "expired":
        return f"⌛ {tool} was not approved in time (expired){suffix}"
    if gate.status == "withdrawn":
        return f"↩️ {tool} **withdrawn** by {gate.decided_by or 'the requester'}{suffix}"
    return f"{tool}: {gate.status}"


def approval_embed(gate: GateView, footer: str) -> discord.Embed:
    embed = discord.Embed(
        title=f"{gate.tool} (request {gate.gate_id})",
        description=_arguments(gate),
        colour=STATUS_COLOURS.get(gate.status, MARKER_COLOUR),
    )
    embed.add_field(name="Requested by", value=_name(gate.requester_name, "the agent"), inline=True)
    approvers = [f"<@{a}>" if a.isdigit() else _name(a, "") for a in gate.approvers_on("discord")]
    approvers += [f"<@&{g}>" if g.isdigit() else _name(g, "") for g in gate.groups_on("discord")]
    embed.add_field(name="May approve", value=", ".join(approvers) or "nobody", inline=True)
    if gate.status == "pending":
        embed.add_field(name="Expires", value=_timestamp(gate.expires_at, "R") or "never", inline=True)
    else:
        embed.add_field(name="Decision", value=gate.status, inline=True)
    embed.set_footer(text=footer)
    return embed


def refusal_text(
    reason: str | None, status: str, decided_by: str | None, decided_at: int | None = None
) -> str:
    """The ephemeral answer to a click the bridge did not accept."""
    if reason == "not_the_requester":
        return "Only the person who asked for this can withdraw it."
    if reason == "wrong_message":
        return "This button is not on the request it names, so your click was not counted."
    if reason == "not_an_approver":
        return "You are not one of the approvers of this request, so your click was not counted."
    if reason == "self_approval":
        return "You asked for this, so someone else has to approve it."
    if reason == "already_decided":
        if status == "expired":
            return "This request has expired."
        when = _timestamp(decided_at, "t")
        return (
            f"This request was already {status}"
            + (f" by {_name(neutralize_bidi(decided_by), '')}" if decided_by else "")
            + (f" at {when}." if when else ".")
        )
    if reason == "expired":
        return "This request expired before your click."
    if reason == "unknown_gate":
        return "This approval request is unknown (it may belong to a bot whose data was removed)."
    return "Your click could not be recorded; please try again."
