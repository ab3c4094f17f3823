"""Persistent approval buttons.

Every state a click needs is in the button's ``custom_id`` (``durable-bots:approve:<gate>`` /
``durable-bots:deny:<gate>`` / ``durable-bots:withdraw:<gate>``) and in storage, so a button posted by an earlier process works in this one:
`ApprovalButton` is a `DynamicItem` registered in ``setup_hook`` on every start, and discord.py routes any
click whose ``custom_id`` matches its template to it, whatever message it is on.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import discord

CUSTOM_ID_PREFIX = "durable-bots"
TEMPLATE = re.compile(rf"{CUSTOM_ID_PREFIX}:(?P<action>approve|deny|withdraw):(?P<gate>[0-9]{{1,20}})")


def custom_id(action: str, gate_id: int) -> str:
    return f"{CUSTOM_ID_PREFIX}:{action}:{gate_id}"


class ClickHandler(Protocol):
    async def handle_click(
        self, interaction: discord.Interaction[Any], gate_id: int, action: str
    ) -> None: ...


class ApprovalButton(discord.ui.DynamicItem[discord.ui.Button[discord.ui.View]], template=TEMPLATE):
    def __init__(self, action: str, gate_id: int) -> None:
        label, style = {
            "approve": ("Approve", discord.ButtonStyle.success),
            "deny": ("Deny", discord.ButtonStyle.danger),
        }.get(action, ("Withdraw (requester)", discord.ButtonStyle.secondary))
        super().__init__(discord.ui.Button(label=label, style=style, custom_id=custom_id(action, gate_id)))
        self.action = action
        self.gate_id = gate_id

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction[Any], item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> ApprovalButton:
        return cls(match["action"], int(match["gate"]))

    async def callback(self, interaction: discord.Interaction[Any]) -> None:
        # No interaction_check: a refused click must still be answered (ephemerally), which the handler does.
        handler: ClickHandler | None = getattr(interaction.client, "click_handler", None)
        if handler is None:
            return
        await handler.handle_click(interaction, self.gate_id, self.action)


def approval_view(gate_id: int) -> discord.ui.View:
    view = discord.ui.View(timeout=None)
    view.add_item(ApprovalButton("approve", gate_id))
    view.add_item(ApprovalButton("deny", gate_id))
    view.add_item(ApprovalButton("withdraw", gate_id))
    return view
