"""Turning harness state into chat text: answers, streaming partials with tool status, long-text splitting."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable, Mapping
from typing import Any

FENCE = "```"
_BACKTICK_RUN = re.compile(r"`(?=`)")
# Bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069): in a tool argument or a name
# they reorder the text around them on a card ("asked by mallory" shown reversed), so they are never rendered.
_BIDI_CONTROLS = {code: f"[U+{code:04X}]" for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def neutralize_bidi(text: str) -> str:
    """`text` with every bidi control replaced by a visible `[U+202E]`-style tag (an approver sees that
    something tried to reorder the text, instead of the reordered text)."""
    return text.translate(_BIDI_CONTROLS)


def break_fences(text: str) -> str:
    """`text` safe inside a ``` code block: a zero-width space after every backtick that another follows, so
    text quoted on a card (tool arguments) cannot close the card's block and have the rest render as markdown."""
    return _BACKTICK_RUN.sub("`\u200b", text)


def neutralize_value(value: Any) -> Any:
    """`neutralize_bidi` applied to every string (keys included) inside JSON-like `value`."""
    if isinstance(value, str):
        return neutralize_bidi(value)
    if isinstance(value, dict):
        return {neutralize_value(k): neutralize_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [neutralize_value(v) for v in value]
    return value


def split_text(text: str, limit: int, measure: Callable[[str], int] = len) -> list[str]:
    """Split into parts of at most `limit` characters on safe boundaries: paragraph, line, then word. A part
    never ends inside a code fence: an open fence is closed and reopened in the next part.

    `measure` is a part's length as the platform counts it (Slack escapes `&<>`, which grows the text); it must
    grow with every character added, as an escaping that works character by character does."""
    if limit < 16:
        raise ValueError("limit too small")
    parts: list[str] = []
    rest = text
    while measure(rest) > limit:
        budget = _fitting(rest, limit - len(FENCE) - 1, measure)  # room to close a fence
        # A part that reopened a fence must carry more than the reopening line, or the next part would be
        # the same again (a loop that never ends, growing the list of parts).
        floor = len(rest.split("\n", 1)[0]) + 1 if rest.startswith(FENCE) else 0
        if floor >= budget:  # the opening line alone is too long: cut inside it (it is reopened bare)
            floor = 0
        cut = _best_cut(rest, budget, floor)
        head, rest = rest[:cut], rest[cut:]
        if head.count(FENCE) % 2 == 1:
            opener = head[head.rfind(FENCE) :].split("\n", 1)[0]  # e.g. ```python
            if len(opener) > limit // 4:  # not a language tag: reopening with it could leave no room
                opener = FENCE
            head = head.rstrip("\n") + "\n" + FENCE
            rest = opener + "\n" + rest.lstrip("\n")
        parts.append(head.rstrip())
        rest = rest.lstrip("\n") if not rest.startswith(FENCE) else rest
    if rest.strip() or not parts:
        parts.append(rest)
    return parts


def _fitting(text: str, budget: int, measure: Callable[[str], int]) -> int:
    """The most leading characters of `text` whose measure is within `budget` (at least one)."""
    if measure is len:
        return budget
    low, high = 1, min(budget, len(text))
    while low < high:
        middle = (low + high + 1) // 2
        if measure(text[:middle]) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def _best_cut(text: str, budget: int, floor: int = 0) -> int:
    """Where to cut: the last paragraph, line or word boundary in the second half of the budget (and past
    `floor`), else at the budget."""
    window = text[:budget]
    for separator in ("\n\n", "\n", " "):
        index = window.rfind(separator)
        if index > max(budget // 2, floor - 1) and index + len(separator) > floor:
            return index + len(separator)
    return budget


def message_text(message: dict[str, Any] | None) -> str:
    if not message:
        return ""
    return "".join(part.get("text", "") for part in message.get("content", []) if part.get("type") == "text")


def on_hold_line(doing: str, restarts: int, task_id: int) -> str:
    """A task parked after repeated process deaths (DESIGN.md §2.6), said in the chat's terms: what it was doing,
    and the id an operator passes to `retry`."""
    return (
        f"⚠️ The bot stopped {restarts} times in a row while {doing}, so that is on hold until an operator "
        f"retries it (task {task_id})."
    )


# How every status line of a reply begins (`render_partial`'s and the notices below). Answer text in a partial
# comes first and ends in " …", so a text made only of these lines (or the bare "…") shows no answer.
STATUS_MARKS = ("⏸️ ", "⚙️ ", "⏳ ", "↻ ", "⚠️ The bot stopped ")


def is_status_only(text: str) -> bool:
    """Whether a shown text is only status (no answer text): nothing is lost when it is replaced elsewhere."""
    return bool(text) and all(line == "…" or line.startswith(STATUS_MARKS) for line in text.splitlines())


WAITING_BEHIND_HOLD = (
    "⏳ Waiting behind an earlier request here that is on hold until an operator retries it."
)
QUEUED = "⏳ Queued behind an earlier request here."


def render_partial(
    live: dict[str, Any], approvals_pending: list[str], on_hold: Mapping[int, int] | None = None
) -> str:
    """What a streaming reply shows: the text so far, then tool status lines. `on_hold` maps each parked task
    of the run (its generation task, its tool tasks) to its restart count."""
    on_hold = on_hold or {}
    lines: list[str] = []
    text = message_text((live.get("generation") or {}).get("message"))
    if text:
        lines.append(text + " …")
    run_task: Any = (live.get("run") or {}).get("task_id")
    if run_task in on_hold:
        lines.append(on_hold_line("writing this answer", on_hold[run_task], run_task))
    for slot in live.get("tools", []):
        status = slot.get("status")
        if status == "done":
            continue
        name = slot.get("name", "tool")
        task_id: Any = slot.get("task_id")
        if task_id in on_hold:
            lines.append(on_hold_line(f"running `{name}`", on_hold[task_id], task_id))
        elif name in approvals_pending:
            lines.append(f"⏸️ `{name}` is waiting for approval")
        elif status == "running":
            lines.append(f"⚙️ running `{name}`…")
        else:
            lines.append(f"⏳ `{name}` queued")
    retry = (live.get("generation") or {}).get("retry")
    if retry:
        lines.append("↻ the model is busy; retrying shortly")
    if not lines:
        lines.append("…")
    return "\n".join(lines)


UNANSWERED = {
    "no_model": "I have no model configured.",
    "model_error": "The model failed",
    "aborted": "Stopped.",
    "reset": "The conversation was reset before I answered.",
}
# Reasons not listed above are internal (a task that faulted, a task whose code is missing, a storage failure):
# the chat gets only an apology with an incident id; the detail goes to the log under the same id.
APOLOGY = "⚠️ Sorry, something went wrong on my side while answering (incident {incident})."


def incident_id(*parts: object) -> str:
    """A short id (8 characters) that ties an apology in chat to the log line holding the detail. Derived from
    `parts` when given, so every process that renders the same failure shows the same id; random otherwise."""
    if not parts:
        return secrets.token_hex(4)
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8", "replace")).hexdigest()[:8]


def render_unanswered(reason: str | None, detail: str | None, incident: str | None = None) -> str:
    """The final text of an input that got no answer. Internal failures show no detail at all (no paths,
    class names or kinds), only `APOLOGY` with `incident` (the caller logs the detail with the same id)."""
    base = UNANSWERED.get(reason or "")
    if base is None:
        return APOLOGY.format(incident=incident or incident_id(reason, detail))
    return f"⚠️ {base}: {detail}" if detail and not base.endswith(".") else f"⚠️ {base}"


def is_internal(reason: str | None) -> bool:
    """Whether an unanswered reason is an internal failure (shown only as an apology)."""
    return (reason or "") not in UNANSWERED
