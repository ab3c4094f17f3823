"""System prompt planning: only changes become `core.system` entries, so provider prompt caches stay warm.

The effective prompt and tool set are the replay of every system patch in the active context. Preparation
renders the desired sections and tools and appends a patch only when something differs. After a head marker
(reset or compaction) with no system entry after it, the patch is a complete baseline that omits the earlier
system entries.
"""

from __future__ import annotations

import inspect
from typing import Any

from harness_core.agent import ResolvedAgent
from harness_core.context import ContextView, replay_system
from harness_core.extensions import PromptInput
from harness_core.messages import SystemMessage
from harness_core.records import CORE_SYSTEM, ContextEdit, EntryDraft


async def render_sections(
    agent: ResolvedAgent, conversation_id: int, env: Any, report: Any
) -> dict[str, str] | None:
    """Render the agent's sections in order; None means a renderer failed (keep what was shown)."""
    prompt = PromptInput(conversation_id=conversation_id, agent=agent, env=env)
    rendered: dict[str, str] = {}
    for contributed in agent.sections:
        try:
            text = contributed.render(prompt)
            if inspect.isawaitable(text):
                text = await text
        except Exception as exc:
            report(exc)
            return None
        if text is None:
            continue
        text = str(text)
        rendered[contributed.key] = (
            f"<{contributed.key}>\n{text}\n</{contributed.key}>" if contributed.tag else text
        )
    return rendered


def plan_system(
    view: ContextView, agent: ResolvedAgent, desired_sections: dict[str, str] | None
) -> list[EntryDraft]:
    """The `core.system` entries to append before the next request (usually none)."""
    shown = replay_system(view.messages)
    desired_tools = [t.declaration() for t in agent.tools]
    sections = desired_sections if desired_sections is not None else dict(shown.sections)
    head = view.head
    if head is not None and not any(e.kind == CORE_SYSTEM and e.id > head.id for e in view.entries):
        omit = [ContextEdit(target=e.id, action="omit") for e in view.entries if e.kind == CORE_SYSTEM]
        baseline = SystemMessage(sections=dict(sections), tools_added=desired_tools)
        return [EntryDraft(kind=CORE_SYSTEM, model=[baseline], edits=omit or None)]

    shown_keys = list(shown.sections)
    common = [k for k in shown_keys if k in sections]
    desired_order = [k for k in sections if k in shown.sections]
    drafts: list[EntryDraft] = []
    patch_sections: dict[str, str | None] = {}
    if common != desired_order:
        drafts.append(EntryDraft(kind=CORE_SYSTEM, model=[SystemMessage(sections=dict.fromkeys(shown_keys))]))
        patch_sections = dict(sections)
    else:
        for key in shown_keys:
            if key not in sections:
                patch_sections[key] = None
        for key, text in sections.items():
            if shown.sections.get(key) != text:
                patch_sections[key] = text

    shown_tools = {t.name: t for t in shown.tools}
    desired_names = [t.name for t in desired_tools]
    removed = [name for name in shown_tools if name not in desired_names]
    added = [t for t in desired_tools if shown_tools.get(t.name) != t]
    remaining = [name for name in shown_tools if name not in removed and name not in {t.name for t in added}]
    if remaining + [t.name for t in added] != desired_names:
        # Appending would not give the desired order: re-offer every tool in order.
        removed = list(shown_tools)
        added = desired_tools
    else:
        removed = removed + [t.name for t in added if t.name in shown_tools]
    if patch_sections or removed or added:
        drafts.append(
            EntryDraft(
                kind=CORE_SYSTEM,
                model=[SystemMessage(sections=patch_sections, tools_added=added, tools_removed=removed)],
            )
        )
    return drafts
