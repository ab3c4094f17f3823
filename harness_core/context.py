"""What the model sees: a pure function from stored entries to provider messages (DESIGN.md §2.4).

The caller passes the newest head marker at or before the cutoff and the visible entries from that marker's
`head` through the cutoff (fork-aware, ascending). Nothing here reads storage, so the cost is the size of the
active context, never the size of the history.

Rules, in order:
1. Edits in the range apply to their targets; for each target the newest edit wins (`omit` removes the
   target's messages, `replace` substitutes them).
2. The context is the head marker followed by the range's entries that are not head markers.
3. Entries without messages, and assistant messages that ended `aborted` or `error`, are excluded.
4. Tool results move directly after the assistant message that called them, in call order; results with no
   matching call are dropped; a call without a result gets a synthesized error result.
5. A system message preceded only by user messages moves to the front.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness_core.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    TextContent,
    ToolDeclaration,
    ToolResultMessage,
    UserMessage,
)
from harness_core.records import ContextEdit, Entry

MISSING_RESULT_TEXT = (
    "No result was recorded for this tool call: the run was interrupted or the conversation was forked "
    "before it finished."
)


@dataclass
class ContextView:
    head: Entry | None
    entries: list[Entry]  # the active entries (marker first, then non-marker entries)
    contributions: list[list[Message]]  # per entry, after edits and exclusions, before reordering
    messages: list[Message] = field(default_factory=list)  # the final model context
    # What `extend_context` needs to append entries without deriving again (None: derive whole).
    edits: dict[int, ContextEdit] | None = field(default=None, repr=False, compare=False)
    open_calls: bool = field(default=False, repr=False, compare=False)  # the last assistant awaits results


def derive_context(head: Entry | None, entries: list[Entry]) -> ContextView:
    """Derive the model context from the newest head marker and the visible entries of its range."""
    edits: dict[int, ContextEdit] = {}
    for entry in entries:
        for edit in entry.edits or ():
            edits[edit.target] = edit  # ascending order: a newer edit overwrites an older one
    if head is not None:
        for edit in head.edits or ():
            edits.setdefault(edit.target, edit)
        active = [head, *(e for e in entries if e.head is None)]
    else:
        active = [e for e in entries if e.head is None]

    contributions = [_contribution(entry, edits) for entry in active]
    flat = [m for group in contributions for m in group]
    paired, open_calls = _pair(flat)
    return ContextView(
        head=head,
        entries=active,
        contributions=contributions,
        messages=_system_to_front(paired),
        edits=edits,
        open_calls=open_calls,
    )


def extend_context(view: ContextView, added: list[Entry]) -> ContextView | None:
    """The view of `view`'s range followed by `added` (newer entries of the same range), derived from the new
    entries only; None when that could differ from deriving the whole range (then derive it).

    Appending is exact when the new entries carry no head marker and no edits (edits may change earlier
    contributions), when no tool call of the view's last assistant still waits for a result (a new result
    would move back to it), and when the view already holds a message other than a user message (rule 5 has
    decided within it). Then every rule gives the old messages followed by the new entries' own."""
    if view.edits is None or view.open_calls:
        return None
    if any(entry.head is not None or entry.edits for entry in added):
        return None
    if all(isinstance(message, UserMessage) for message in view.messages):
        return None
    contributions = [_contribution(entry, view.edits) for entry in added]
    paired, open_calls = _pair([m for group in contributions for m in group])
    return ContextView(
        head=view.head,
        entries=[*view.entries, *added],
        contributions=[*view.contributions, *contributions],
        messages=[*view.messages, *paired],
        edits=view.edits,
        open_calls=open_calls,
    )


def _contribution(entry: Entry, edits: dict[int, ContextEdit]) -> list[Message]:
    messages = list(entry.model or ())
    found = edits.get(entry.id)
    if found is not None:
        messages = [] if found.action == "omit" else list(found.messages or ())
    return [m for m in messages if _included(m)]


def _included(message: Message) -> bool:
    return not (isinstance(message, AssistantMessage) and message.stop_reason in ("aborted", "error"))


def _arrange(messages: list[Message]) -> list[Message]:
    return _system_to_front(_pair(messages)[0])


def _pair(messages: list[Message]) -> tuple[list[Message], bool]:
    """Rule 4. Also says whether the last assistant message has a call without a result."""
    out: list[Message] = []
    # Pair each result with the nearest preceding assistant that called it, if no other assistant came between.
    # Pairs are per assistant message: some models number call ids per turn, so an id repeats across turns.
    results_for: dict[int, dict[str, ToolResultMessage]] = {}
    current: dict[str, ToolResultMessage] | None = None
    pending_calls: set[str] = set()
    for position, message in enumerate(messages):
        if isinstance(message, AssistantMessage):
            current = results_for.setdefault(position, {})
            pending_calls = {call.id for call in message.tool_calls()}
        elif (
            isinstance(message, ToolResultMessage)
            and current is not None
            and message.tool_call_id in pending_calls
        ):
            current[message.tool_call_id] = message
            pending_calls.discard(message.tool_call_id)
    for position, message in enumerate(messages):
        if isinstance(message, ToolResultMessage):
            # Placed after its call (below), or an orphan with no call to follow: dropped either way.
            continue
        out.append(message)
        if isinstance(message, AssistantMessage):
            paired = results_for.get(position, {})
            for call in message.tool_calls():
                result = paired.pop(call.id, None)
                if result is not None:
                    out.append(result)
                else:
                    out.append(
                        ToolResultMessage(
                            tool_call_id=call.id,
                            tool_name=call.name,
                            content=[TextContent(text=MISSING_RESULT_TEXT)],
                            is_error=True,
                            timestamp=message.timestamp,
                        )
                    )
    return out, bool(pending_calls)


def _system_to_front(messages: list[Message]) -> list[Message]:
    for position, message in enumerate(messages):
        if isinstance(message, SystemMessage):
            if position and all(isinstance(m, UserMessage) for m in messages[:position]):
                return [message, *messages[:position], *messages[position + 1 :]]
            return messages
        if not isinstance(message, UserMessage):
            return messages
    return messages


@dataclass
class PromptState:
    """The system prompt sections and tools that the context's system messages add up to."""

    sections: dict[str, str] = field(default_factory=dict)
    tools: list[ToolDeclaration] = field(default_factory=list)

    def system_prompt(self) -> str:
        return "\n\n".join(text for text in self.sections.values() if text)


def replay_system(messages: list[Message]) -> PromptState:
    """Replay positional system patches into the effective sections and offered tools."""
    state = PromptState()
    for message in messages:
        if not isinstance(message, SystemMessage):
            continue
        for key, text in message.sections.items():
            if text is None:
                state.sections.pop(key, None)
            else:
                state.sections[key] = text
        if message.tools_removed:
            removed = set(message.tools_removed)
            state.tools = [t for t in state.tools if t.name not in removed]
        for tool in message.tools_added:
            state.tools = [t for t in state.tools if t.name != tool.name]
            state.tools.append(tool)
    return state


def provider_messages(messages: list[Message]) -> list[Message]:
    """The context without positional system messages (they travel as the request's system prompt)."""
    return [m for m in messages if not isinstance(m, SystemMessage)]
